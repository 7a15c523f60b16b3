"""The gate/up GEMM with SwiGLU (GeGLU) in its epilogue: act(h @ Wg^T) * (h @ Wu^T) in one kernel.

The plain fused prefill writes the (T, 2F) gate/up product and reads it back in `glu`
(model/decode/prefill_kernels.py): at 8k tokens of the Llama-3.2-1B shape that is 400 MB a layer
moved twice. Here one program owns a (BM, BN) tile of the output and keeps two accumulators, the
gate's and the up's, over the same rows of h; the epilogue rounds each to the model dtype where the
eager modules do (the GEMM outputs, the activation) and stores only act * up.

Whether it is faster than cuBLAS plus `glu` depends on the GPU and the shape, so `choose` measures
both on the bucket's shape the first time a prefill step is built for it (on the real weights,
CUDA events, a few repetitions) and takes the kernel only if it is at least 3% faster and agrees
with the pair; anything it cannot compile or run keeps cuBLAS. `CHOICES` keeps what it measured
(the bench prints it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from model.decode.prefill_kernels import glu


@triton.jit
def _glu_gemm_kernel(a_ptr, w_ptr, out_ptr, M, F, K, stride_am, stride_wn, stride_om,
                     GELU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     GROUP_M: tl.constexpr, EVEN: tl.constexpr):
    pid = tl.program_id(0)
    pid_m_count = tl.cdiv(M, BM)
    pid_n_count = tl.cdiv(F, BN)
    group = GROUP_M * pid_n_count   # programs of GROUP_M row blocks walk the columns together (L2 reuse)
    first_m = (pid // group) * GROUP_M
    size_m = min(pid_m_count - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    dt = a_ptr.dtype.element_ty
    a = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :]
    g = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    u = g + F * stride_wn
    mm = rm[:, None] < M
    mn = rn[:, None] < F
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        if EVEN:   # every tile whole: unmasked loads pipeline best
            av = tl.load(a)
            gv = tl.load(g)
            uv = tl.load(u)
        else:
            mk = rk[None, :] < K - k
            av = tl.load(a, mask=mm & mk, other=0.0)
            gv = tl.load(g, mask=mn & mk, other=0.0)
            uv = tl.load(u, mask=mn & mk, other=0.0)
        acc_g = tl.dot(av, tl.trans(gv), acc_g)
        acc_u = tl.dot(av, tl.trans(uv), acc_u)
        a += BK
        g += BK
        u += BK
    gate = acc_g.to(dt).to(tl.float32)
    up = acc_u.to(dt).to(tl.float32)
    if GELU:  # tanh GELU, as prefill_kernels.glu
        y = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = 0.5 * gate * (2.0 - 2.0 / (tl.exp(2.0 * y) + 1.0))
    else:     # SiLU
        act = gate / (1.0 + tl.exp(-gate))
    out = (act.to(dt).to(tl.float32) * up).to(dt)
    cn = pid_n * BN + tl.arange(0, BN)
    tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + cn[None, :], out, mask=mm & (cn[None, :] < F))


CONFIG = (128, 128, 64, 4, 8)   # BM, BN, BK, stages, warps
CONFIGS = (CONFIG, (128, 128, 64, 3, 8), (128, 64, 64, 4, 4))
MIN_ROWS = 512      # shorter buckets are launch-bound: cuBLAS + glu, unmeasured
PROBE_ROWS = 2048   # rows of the measurement (its memory is freed before any capture)
CHOICES: dict[tuple, dict] = {}


def glu_gemm(h: torch.Tensor, wgu: torch.Tensor, gelu: bool = False,
             config: tuple[int, int, int, int, int] = CONFIG) -> torch.Tensor:
    """h (T, K), wgu (2F, K) = [gate rows | up rows] (pack_rows) -> act(h Wg^T) * (h Wu^T), (T, F)."""
    t, k = h.shape
    f = wgu.shape[0] // 2
    if h.stride(1) != 1 or wgu.stride(1) != 1:
        raise ValueError("glu_gemm: h and wgu must be contiguous in K")
    out = torch.empty((t, f), device=h.device, dtype=h.dtype)
    bm, bn, bk, stages, warps = config
    grid = (triton.cdiv(t, bm) * triton.cdiv(f, bn),)
    _glu_gemm_kernel[grid](h, wgu, out, t, f, k, h.stride(0), wgu.stride(0), out.stride(0), GELU=gelu,
                           BM=bm, BN=bn, BK=bk, GROUP_M=8, EVEN=t % bm == 0 and f % bn == 0 and k % bk == 0,
                           num_stages=stages, num_warps=warps)
    return out


def _ms(fn, reps: int = 3) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def choose(rows: int, wgu: torch.Tensor, gelu: bool = False) -> tuple[int, int, int, int, int] | None:
    """The kernel's config for a bucket of `rows` tokens over `wgu`, or None for cuBLAS + `glu`."""
    if rows < MIN_ROWS or wgu.device.type != "cuda":
        return None
    k, f = wgu.shape[1], wgu.shape[0] // 2
    key = (rows, k, f, gelu, wgu.dtype, wgu.device.index)
    if key not in CHOICES:
        CHOICES[key] = _measure(rows, wgu, gelu)
        torch.cuda.empty_cache()   # the probe's blocks: before the bucket's warm-up and graph allocate
    return CHOICES[key]["config"]


def _measure(rows: int, wgu: torch.Tensor, gelu: bool) -> dict:
    n = min(rows, PROBE_ROWS)
    gen = torch.Generator(device=wgu.device).manual_seed(0)
    h = torch.randn(n, wgu.shape[1], device=wgu.device, dtype=wgu.dtype, generator=gen)
    ref = glu(F.linear(h, wgu), gelu=gelu).float()
    rec: dict = {"rows": rows, "probe_rows": n, "k": wgu.shape[1], "f": wgu.shape[0] // 2, "gelu": gelu,
                 "cublas_ms": _ms(lambda: glu(F.linear(h, wgu), gelu=gelu)), "fused": {}, "config": None}
    best = 0.97 * rec["cublas_ms"]
    for cfg in CONFIGS:
        try:
            err = float((glu_gemm(h, wgu, gelu, cfg).float() - ref).norm() / ref.norm())
            ms = _ms(lambda c=cfg: glu_gemm(h, wgu, gelu, c))
        except Exception as e:  # noqa: BLE001 - a config this GPU cannot compile or run: cuBLAS stays
            rec["fused"][str(cfg)] = f"failed: {type(e).__name__}"
            continue
        rec["fused"][str(cfg)] = {"ms": ms, "rel_err": err}
        if err < 2e-2 and ms < best:
            best, rec["config"] = ms, cfg
    return rec
