"""The Llama-shaped decoder (SmolLM2, Llama 2/3.x, Qwen2/2.5, Qwen3) over a KVCache.

What tells the families apart is config: q/k/v biases (Qwen2), per-head RMSNorm on q and k
(Qwen3), an explicit head size, a tied or untied head, and Llama 3.x rotary scaling.

The forward takes only the new tokens; everything before them is read from the cache,
and rotary positions start at the cache position, so a new turn can begin anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from kvcache import Attention, KVCache
from model.families.declare import LLAMA_PARTS, GGUFLayout, RandomWeights, check_fields, check_heads
from model.families.layers import (
    GatedMLP,
    HeadsAttention,
    LlamaShaped,
    RMSNorm,
    apply_rotary,
    llama3_freq_factors,
    rope_rows,
    rotary_tables,
)
from model.limits import refuse_unsupported


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
    attention_bias: bool = False      # q_proj, k_proj and v_proj have biases; o_proj none (Qwen2)
    qk_norm: bool = False             # RMSNorm over each head of q and k, before rotary (Qwen3)
    rope_scaling: dict | None = None  # {"rope_type": "llama3", factor, low/high_freq_factor, original_max_...}
    rope_freq_factors: list[float] | None = None  # llama.cpp's rope_freqs tensor (a converted GGUF)

    def __post_init__(self):
        """ValueError naming the field for a config no model can be built from (layers.check_fields)."""
        explicit = ("head_dim",) if self.head_dim is not None else ()  # [] or 0 too: not "derive it"
        check_fields(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "max_position_embeddings") + explicit,
                     positive=("rms_norm_eps", "rope_theta"))
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        check_heads(self)
        check_fields(self, flags=("tie_word_embeddings", "attention_bias", "qk_norm"))
        self.freq_factors()  # a bad rope_scaling fails now, naming its key

    def freq_factors(self) -> list[float] | None:
        """The divisors rotary applies to its inverse frequencies, or None for plain rotary."""
        if self.rope_freq_factors is not None:
            f = self.rope_freq_factors
            if (not isinstance(f, list) or len(f) != self.head_dim // 2
                    or not all(type(x) in (int, float) and math.isfinite(x) and x > 0 for x in f)):
                raise ValueError(f"rope_freq_factors must be {self.head_dim // 2} positive numbers")
            return [float(x) for x in f]
        if self.rope_scaling is None:
            return None
        return llama3_freq_factors(self.head_dim, self.rope_theta, *llama3_params(self.rope_scaling))

    @classmethod
    def from_dict(cls, d: dict, **fixed) -> LlamaConfig:
        """From a config.json (Hugging Face's keys, transformers 4 or 5). `fixed`: fields the
        architecture implies whatever the file says (Qwen2's biases). ValueError naming the
        key for what this module cannot run exactly."""
        d = {**d, **hf_rope(d)}
        refuse_unsupported(d, UNSUPPORTED)
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known and k not in ("attention_bias", "qk_norm")}, **fixed)


def hf_rope(d: dict) -> dict:
    """rope_theta and rope_scaling from either layout: transformers 4's top-level rope_theta
    plus rope_scaling, or transformers 5's rope_parameters holding both."""
    params = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or params
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be an object, not {scaling!r}")
    out = {"rope_scaling": None}
    if "rope_theta" in d or "rope_theta" in params:
        out["rope_theta"] = d.get("rope_theta", params.get("rope_theta"))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "default":
        out["rope_scaling"] = {**{k: v for k, v in scaling.items() if k not in ("rope_theta", "type")},
                               "rope_type": kind}
        if kind == "llama3":  # where transformers looks when the scaling does not say
            orig = d.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
            out["rope_scaling"]["original_max_position_embeddings"] = orig or d.get("max_position_embeddings")
    return out


LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def llama3_params(scaling: dict) -> tuple:
    """The llama3 scaling's four numbers; ValueError naming the key for any other kind."""
    if not isinstance(scaling, dict) or scaling.get("rope_type") != "llama3":
        kind = scaling.get("rope_type") if isinstance(scaling, dict) else scaling
        raise ValueError(f"rope_scaling.rope_type {kind!r} is not supported (only llama3)")
    values = tuple(scaling.get(k) for k in LLAMA3_KEYS)
    for k, v in zip(LLAMA3_KEYS, values, strict=True):
        if type(v) not in (int, float) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"rope_scaling.{k} must be a positive number, not {v!r}")
    if values[1] >= values[2]:
        raise ValueError(f"rope_scaling.low_freq_factor {values[1]} must be below high_freq_factor {values[2]}")
    return values


MOE = "mixture-of-experts models are not supported"
UNSUPPORTED = [  # (config.json key, is its value one we cannot run, why)
    ("hidden_act", lambda v: v != "silu", "only silu is supported"),
    ("attention_bias", bool, "a bias on o_proj is not supported (q/k/v biases come with Qwen2 only)"),
    ("mlp_bias", bool, "MLP biases are not supported"),
    ("num_experts", bool, MOE),
    ("num_local_experts", bool, MOE),
    ("use_sliding_window", bool, "sliding-window attention is not supported"),
    ("layer_types", lambda v: not isinstance(v, list) or any(t != "full_attention" for t in v),
     "only full_attention layers are supported"),
    ("partial_rotary_factor", lambda v: v != 1, "partial rotary is not supported"),
]


class SelfAttention(HeadsAttention):
    def __init__(self, cfg: LlamaConfig, idx: int):
        super().__init__(cfg, idx, bias=cfg.attention_bias)
        if cfg.qk_norm:  # absent otherwise, so a Llama state dict has no q_norm keys
            self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, T, heads, head_dim) q, k (normed if qk_norm, then rotated) and v: shared with
        the decode step, so the two cannot drift apart."""
        q, k, v = self.heads(x)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


class LlamaBlock(nn.Module):
    """Module names mirror Hugging Face's, so their state dicts load with no renaming."""

    def __init__(self, cfg: LlamaConfig, idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg, idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, cache: KVCache, attn: Attention) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(LlamaShaped):
    def __init__(self, cfg: LlamaConfig, attn: Attention | None = None):
        super().__init__(cfg, attn, LlamaBlock, RMSNorm)

    def rope(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.rope_length()
        if self._rope is None or self._rope[0].device != device or self._rope[0].shape[0] < n:
            c = self.config
            self.retired += [self._rope] if self._rope is not None else []  # a captured CUDA graph may read them
            self._rope = rotary_tables(c.head_dim, n, c.rope_theta, device=device, freq_factors=c.freq_factors())
        return self._rope

    def forward(self, idx: torch.Tensor, cache: KVCache, last: bool = False, step=None) -> torch.Tensor:
        """Logits (fp32) for the new tokens `idx` (B, T), or for the last one only (`last`:
        a prefill needs no others); their K/V land in `cache`. `step`: one token at the device
        position, the cache not advanced (the capturable decode step, model/decode/torch_step.py)."""
        t = idx.shape[1]
        if step is None:
            cache.check_fits(t)  # before any layer writes: an overflow leaves the cache as it was
        cos, sin = rope_rows(*self.rope(idx.device), cache, t, step)
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache, step or self.attn)
        if step is None:
            cache.advance(t)
        return self.lm_head(self.model.norm(x[:, -1:] if last else x)).float()


# GGUF (llama.cpp's llama, qwen2 and qwen3): Llama 3.x scaling comes as a rope_freqs tensor
# (model/loading/gguf.py), never as a scaling type.
HF_NAMES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def gguf_config(g, c: dict) -> dict:
    a = g.arch
    scaling = g.get(f"{a}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise ValueError(f"{a}.rope.scaling.type {scaling!r} is not supported")
    if g.get(f"{a}.rope.dimension_count", c["head_dim"]) != c["head_dim"]:
        raise ValueError("partial rotary (rope.dimension_count != head dim) is not supported")
    return {"architectures": [HF_NAMES[a]], "model_type": a, **c}


GGUF = GGUFLayout(
    "Llama, Qwen2 and Qwen3", biased=("attn_q", "attn_k", "attn_v"),   # Qwen2's; a bias elsewhere we cannot run
    layer_names={**LLAMA_PARTS, "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"},
    config=gguf_config, rules=lambda a: [(f"{a}.expert_count", bool, "mixture-of-experts models are not supported"),
                                         (f"{a}.attention.sliding_window", bool,
                                          "sliding-window attention is not supported")])


def init_random(model: Llama) -> None:
    for name, p in model.named_parameters():
        if "norm" not in name:
            p.normal_(0.0, 0.02 if "embed" in name or "lm_head" in name else 0.08)


RANDOM = RandomWeights(init=init_random, presets={
    # A few layers, fast on a CPU: tests and tools rely on this exact name.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                 rope_theta=10000.0),
    # Real shapes, random weights: speed and memory work.
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0),
    # Llama shapes of nanochat d20 / d32 sizes (dim 1280 / 2048, 20 / 32 layers, MHA).
    "d20": dict(vocab_size=32768, hidden_size=1280, intermediate_size=5120, num_hidden_layers=20,
                num_attention_heads=10, num_key_value_heads=10, max_position_embeddings=8192,
                tie_word_embeddings=False),
    "d32": dict(vocab_size=32768, hidden_size=2048, intermediate_size=8192, num_hidden_layers=32,
                num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=8192,
                tie_word_embeddings=False),
    # The Llama-shaped families' real shapes (Qwen3-0.6B, Qwen2.5-0.5B, Llama-3.2-1B), random weights.
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, qk_norm=True),
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, attention_bias=True),
    "llama3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                        rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                                high_freq_factor=4.0,
                                                                original_max_position_embeddings=8192)),
    # Tiny versions of the same, fast on a CPU: the kernels' interpreter tests.
    "tiny-qwen2": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, attention_bias=True),
    "tiny-qwen3": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, qk_norm=True,
                       tie_word_embeddings=False),
})
