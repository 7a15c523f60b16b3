"""The first kernel of each decoder layer: RMSNorm + QKV GEMV (+ biases) + rotary + K/V cache write.

One program owns a block of rotary pairs (rows i and i + D/2) of one head slot (a query,
key or value head), so the rotation needs nothing from other programs. The position is
read from `cache_seqlens` on the device: the captured graph is valid at any position.
Weights are loaded before `gdc_wait`, as in gemv.py.

Families that normalise each query and key head (Qwen3's q_norm/k_norm) need the whole head
before the rotation, which a block of pairs does not see: for them the QKV product is a plain
`norm_gemv`, and `head_norm_rope` (one program a head) finishes the job.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model.decode import gemv
from model.decode.gemv import load_rows, load_vec


@triton.jit
def _norm_qkv_rope_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr,
                          eps, stride_t, stride_h, K: tl.constexpr, KP: tl.constexpr,
                          HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, BP: tl.constexpr,
                          HAS_NW: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    h = tl.program_id(0)           # head slot: queries, then keys, then values
    j = tl.program_id(1)           # block of BP rotary pairs
    half: tl.constexpr = D // 2
    pairs = j * BP + tl.arange(0, BP)
    r1 = h * D + pairs
    r2 = r1 + half
    all_rows = pairs < half
    # Weights and the position first: nothing in the step writes them (see gemv.py).
    w1 = load_rows(w_ptr, r1, all_rows, K, KP)
    w2 = load_rows(w_ptr, r2, all_rows, K, KP)
    pos = tl.load(pos_ptr)
    if PDL:
        tl.extra.cuda.gdc_wait()
    x = load_vec(x_ptr, K, KP)   # one pass: the norm's sum of squares rides along
    ss = tl.sum(x * x, 0)
    if HAS_NW:
        x = x * load_vec(nw_ptr, K, KP)
    acc1 = tl.sum(w1.to(tl.float32) * x[None, :], 1)
    acc2 = tl.sum(w2.to(tl.float32) * x[None, :], 1)
    rstd = 1.0 / tl.sqrt(ss / K + eps)
    dt = w_ptr.dtype.element_ty
    y1 = acc1 * rstd
    y2 = acc2 * rstd
    if HAS_BIAS:  # Qwen2's q/k/v biases, added before the one rounding, as the fp32 accumulator would
        y1 += tl.load(b_ptr + r1, mask=all_rows, other=0.0).to(tl.float32)
        y2 += tl.load(b_ptr + r2, mask=all_rows, other=0.0).to(tl.float32)
    y1 = y1.to(dt).to(tl.float32)
    y2 = y2.to(dt).to(tl.float32)
    _rope_store(y1, y2, h, pairs, pos, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, stride_t, stride_h, HQ, HK, D, dt)


@triton.jit
def _rope_store(y1, y2, h, pairs, pos, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, stride_t, stride_h,
                HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, dt: tl.constexpr):
    """Rotate a query or key head's pairs and store them (queries to q, keys to the cache);
    a value head's go to the cache as they are."""
    half: tl.constexpr = D // 2
    if h < HQ + HK:
        c = tl.load(cos_ptr + pos * half + pairs)
        s = tl.load(sin_ptr + pos * half + pairs)
        o1 = (y1 * c - y2 * s).to(dt).to(tl.float32)
        o2 = (y2 * c + y1 * s).to(dt).to(tl.float32)
        if h < HQ:
            tl.store(q_ptr + h * D + pairs, o1.to(dt))
            tl.store(q_ptr + h * D + half + pairs, o2.to(dt))
        else:
            base = kc_ptr + pos * stride_t + (h - HQ) * stride_h
            tl.store(base + pairs, o1.to(dt))
            tl.store(base + half + pairs, o2.to(dt))
    else:
        base = vc_ptr + pos * stride_t + (h - HQ - HK) * stride_h
        tl.store(base + pairs, y1.to(dt))
        tl.store(base + half + pairs, y2.to(dt))


@triton.jit
def _head_norm_rope_kernel(qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr,
                           eps, stride_t, stride_h, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                           PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    h = tl.program_id(0)
    half: tl.constexpr = D // 2
    pairs = tl.arange(0, half)
    pos = tl.load(pos_ptr)
    # one weight vector for all query heads, one for all key heads
    w1 = tl.where(h < HQ, tl.load(qn_ptr + pairs), tl.load(kn_ptr + pairs)).to(tl.float32)
    w2 = tl.where(h < HQ, tl.load(qn_ptr + half + pairs), tl.load(kn_ptr + half + pairs)).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_wait()
    dt = qkv_ptr.dtype.element_ty
    y1 = tl.load(qkv_ptr + h * D + pairs).to(tl.float32)
    y2 = tl.load(qkv_ptr + h * D + half + pairs).to(tl.float32)
    if h < HQ + HK:  # RMSNorm over the head in fp32, rounded, then its weight: Qwen3RMSNorm's order
        rstd = 1.0 / tl.sqrt((tl.sum(y1 * y1, 0) + tl.sum(y2 * y2, 0)) / D + eps)
        y1 = ((y1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
        y2 = ((y2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    _rope_store(y1, y2, h, pairs, pos, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, stride_t, stride_h, HQ, HK, D, dt)


def head_norm_rope(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, pos: torch.Tensor, q_out: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, n_head: int, n_kv: int, eps: float, pdl: bool = False) -> None:
    """From the raw (heads * D) QKV product: RMSNorm each query and key head (weights (D,)),
    rotate, and store as `norm_qkv_rope` does."""
    heads = n_head + 2 * n_kv
    _head_norm_rope_kernel[(heads,)](
        qkv, q_norm, k_norm, cos, sin, pos, q_out, k_cache, v_cache, eps, k_cache.stride(-3), k_cache.stride(-2),
        HQ=n_head, HK=n_kv, D=qkv.shape[-1] // heads, PDL=pdl, num_warps=gemv.WARPS, launch_pdl=pdl)


def norm_qkv_rope(x: torch.Tensor, norm_w: torch.Tensor | None, wqkv: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, q_out: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, n_head: int, n_kv: int, eps: float,
                  pdl: bool = False, bias: torch.Tensor | None = None) -> None:
    """q_out <- rope(q); k_cache[pos], v_cache[pos] <- rope(k), v. Caches are one layer, (T, Hk, D)
    (a leading batch dim of 1 is fine). cos/sin are fp32 (max_len, D/2) tables; `bias`: the
    packed q/k/v biases."""
    heads = n_head + 2 * n_kv
    d = wqkv.shape[0] // heads
    k = x.shape[-1]
    kp = triton.next_power_of_2(k)
    half = d // 2
    bp = half
    while bp > 1 and (heads * (half // bp) < gemv.MIN_PROGRAMS or bp * 2 * kp > gemv.TILE_ELEMS):
        bp //= 2  # fewer pairs per program until the grid fills the GPU and the tile fits
    _norm_qkv_rope_kernel[(heads, half // bp)](
        x, norm_w if norm_w is not None else x, wqkv, bias if bias is not None else wqkv, cos, sin, pos, q_out,
        k_cache, v_cache, eps, k_cache.stride(-3), k_cache.stride(-2), K=k, KP=kp,
        HQ=n_head, HK=n_kv, D=d, BP=bp, HAS_NW=norm_w is not None, HAS_BIAS=bias is not None,
        PDL=pdl, num_warps=gemv.WARPS, launch_pdl=pdl)
