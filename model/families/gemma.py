"""Gemma 3 (text): the Llama shape with Gemma's differences, over one persistent KVCache; with it
its config, its GGUF layout and its `random:` presets (model/families/declare.py).

What differs from model/families/llama.py (docs/gemma.md has the details and where each was checked):
(1 + weight) RMSNorms in fp32, rounded once at the end, four a layer (the "post" ones on the
sublayer's output, before the residual add); per-head q and k norms before rotary; embeddings
times sqrt(hidden), rounded to the weights' dtype first; scores scaled by
1/sqrt(query_pre_attn_scalar); a GeGLU MLP (tanh GELU); sliding-window layers (W keys, the
current one included) with their own rotary base beside the full-attention ones (layer_types);
an optional final tanh softcap on the logits.

The cache holds every position for every layer; a windowed layer only reads its last W
keys, through the attention entry point's window_size, so rewinding stays O(1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
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
    gelu_tanh,
    rope_rows,
    rotary_tables,
)
from model.limits import refuse_unsupported

SLIDING, FULL = "sliding_attention", "full_attention"


def every_nth_full(layers: int, n: int = 6) -> list[str]:
    """Gemma 3's pattern (n = 6): n - 1 sliding-window layers, then one full-attention layer."""
    return [FULL if (i + 1) % n == 0 else SLIDING for i in range(layers)]


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
        """ValueError naming the field for a config no model can be built from (layers.check_fields)."""
        cap = ("final_logit_softcapping",) if self.final_logit_softcapping else ()
        check_fields(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                            "sliding_window"),
                     positive=("rms_norm_eps", "rope_theta", "rope_local_base_freq", "rope_scaling_factor",
                               "query_pre_attn_scalar") + cap)
        check_heads(self)
        if not self.layer_types:
            self.layer_types = every_nth_full(self.num_hidden_layers)
        if (not isinstance(self.layer_types, list) or len(self.layer_types) != self.num_hidden_layers
                or any(t not in (SLIDING, FULL) for t in self.layer_types)):
            raise ValueError(f"layer_types must list {SLIDING!r} or {FULL!r} for each of the "
                             f"{self.num_hidden_layers} layers, not {self.layer_types!r}")
        check_fields(self, flags=("tie_word_embeddings",))

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
            out["layer_types"] = every_nth_full(d.get("num_hidden_layers", 18), p)
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


class GemmaRMSNorm(RMSNorm):
    """x / rms(x) * (1 + weight), all in fp32 and rounded to x's dtype once at the end
    (Llama rounds before the weight; Gemma after, which matters in bf16)."""

    one_plus_weight = True   # for a native twin (model/cpu/prefill_ops.py: native_norm)

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps, init=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.normed(x) * (1.0 + self.weight.float())).to(x.dtype)


class GemmaAttention(HeadsAttention):
    def __init__(self, cfg: GemmaConfig, idx: int):
        super().__init__(cfg, idx)
        self.window = cfg.window(idx)
        self.q_norm = GemmaRMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.hd, cfg.rms_norm_eps)
        # The attention kernels scale by 1/sqrt(head_dim); Gemma wants 1/sqrt(query_pre_attn_scalar).
        # The difference is folded into q (exactly 1, so skipped, when the two are equal: Gemma 3).
        self.q_scale = math.sqrt(self.hd / cfg.query_pre_attn_scalar)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, T, heads, head_dim) q (normed, rotated, rescaled), k (normed, rotated), v: the steps' too."""
        q, k, v = self.heads(x)
        q, k = apply_rotary(self.q_norm(q), cos, sin), apply_rotary(self.k_norm(k), cos, sin)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        return q, k, v


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
        """The attention output post-normed and added, then the MLP sublayer: the steps' too."""
        x = x + self.post_attention_layernorm(attn_out)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))

    def forward(self, x, rope, cache: KVCache, attn: Attention) -> torch.Tensor:
        cos, sin = rope[self.sliding]
        return self.after_attention(x, self.self_attn(self.input_layernorm(x), cos, sin, cache, attn))


class Gemma(LlamaShaped):
    def __init__(self, cfg: GemmaConfig, attn: Attention | None = None):
        super().__init__(cfg, attn, GemmaBlock, GemmaRMSNorm)

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


# GGUF (llama.cpp's gemma3): its converter adds 1 to every norm weight (its norm multiplies by w),
# which we take off, as transformers does, and permutes no Q/K rows. The local rotary base, the
# layer pattern and the query scale are fixed in llama.cpp's gemma3 code, so we use its values.
def gguf_config(g, c: dict) -> dict:
    a, heads, hidden, layers = g.arch, c["num_attention_heads"], c["hidden_size"], c["num_hidden_layers"]
    if g.get(f"{a}.attention.value_length", c["head_dim"]) != c["head_dim"]:
        raise ValueError(f"{a}.attention.value_length differs from key_length (not supported)")
    scaling, factor = g.get(f"{a}.rope.scaling.type", "none"), 1.0
    if scaling == "linear":
        factor = g.f32(f"{a}.rope.scaling.factor")
    elif scaling not in ("none", None):
        raise ValueError(f"{a}.rope.scaling.type {scaling!r} is not supported")
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", **c,
        "rope_local_base_freq": 10_000.0,   # llama.cpp's rope_freq_base_train_swa
        "rope_scaling": {"rope_type": "linear", "factor": factor} if factor != 1.0 else None,
        "sliding_window": g.need(f"{a}.attention.sliding_window"),
        "layer_types": every_nth_full(layers),
        # llama.cpp scales by 1/sqrt(head_dim), except Gemma 3 27B (62 layers): 1/sqrt(hidden/heads).
        "query_pre_attn_scalar": hidden // heads if layers == 62 else c["head_dim"],
        "final_logit_softcapping": g.get(f"{a}.final_logit_softcapping") or None,
        "hidden_activation": "gelu_pytorch_tanh",
    }


GGUF = GGUFLayout(
    "Gemma 3 text", config=gguf_config, sentencepiece=("gemma", "GemmaTokenizer", 32768), sentencepiece_only=True,
    fix_tensor=lambda name, w: w - np.float32(1.0) if name.endswith("norm.weight") else w,
    rules=lambda a: [(f"{a}.attn_logit_softcapping", bool, "attention logit softcapping is not supported"),
                     (f"{a}.expert_count", bool, "mixture-of-experts models are not supported")],
    layer_names={**LLAMA_PARTS, "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                 "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
    rope_theta=1_000_000.0, context=32768)


def init_random(model: Gemma) -> None:
    """Norms random too (small, around 0: Gemma scales by 1 + w): a misplaced one would show."""
    for name, p in model.named_parameters():
        p.normal_(0.0, 0.1 if "norm" in name else 0.02 if "embed" in name else 0.08)


RANDOM = RandomWeights(init=init_random, presets={
    # Gemma 3 270M's real shapes (its GGUF's metadata), which are GemmaConfig's defaults: 18 layers,
    # width 640, 4 query heads and 1 KV head of 256, FFN 2048, 262k vocabulary, a 512-key window.
    "gemma3-270m": {},
    # A few layers with a short window, fast on a CPU.
    "tiny-gemma3": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
                        query_pre_attn_scalar=24, max_position_embeddings=2048)})
