"""What the model families share: norms, rotary embeddings and MLPs.

Rotary convention (one for the whole tree). `rotary_tables` gives the cos and sin of the
angles pos * theta^(-2i/D), i < D/2, as (length, D/2) tables. `apply_rotary` rotates each
pair (x[i], x[i + D/2]) of a head (the "halves" layout of Hugging Face's rotate_half) by
the angle whose cos and sin it is given:

    (x1, x2) -> (x1 cos - x2 sin,  x2 cos + x1 sin)

Llama checkpoints are trained with rotation by +angle. nanochat's are trained with rotation
by -angle; its tables are built with `reverse=True`, which negates the sine. Negating a
float is exact, so that is bit for bit nanochat's own `x1 cos + x2 sin, x2 cos - x1 sin`.
The fused Triton kernel (model/decode/qkv_rope.py) applies the same formula to Llama's tables.

Module attribute names (gate_proj, c_fc, ...) mirror the checkpoints' own, so state dicts
load with no renaming.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from kvcache import Attention, KVCache
from model.cpu import prefill_ops


class RMSNorm(nn.Module):
    """RMSNorm with a weight and a fixed eps (Llama): normed in fp32, rounded, then weighted."""

    one_plus_weight = False   # scaled by weight (Gemma's: by 1 + weight), for a native twin

    def __init__(self, dim: int, eps: float, init: float = 1.0):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.full((dim,), init))

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        """x / rms(x) in fp32, like the reference implementations, so bf16 matches them."""
        xf = x.float()
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * self.normed(x).to(x.dtype)


def embedding(num: int, dim: int) -> nn.Embedding:
    """nn.Embedding. Built on the meta device (loading), its init is skipped: torch 2.13's
    normal_ on a meta tensor keeps a real table's worth of memory (146 MB for SmolLM2's)."""
    if torch.get_default_device().type == "meta":
        return nn.Embedding(num, dim, _weight=torch.empty(num, dim))
    return nn.Embedding(num, dim)


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """RMSNorm with no weight and eps from the dtype, in x's dtype (nanochat)."""
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(head_dim: int, length: int, theta: float, dtype: torch.dtype = torch.float64,
                  device=None, reverse: bool = False,
                  freq_factors: Sequence[float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (length, head_dim/2) cos and sin, the angles computed in `dtype`: float64 gives
    exact tables (Llama), float32 nanochat's own. `reverse`: for rotation by -angle.
    `freq_factors`: one divisor per inverse frequency (Llama 3.x scaling, see
    `llama3_freq_factors`; llama.cpp's `rope_freqs` tensor holds the same numbers)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=dtype, device=device) / head_dim))
    if freq_factors is not None:
        inv_freq = inv_freq / torch.tensor(freq_factors, dtype=dtype, device=device)
    angles = torch.outer(torch.arange(length, dtype=dtype, device=device), inv_freq)
    cos, sin = angles.cos().float(), angles.sin().float()
    return (cos, -sin) if reverse else (cos, sin)


def llama3_freq_factors(head_dim: int, theta: float, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_max_position_embeddings: int) -> list[float]:
    """Llama 3.x rotary scaling as divisors of the inverse frequencies: wavelengths shorter
    than original/high_freq_factor keep theirs (1), longer than original/low_freq_factor are
    stretched by `factor`, and those between blend the two linearly in 1/wavelength."""
    orig, low, high = original_max_position_embeddings, low_freq_factor, high_freq_factor
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(float(factor))
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, H, D); cos/sin: (T, D/2). Computed in the wider of x's and the tables' dtypes
    (fp32 tables lift a bf16 x, as Hugging Face does; tables in x's dtype keep it, as nanochat
    does) and returned in x's dtype."""
    if x.device.type == "cpu" and (y := prefill_ops.rotary(x, cos, sin)) is not None:
        return y   # a CPU prefill in fp32: the same bits in one C pass
    x1, x2 = x.to(torch.promote_types(x.dtype, cos.dtype)).chunk(2, dim=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): Llama's MLP with SiLU (SwiGLU), Gemma's with tanh GELU (GeGLU).

    A gate that offers `glu(up, x, act_name)` (the CPU's block-format QLinear, in a prefill)
    forms act(gate(x)) * up(x) in one C call: the activation and the product were 8% of a
    pp512 on the CPU as separate PyTorch ops."""

    def __init__(self, dim: int, hidden: int, act: Callable[[torch.Tensor], torch.Tensor] = F.silu):
        super().__init__()
        self.act = act
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = getattr(self.gate_proj, "glu", None)
        if fused is not None and (name := ACT_NAMES.get(self.act)) is not None:
            if (h := fused(self.up_proj, x, name)) is not None:
                return self.down_proj(h)
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


ACT_NAMES = {F.silu: "silu", gelu_tanh: "gelu_tanh"}   # the activations a fused gated MLP knows


class ReLU2(nn.Module):
    """proj(relu(fc(x))^2): nanochat's MLP."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.c_fc = nn.Linear(dim, hidden, bias=False)
        self.c_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())


def rope_rows(cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, t: int, step) -> tuple[torch.Tensor, ...]:
    """The rotary rows of the `t` new tokens: from the host position, or, in a decode step
    (`step`, model/decode/torch_step.py), from the device one, so no shape or index depends on it."""
    if step is None:
        return cos[cache.seqlen:cache.seqlen + t], sin[cache.seqlen:cache.seqlen + t]
    return cos.index_select(0, step.seqlens_long), sin.index_select(0, step.seqlens_long)


class HeadsAttention(nn.Module):
    """Llama's and Gemma's attention around their q/k treatment: the q/k/v/o projections over
    (heads, head_dim), and the forward through the cache. A family's subclass adds its norms and
    `qkv` (the rotated heads, the decode steps' too); a windowed layer sets `window`."""

    window = (-1, -1)   # FlashAttention's window_size: every key

    def __init__(self, cfg, idx: int, bias: bool = False):
        super().__init__()
        self.idx = idx
        self.n_head, self.n_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        d = cfg.hidden_size
        self.q_proj = nn.Linear(d, self.n_head * self.hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv * self.hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.n_head * self.hd, d, bias=False)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k and v as (B, T, heads, head_dim), before any norm or rotary."""
        b, t, _ = x.shape
        fused = getattr(self.q_proj, "stacked", None)   # a quantized prefill: the three as one GEMM
        q, k, v = (fused((self.k_proj, self.v_proj), x) if fused is not None else None) or (
            self.q_proj(x), self.k_proj(x), self.v_proj(x))
        return (q.view(b, t, self.n_head, self.hd), k.view(b, t, self.n_kv, self.hd),
                v.view(b, t, self.n_kv, self.hd))

    def forward(self, x, cos, sin, cache: KVCache, attn: Attention) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        return self.o_proj(attn(q, k, v, cache, self.idx, window_size=self.window).reshape(b, t, -1))


class Body(nn.Module):
    """Hugging Face's `model.` of a Llama-shaped checkpoint: embed_tokens, layers, norm."""

    def __init__(self, cfg, block: Callable[..., nn.Module], norm: Callable[[int, float], nn.Module]):
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = norm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaShaped(nn.Module):
    """What Llama and Gemma share around their layers: the head (tied to the embeddings or not),
    the KV cache they make, and rotary tables as long as the longest cache made. A subclass hands
    its config (Hugging Face's field names), its block and its norm (the `Body`), then builds its own
    rotary tables from `rope_length`."""

    def __init__(self, cfg, attn: Attention | None, block: Callable[..., nn.Module],
                 norm: Callable[[int, float], nn.Module]):
        super().__init__()
        self.config, self.max_seq_len = cfg, cfg.max_position_embeddings
        self.attn = attn or Attention("auto")
        self.model = Body(cfg, block, norm)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.cache_dtype: torch.dtype | None = None  # None: the weights' dtype (quantized models: fp16)
        self.longest_cache = 0  # the rotary tables' length follows it (rope_length)
        self.retired: list = []  # tables replaced by longer ones, kept alive for graphs captured on them
        self._rope = None  # fp32 even in a bf16 model

    def new_cache(self, seq_len: int | None = None) -> KVCache:
        c, p = self.config, self.model.norm.weight
        cache = KVCache(1, c.num_key_value_heads, seq_len or self.max_seq_len, c.head_dim,
                        c.num_hidden_layers, p.device, self.cache_dtype or p.dtype)
        # only once it exists: a cache that failed to allocate must not size the rotary tables
        self.longest_cache = max(self.longest_cache, cache.capacity)
        return cache

    def rope_length(self) -> int:
        """Rotary tables cover the longest cache made, not the context the config claims: a
        claimed 2**31 with a 4,096-token cache must not allocate 16 GB of tables (issue 27)."""
        return self.longest_cache or min(self.max_seq_len, 1 << 16)
