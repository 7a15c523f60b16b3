"""Matrix-vector kernels for M = 1: the GEMVs of a decode step, each fused with its neighbours.

cuBLAS runs batch-1 GEMV at about a quarter of the H200's bandwidth on these shapes, and
every separate norm, activation or residual add costs a launch of its own. These kernels
fold the elementwise work in:

- `norm_gemv`: RMSNorm(x) @ W.T, optionally with SwiGLU (gate and up rows in one matrix)
  or ReLU^2. The norm costs no extra pass: the sum of squares is gathered from the same x
  the product uses, and the scalar 1/rms is applied to the dot products at the end
  (one rounding fewer than the eager module, which rounds the normed vector to bf16 first).
- `gemv`: out = W @ a, or (`add`) x += W @ a in place.

Each program owns whole rows and loads all of their weights at once, before anything the
previous kernel wrote (docs/gpu.md, "Weights before the wait"). With programmatic dependent
launch (`pdl`, Hopper), a kernel starts while the previous one still runs, streams its
weights in, and only then waits (`gdc_wait`) for the activations: the weight reads of
consecutive kernels overlap, and the launch gap between them disappears.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ACT_NONE, ACT_SWIGLU, ACT_RELU2, ACT_GEGLU = 0, 1, 2, 3  # GeGLU: Gemma's, tanh GELU


@triton.jit
def load_rows(ptr, rows, rm, K: tl.constexpr, KP: tl.constexpr):
    """Whole rows of a row-major (N, K) matrix as one (rows, KP) tile, KP = next_pow2(K); the
    padding columns are masked off, so they cost registers but no memory traffic."""
    cols = tl.arange(0, KP)
    return tl.load(ptr + rows[:, None] * K + cols[None, :], mask=rm[:, None] & (cols < K)[None, :], other=0.0)


@triton.jit
def load_vec(ptr, K: tl.constexpr, KP: tl.constexpr):
    cols = tl.arange(0, KP)
    return tl.load(ptr + cols, mask=cols < K, other=0.0).to(tl.float32)


@triton.jit
def _norm_gemv_kernel(x_ptr, nw_ptr, w_ptr, out_ptr, t_ptr, pw_ptr, xo_ptr, N, eps, K: tl.constexpr,
                      KP: tl.constexpr, ACT: tl.constexpr, HAS_NW: tl.constexpr, ADD: tl.constexpr,
                      BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # let the next kernel start now: it too only streams weights until its own wait
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = rows < N
    # Weights first: nothing in the step writes them, so no need to wait for the previous kernel.
    w = load_rows(w_ptr, rows, rm, K, KP)
    if ACT == 1 or ACT == 3:  # SwiGLU / GeGLU: the up rows sit N rows below the gate rows
        u = load_rows(w_ptr, rows + N, rm, K, KP)
    if PDL:
        tl.extra.cuda.gdc_wait()
    x = load_vec(x_ptr, K, KP)
    if ADD:  # Gemma's post-sublayer norm and residual add first: x += RMSNorm(t) * (1 + pw)
        xdt = x_ptr.dtype.element_ty
        t = load_vec(t_ptr, K, KP)
        rt = 1.0 / tl.sqrt(tl.sum(t * t, 0) / K + eps)
        x = (x + (t * rt * (1.0 + load_vec(pw_ptr, K, KP))).to(xdt).to(tl.float32)).to(xdt).to(tl.float32)
        if tl.program_id(0) == 0:   # every program has the new residual; one writes it (elsewhere)
            cols = tl.arange(0, KP)
            tl.store(xo_ptr + cols, x.to(xdt), mask=cols < K)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / K + eps)
    if HAS_NW:
        x = x * load_vec(nw_ptr, K, KP)
    dt = w_ptr.dtype.element_ty
    y = (tl.sum(w.to(tl.float32) * x[None, :], 1) * rstd).to(dt).to(tl.float32)
    if ACT == 1:
        up = (tl.sum(u.to(tl.float32) * x[None, :], 1) * rstd).to(dt).to(tl.float32)
        y = (y / (1.0 + tl.exp(-y))).to(dt).to(tl.float32) * up
    elif ACT == 3:  # gelu_tanh(g) = g * sigmoid(2 * 0.79788456 * (g + 0.044715 g^3))
        up = (tl.sum(u.to(tl.float32) * x[None, :], 1) * rstd).to(dt).to(tl.float32)
        z = 1.5957691216057308 * (y + 0.044715 * y * y * y)
        y = (y / (1.0 + tl.exp(-z))).to(dt).to(tl.float32) * up
    elif ACT == 2:
        y = tl.maximum(y, 0.0)
        y = y * y
    tl.store(out_ptr + rows, y.to(dt).to(out_ptr.dtype.element_ty), mask=rm)


@triton.jit
def _gemv_kernel(w_ptr, a_ptr, out_ptr, N, K: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr,
                 ADD: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = rows < N
    w = load_rows(w_ptr, rows, rm, K, KP)
    if PDL:
        tl.extra.cuda.gdc_wait()
    y = tl.sum(w.to(tl.float32) * load_vec(a_ptr, K, KP)[None, :], 1)
    if ADD:  # out += W @ a: the product rounded to the weights' dtype first, as `x + linear(a)` is
        r = tl.load(out_ptr + rows, mask=rm, other=0.0)
        y = r.to(tl.float32) + y.to(w_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rm)


def pdl_supported(device: torch.device | str) -> bool:
    """Programmatic dependent launch needs Hopper or newer (griddepcontrol)."""
    dev = torch.device(device)
    return dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9


# Weight elements one program holds (a 16 KB bf16 tile, padding included), the programs a
# kernel should have at least, and its warps. One warp a program: every reduction (the norm,
# each row's dot product) stays in warp shuffles, with no shared-memory round trip and no
# block barrier, and twice the programs keep the SMs as busy. Same-run A/B on the H200
# against 4 warps / 16K / 264 (captured step): SmolLM2 shape 398 -> 387 µs at 512 tokens,
# 471 -> 453 at 2k, 539 -> 505 at 8k; d20 543 -> 531 at 512; d32 1,515 -> 1,546 (+2%).
# Also measured: 2 warps (worse than 4), 4K tiles, 1,056 programs: docs/benchmarks.md.
TILE_ELEMS = 8192
MIN_PROGRAMS = 528
WARPS = 1


def rows_per_program(n: int, k: int, mats: int = 1) -> int:
    """BLOCK_N: as many whole rows as fit TILE_ELEMS, halved until the grid fills the GPU."""
    kp = triton.next_power_of_2(k)
    bn = 1
    while bn * 2 * kp * mats <= TILE_ELEMS:
        bn *= 2
    while bn > 1 and triton.cdiv(n, bn) < MIN_PROGRAMS:
        bn //= 2
    return bn


def norm_gemv(x: torch.Tensor, norm_w: torch.Tensor | None, w: torch.Tensor, out: torch.Tensor,
              eps: float, act: int = ACT_NONE, pdl: bool = False,
              add: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
              block_n: int = 0, warps: int = 0) -> torch.Tensor:
    """out[:N] = act(RMSNorm(x) @ W.T); W is (N, K), or (2N, K) gate-then-up for SwiGLU and GeGLU.

    `add` = (t, pw, x_out): first x_out = x + RMSNorm(t) * (1 + pw), rounded as Gemma's post-norm
    and residual add are, and the product uses x_out. x_out must not be x: the programs all read
    x while the first one writes x_out."""
    n, k = out.shape[-1], x.shape[-1]
    bn = block_n or rows_per_program(n, k, 2 if act in (ACT_SWIGLU, ACT_GEGLU) else 1)
    t, pw, xo = add if add is not None else (x, x, x)
    if add is not None and xo.data_ptr() == x.data_ptr():
        raise ValueError("norm_gemv: the residual's new value needs a buffer of its own")
    _norm_gemv_kernel[(triton.cdiv(n, bn),)](
        x, norm_w if norm_w is not None else x, w, out, t, pw, xo, n, eps, K=k, KP=triton.next_power_of_2(k),
        ACT=act, HAS_NW=norm_w is not None, ADD=add is not None, BLOCK_N=bn, PDL=pdl,
        num_warps=warps or WARPS, launch_pdl=pdl)
    return out


def gemv(w: torch.Tensor, a: torch.Tensor, out: torch.Tensor, pdl: bool = False, add: bool = False) -> torch.Tensor:
    """out = W @ a, or with `add` out += W @ a in place, rounded like `x + linear(a)`."""
    n, k = w.shape
    bn = rows_per_program(n, k)
    _gemv_kernel[(triton.cdiv(n, bn),)](w, a, out, n, K=k, KP=triton.next_power_of_2(k), BLOCK_N=bn, ADD=add,
                                        PDL=pdl, num_warps=WARPS, launch_pdl=pdl)
    return out
