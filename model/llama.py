"""A Llama-family decoder (SmolLM2, Llama 2/3, Qwen2-style without biases) over a KVCache.

The forward takes only the new tokens; everything before them is read from the cache,
and rotary positions start at the cache position, so a new turn can begin anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from kvcache import Attention, KVCache
from model.layers import RMSNorm, SwiGLU, apply_rotary, rotary_tables


@dataclass
class LlamaConfig:
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_hidden_layers: int = 30
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True

    def __post_init__(self):
        """ValueError naming the field for a config no model can be built from: a hand-edited
        config.json or GGUF metadata must fail here, not as a ZeroDivisionError or NaN later."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings") + (("head_dim",) if self.head_dim else ()):
            if type(v := getattr(self, name)) is not int or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            if type(v := getattr(self, name)) not in (int, float) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive number, not {v!r}")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads or self.head_dim % 2:
            raise ValueError(f"num_attention_heads {self.num_attention_heads}, num_key_value_heads "
                             f"{self.num_key_value_heads}, head_dim {self.head_dim}: heads must group evenly "
                             "and the head size must be even")
        if type(self.tie_word_embeddings) is not bool:
            raise ValueError(f"tie_word_embeddings must be true or false, not {self.tie_word_embeddings!r}")

    @classmethod
    def from_dict(cls, d: dict) -> LlamaConfig:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})


class SelfAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, idx: int):
        super().__init__()
        self.idx = idx
        self.n_head, self.n_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        d = cfg.hidden_size
        self.q_proj = nn.Linear(d, self.n_head * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.hd, d, bias=False)

    def forward(self, x, cos, sin, cache: KVCache, attn: Attention) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rotary(self.q_proj(x).view(b, t, self.n_head, self.hd), cos, sin)
        k = apply_rotary(self.k_proj(x).view(b, t, self.n_kv, self.hd), cos, sin)
        v = self.v_proj(x).view(b, t, self.n_kv, self.hd)
        return self.o_proj(attn(q, k, v, cache, self.idx).reshape(b, t, -1))


class LlamaBlock(nn.Module):
    """Module names mirror Hugging Face's, so their state dicts load with no renaming."""

    def __init__(self, cfg: LlamaConfig, idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg, idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, cache: KVCache, attn: Attention) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaBlock(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig, attn: Attention | None = None):
        super().__init__()
        self.config = cfg
        self.attn = attn or Attention("auto")
        self.max_seq_len = cfg.max_position_embeddings
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None  # fp32 even in a bf16 model

    def new_cache(self, seq_len: int | None = None) -> KVCache:
        c = self.config
        p = self.lm_head.weight
        return KVCache(1, c.num_key_value_heads, seq_len or self.max_seq_len, c.head_dim,
                       c.num_hidden_layers, p.device, p.dtype)

    def rope(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rope is None or self._rope[0].device != device:
            c = self.config
            self._rope = rotary_tables(c.head_dim, c.max_position_embeddings, c.rope_theta, device=device)
        return self._rope

    def forward(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (fp32) for the new tokens `idx` (B, T); their K/V land in `cache`."""
        t = idx.shape[1]
        cache.check_fits(t)  # before any layer writes: an overflow leaves the cache as it was
        pos = cache.pos
        cos, sin = self.rope(idx.device)
        cos, sin = cos[pos:pos + t], sin[pos:pos + t]
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache, self.attn)
        cache.advance(t)
        return self.lm_head(self.model.norm(x)).float()
