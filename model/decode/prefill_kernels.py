"""The prefill step's small kernels, fused: what is left between the GEMMs of a B-token chunk.

The plain prefill step (model/decode/prefill_step.py) runs the model's own modules: ~46 kernels a
Llama layer (an RMSNorm is ~8 elementwise ops, rotary ~9 for q and again for k, the casts,
two `index_copy_`, SiLU and the product apart), each 2-4 µs on the H200 at any length up to a
few hundred tokens, so a 128-token SmolLM2 bucket was ~1,400 kernels and ~4 ms. Here a layer is

    residual add + RMSNorm -> QKV GEMM -> rotary + K/V cache write -> attention -> o_proj GEMM
    -> residual add + RMSNorm -> gate/up GEMM -> SiLU (GELU) * up -> down GEMM

nine launches, the GEMMs still cuBLAS (packed q/k/v and gate/up rows: `pack_rows`, the same
views the fused decode step uses). Each kernel rounds to the model dtype where the eager
modules round (the residual add, the norm before or after its weight as the family does, the
rotary output, the activation), so the step differs from eager by fp32 summation order only.

One program owns one token row (norms, rotary: all of a token's head slots) or one block of it
(the activation), so nothing crosses programs. The cache slot is `cache_seqlens + row`, read on the
device: a captured graph holds at any position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms(x, n, eps):
    return 1.0 / tl.sqrt(tl.sum(x * x, 0) / n + eps)


@triton.jit
def _residual_norm_kernel(x_ptr, d_ptr, dw_ptr, w_ptr, h_ptr, N, eps,
                          HAS_D: tl.constexpr, NORM_D: tl.constexpr, HAS_W: tl.constexpr,
                          GEMMA: tl.constexpr, BLOCK: tl.constexpr):
    """Row r: x += d (d first normed by dw, Gemma's post-norms), x stored rounded; then h = norm(x)."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    dt = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + r * N + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_D:
        d = tl.load(d_ptr + r * N + cols, mask=m, other=0.0).to(tl.float32)
        if NORM_D:  # Gemma: (d / rms(d)) * (1 + w), rounded once
            d = ((d * _rms(d, N, eps)) * (1.0 + tl.load(dw_ptr + cols, mask=m, other=0.0).to(tl.float32)))
            d = d.to(dt).to(tl.float32)
        x = (x + d).to(dt)
        tl.store(x_ptr + r * N + cols, x, mask=m)
        x = x.to(tl.float32)
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        y = x * _rms(x, N, eps)
        if GEMMA:
            y = y * (1.0 + w)
        else:  # Llama rounds before the weight
            y = y.to(dt).to(tl.float32) * w
        tl.store(h_ptr + r * N + cols, y.to(dt), mask=m)


def residual_norm(x: torch.Tensor, d: torch.Tensor | None, w: torch.Tensor | None, eps: float,
                  h: torch.Tensor | None = None, d_norm: torch.Tensor | None = None,
                  gemma: bool = False) -> torch.Tensor | None:
    """x (T, N), contiguous, updated in place by `+ d` (if given; Gemma: `+ norm(d) * (1 + d_norm)`);
    returns h = RMSNorm(x) with weight w (None: no norm, returns None)."""
    t, n = x.shape
    if h is None and w is not None:
        h = torch.empty_like(x)
    dummy = x
    _residual_norm_kernel[(t,)](x, d if d is not None else dummy, d_norm if d_norm is not None else dummy,
                                w if w is not None else dummy, h if h is not None else dummy, n, eps,
                                HAS_D=d is not None, NORM_D=d_norm is not None, HAS_W=w is not None,
                                GEMMA=gemma, BLOCK=triton.next_power_of_2(n), num_warps=4)
    return h


@triton.jit
def _rope_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, qn_ptr, kn_ptr,
                       rope_rows, eps, q_scale, s_t, s_h,
                       HQ: tl.constexpr, HK: tl.constexpr, HP: tl.constexpr, D: tl.constexpr,
                       HALF: tl.constexpr, HEAD_NORM: tl.constexpr, Q_SCALE: tl.constexpr):
    """Program t: every head slot of token t as one [HP, HALF] tile per half (queries, then keys,
    then values). q -> q_ptr (T, HQ, D); k (Gemma: head-normed first), rotated, and v -> the
    cache at cache_seqlens + t. One program a (token, head) was 16 µs a Llama-1B layer at 512
    tokens: 24k programs of one warp, each moving 128 bytes."""
    t = tl.program_id(0).to(tl.int64)
    hs = tl.arange(0, HP)
    i = tl.arange(0, HALF)
    dt = qkv_ptr.dtype.element_ty
    live = hs < HQ + 2 * HK
    isq = hs < HQ
    isv = live & (hs >= HQ + HK)   # not the tile's padding rows: they would land in the next slot
    isk = live & ~isq & ~isv
    src = qkv_ptr + t * ((HQ + 2 * HK) * D) + hs[:, None] * D + i[None, :]
    x1 = tl.load(src, mask=live[:, None], other=0.0)
    x2 = tl.load(src + HALF, mask=live[:, None], other=0.0)
    slot = tl.load(pos_ptr).to(tl.int64) + t
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    if HEAD_NORM:  # Gemma 3's q_norm / k_norm: (x / rms(x)) * (1 + w), rounded once
        r = 1.0 / tl.sqrt((tl.sum(a * a, 1) + tl.sum(b * b, 1)) / D + eps)
        w1 = tl.where(isq[:, None], tl.load(qn_ptr + i)[None, :], tl.load(kn_ptr + i)[None, :]).to(tl.float32)
        w2 = tl.where(isq[:, None], tl.load(qn_ptr + HALF + i)[None, :],
                      tl.load(kn_ptr + HALF + i)[None, :]).to(tl.float32)
        a = ((a * r[:, None]) * (1.0 + w1)).to(dt).to(tl.float32)
        b = ((b * r[:, None]) * (1.0 + w2)).to(dt).to(tl.float32)
    row = tl.minimum(slot, rope_rows - 1)   # padding rows past the tables: clamped, never read
    c = tl.load(cos_ptr + row * HALF + i)[None, :]
    s = tl.load(sin_ptr + row * HALF + i)[None, :]
    o1 = (a * c - b * s).to(dt)
    o2 = (b * c + a * s).to(dt)
    if Q_SCALE:
        o1 = tl.where(isq[:, None], (o1.to(tl.float32) * q_scale).to(dt), o1)
        o2 = tl.where(isq[:, None], (o2.to(tl.float32) * q_scale).to(dt), o2)
    qd = q_ptr + (t * HQ + hs[:, None]) * D + i[None, :]
    tl.store(qd, o1, mask=isq[:, None])
    tl.store(qd + HALF, o2, mask=isq[:, None])
    kd = kc_ptr + slot * s_t + (hs[:, None] - HQ) * s_h + i[None, :]
    tl.store(kd, o1, mask=isk[:, None])
    tl.store(kd + HALF, o2, mask=isk[:, None])
    vd = vc_ptr + slot * s_t + (hs[:, None] - HQ - HK) * s_h + i[None, :]
    tl.store(vd, x1, mask=isv[:, None])
    tl.store(vd + HALF, x2, mask=isv[:, None])


def rope_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
               kc: torch.Tensor, vc: torch.Tensor, hq: int, hk: int, d: int, q_norm: torch.Tensor | None = None,
               k_norm: torch.Tensor | None = None, eps: float = 0.0, q_scale: float = 1.0) -> torch.Tensor:
    """qkv (T, (hq + 2 hk) d) from the packed QKV GEMM; cos/sin (rows, d/2) fp32; pos: int32 (1,)
    `cache_seqlens`; kc/vc one layer's (1, capacity, hk, d) cache. Writes K/V at pos..pos+T-1 and
    returns q (1, T, hq, d)."""
    t = qkv.shape[0]
    q = torch.empty((1, t, hq, d), device=qkv.device, dtype=qkv.dtype)
    k0, v0 = kc[0], vc[0]
    if k0.stride(-1) != 1 or v0.stride() != k0.stride() or qkv.stride(-1) != 1 or qkv.stride(0) != (hq + 2 * hk) * d:
        raise ValueError("rope_cache: qkv rows and the cache must be contiguous in the head dimension")
    norm = q_norm is not None
    hp = triton.next_power_of_2(hq + 2 * hk)
    _rope_cache_kernel[(t,)](qkv, cos, sin, pos, q, k0, v0, q_norm if norm else qkv, k_norm if norm else qkv,
                             cos.shape[0], eps, q_scale, k0.stride(0), k0.stride(1), HQ=hq, HK=hk, HP=hp, D=d,
                             HALF=d // 2, HEAD_NORM=norm, Q_SCALE=q_scale != 1.0,
                             num_warps=4 if hp * d <= 4096 else 8)
    return q


@triton.jit
def _glu_kernel(gu_ptr, out_ptr, F, GELU: tl.constexpr, BLOCK: tl.constexpr):
    """Row t, block j of the hidden width: act(gate) rounded, times up, rounded (as eager)."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < F
    dt = gu_ptr.dtype.element_ty
    g = tl.load(gu_ptr + t * 2 * F + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * 2 * F + F + cols, mask=m, other=0.0).to(tl.float32)
    if GELU:  # tanh GELU, with tanh(y) = 1 - 2 / (exp(2y) + 1)
        y = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = 0.5 * g * (2.0 - 2.0 / (tl.exp(2.0 * y) + 1.0))
    else:     # SiLU
        a = g / (1.0 + tl.exp(-g))
    tl.store(out_ptr + t * F + cols, (a.to(dt).to(tl.float32) * u).to(dt), mask=m)


def glu(gu: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """gu (T, 2F): [gate | up] columns of the packed gate/up GEMM -> act(gate) * up, (T, F)."""
    t, f = gu.shape[0], gu.shape[1] // 2
    out = torch.empty((t, f), device=gu.device, dtype=gu.dtype)
    block = min(1024, triton.next_power_of_2(f))
    _glu_kernel[(t, triton.cdiv(f, block))](gu, out, f, GELU=gelu, BLOCK=block, num_warps=4)
    return out
