"""Gemma 3 (text): the Llama shape with Gemma's differences, over one persistent KVCache.

What differs from model/families/llama.py (docs/gemma.md has the details and where each was checked):
- RMSNorm scales by (1 + weight), computed in fp32 and rounded once at the end;
- four norms per layer: around attention (input, post-attention) and around the MLP
  (pre-feedforward, post-feedforward); the "post" norms apply to the sublayer's output
  before the residual add;
- per-head RMSNorm of q and k (like Qwen3), then rotary;
- embeddings multiplied by sqrt(hidden), that multiplier first rounded to the weights' dtype;
- attention scores scaled by 1/sqrt(query_pre_attn_scalar) instead of 1/sqrt(head_dim);
- GeGLU MLP (tanh-approximated GELU);
- sliding-window layers (a window of W keys, the current one included) with their own rotary
  base, and full-attention layers with another (layer_types says which is which);
- an optional final tanh softcap on the logits.

The cache holds every position for every layer; a windowed layer only reads its last W
keys, through the attention entry point's window_size, so rewinding stays O(1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from kvcache import Attention, KVCache
from model.families.layers import GatedMLP, LlamaShaped, apply_rotary, embedding, gelu_tanh, rope_rows, rotary_tables
from model.limits import refuse_unsupported

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass
class GemmaConfig:
    vocab_size: int = 262144
    hidden_size: int = 640
    intermediate_size: int = 2048
    num_hidden_layers: int = 18
    num_attention_heads: int = 4
    num_key_value_heads: int = 1
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0        # full-attention layers
    rope_local_base_freq: float = 10_000.0  # sliding-window layers
    rope_scaling_factor: float = 1.0        # linear scaling of the full-attention layers' rotary
    max_position_embeddings: int = 32768
    sliding_window: int = 512               # keys a windowed layer sees, the current one included
    layer_types: list[str] = field(default_factory=list)  # empty: 5 sliding then 1 full, repeated
    query_pre_attn_scalar: float = 256
    final_logit_softcapping: float | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self):
        """ValueError naming the field for a config no model can be built from."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window"):
            if type(v := getattr(self, name)) is not int or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
        for name in ("rms_norm_eps", "rope_theta", "rope_local_base_freq", "rope_scaling_factor",
                     "query_pre_attn_scalar") + (("final_logit_softcapping",) if self.final_logit_softcapping else ()):
            if type(v := getattr(self, name)) not in (int, float) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive number, not {v!r}")
        if self.num_attention_heads % self.num_key_value_heads or self.head_dim % 2:
            raise ValueError(f"num_attention_heads {self.num_attention_heads}, num_key_value_heads "
                             f"{self.num_key_value_heads}, head_dim {self.head_dim}: heads must group evenly "
                             "and the head size must be even")
        if not self.layer_types:   # Gemma 3's pattern: every 6th layer is global
            self.layer_types = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(self.num_hidden_layers)]
        if (not isinstance(self.layer_types, list) or len(self.layer_types) != self.num_hidden_layers
                or any(t not in (SLIDING, FULL) for t in self.layer_types)):
            raise ValueError(f"layer_types must list {SLIDING!r} or {FULL!r} for each of the "
                             f"{self.num_hidden_layers} layers, not {self.layer_types!r}")
        if type(self.tie_word_embeddings) is not bool:
            raise ValueError(f"tie_word_embeddings must be true or false, not {self.tie_word_embeddings!r}")

    def window(self, layer: int) -> tuple[int, int]:
        """FlashAttention's window_size: (W - 1, 0) keeps W keys (the query's own included),
        as transformers' sliding mask (key > query - W) and llama.cpp's do."""
        return (self.sliding_window - 1, 0) if self.layer_types[layer] == SLIDING else (-1, -1)

    @classmethod
    def from_dict(cls, d: dict, **fixed) -> GemmaConfig:
        """From a Gemma3ForCausalLM config.json (transformers 4 or 5 layout). ValueError
        naming the key for what this module cannot run exactly."""
        refuse_unsupported(d, UNSUPPORTED)
        out = {k: d[k] for k in cls.__dataclass_fields__ if k in d and d[k] is not None}
        out.pop("layer_types", None)
        if d.get("layer_types") is not None:
            out["layer_types"] = d["layer_types"]
        elif d.get("sliding_window_pattern") is not None:   # transformers 4's older configs
            p = d["sliding_window_pattern"]
            if type(p) is not int or p < 1:
                raise ValueError(f"sliding_window_pattern must be a whole number >= 1, not {p!r}")
            out["layer_types"] = [FULL if (i + 1) % p == 0 else SLIDING for i in range(d.get("num_hidden_layers", 18))]
        out.update(gemma_rope(d))
        return cls(**out, **fixed)


def gemma_rope(d: dict) -> dict:
    """Both rotary bases (and the global layers' linear factor) from either layout:
    transformers 5's rope_parameters per layer type, or transformers 4's rope_theta,
    rope_local_base_freq and rope_scaling."""
    params = d.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope_parameters must be an object, not {params!r}")
    full, local = params.get(FULL) or {}, params.get(SLIDING) or {}
    if not full and not local and params:   # one set for every layer type
        full = local = params
    out = {}
    if (theta := full.get("rope_theta", d.get("rope_theta"))) is not None:
        out["rope_theta"] = theta
    if (theta := local.get("rope_theta", d.get("rope_local_base_freq"))) is not None:
        out["rope_local_base_freq"] = theta
    for where, scaling in ((SLIDING, local), (FULL, full if full else d.get("rope_scaling") or {})):
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "linear" and where == FULL:
            out["rope_scaling_factor"] = scaling.get("factor")
        elif kind != "default":
            raise ValueError(f"rope_scaling.rope_type {kind!r} on {where} layers is not supported "
                             "(only linear, on full-attention layers)")
    return out


UNSUPPORTED = [  # (config.json key, is its value one we cannot run, why)
    ("hidden_activation", lambda v: v != "gelu_pytorch_tanh", "only gelu_pytorch_tanh is supported"),
    ("hidden_act", lambda v: v not in ("gelu_pytorch_tanh", "gelu"), "only gelu_pytorch_tanh is supported"),
    ("attention_bias", bool, "attention biases are not supported"),
    ("attn_logit_softcapping", bool, "attention logit softcapping is not supported (Gemma 2's, not Gemma 3's)"),
    ("use_bidirectional_attention", bool, "bidirectional attention is not supported"),
    ("num_experts", bool, "mixture-of-experts models are not supported"),
]


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), all in fp32 and rounded to x's dtype once at the end
    (Llama rounds before the weight; Gemma after, which matters in bf16)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class GemmaAttention(nn.Module):
    def __init__(self, cfg: GemmaConfig, idx: int):
        super().__init__()
        self.idx, self.window = idx, cfg.window(idx)
        self.n_head, self.n_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        d = cfg.hidden_size
        self.q_proj = nn.Linear(d, self.n_head * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.hd, d, bias=False)
        self.q_norm = GemmaRMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.hd, cfg.rms_norm_eps)
        # The attention kernels scale by 1/sqrt(head_dim); Gemma wants 1/sqrt(query_pre_attn_scalar).
        # The difference is folded into q (exactly 1, so skipped, when the two are equal: Gemma 3).
        self.q_scale = math.sqrt(self.hd / cfg.query_pre_attn_scalar)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, T, heads, head_dim) q (normed, rotated, rescaled), k (normed, rotated) and v:
        shared with the decode step."""
        b, t, _ = x.shape
        q = apply_rotary(self.q_norm(self.q_proj(x).view(b, t, self.n_head, self.hd)), cos, sin)
        k = apply_rotary(self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.hd)), cos, sin)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        return q, k, self.v_proj(x).view(b, t, self.n_kv, self.hd)

    def forward(self, x, cos, sin, cache: KVCache, attn: Attention) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        return self.o_proj(attn(q, k, v, cache, self.idx, window_size=self.window).reshape(b, t, -1))


class GemmaBlock(nn.Module):
    """Module names mirror Hugging Face's, so their state dicts load with no renaming."""

    def __init__(self, cfg: GemmaConfig, idx: int):
        super().__init__()
        self.sliding = cfg.layer_types[idx] == SLIDING
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = GemmaAttention(cfg, idx)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, gelu_tanh)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def after_attention(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """The residual add of the attention output (post-normed), then the MLP sublayer:
        shared with the decode step."""
        x = x + self.post_attention_layernorm(attn_out)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))

    def forward(self, x, rope, cache: KVCache, attn: Attention) -> torch.Tensor:
        cos, sin = rope[self.sliding]
        return self.after_attention(x, self.self_attn(self.input_layernorm(x), cos, sin, cache, attn))


class GemmaBody(nn.Module):
    def __init__(self, cfg: GemmaConfig):
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GemmaBlock(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Gemma(LlamaShaped):
    def __init__(self, cfg: GemmaConfig, attn: Attention | None = None):
        super().__init__(cfg.max_position_embeddings)
        self.config = cfg
        self.attn = attn or Attention("auto")
        self.model = GemmaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._rope: dict[bool, tuple[torch.Tensor, torch.Tensor]] | None = None

    def rope(self, device: torch.device) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
        """fp32 (cos, sin) tables keyed by "is the layer sliding": two rotary bases."""
        n = self.rope_length()
        if self._rope is None or self._rope[True][0].device != device or self._rope[True][0].shape[0] < n:
            c = self.config
            self.retired += [self._rope] if self._rope is not None else []  # a captured CUDA graph may read them
            factor = [c.rope_scaling_factor] * (c.head_dim // 2) if c.rope_scaling_factor != 1.0 else None
            self._rope = {True: rotary_tables(c.head_dim, n, c.rope_local_base_freq, device=device),
                          False: rotary_tables(c.head_dim, n, c.rope_theta, device=device, freq_factors=factor)}
        return self._rope

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(idx)
        # sqrt(hidden) rounded to the weights' dtype first (25.25 in bf16 for 640), as Gemma's
        # reference does; a Python float keeps the CUDA graph free of host tensors.
        return x * float(torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.model.norm(x)).float()
        cap = self.config.final_logit_softcapping
        return cap * torch.tanh(logits / cap) if cap else logits

    def forward(self, idx: torch.Tensor, cache: KVCache, last: bool = False, step=None) -> torch.Tensor:
        """Logits (fp32) for the new tokens `idx` (B, T), or the last one only (`last`); their
        K/V land in `cache`. `step`: one token at the device position, the cache not advanced
        (the capturable decode step, model/decode/torch_step.py)."""
        t = idx.shape[1]
        if step is None:
            cache.check_fits(t)  # before any layer writes: an overflow leaves the cache as it was
        rope = {k: rope_rows(cos, sin, cache, t, step) for k, (cos, sin) in self.rope(idx.device).items()}
        x = self.embed(idx)
        for layer in self.model.layers:
            x = layer(x, rope, cache, step or self.attn)
        if step is None:
            cache.advance(t)
        return self.head(x[:, -1:] if last else x)
