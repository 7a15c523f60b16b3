"""The CPU prefill's attention in C (prefill_attn.c), on the prefill GEMM's pool of threads.

`CpuAttention` is the kvcache entry point for a quantized model on the CPU: a prefill (more
than one fp32 query, the fp16 cache of one sequence, causal, no softcap) appends its K/V at
cache_seqlens as every backend does, then attends in C; anything else, `--attn sdpa` (a
backend asked for by name) and NANOCHAT_QGEMM=0 (the exact fp32 path) go to the backend it
wraps (SDPA). Why: torch's SDPA was ~17% of a one-thread pp512, and its OpenMP split
collapsed when another program held a core. On AMX the bf16 prefill attends through PyTorch's
bf16 SDPA instead (prefill_bf16.attend: oneDNN's tiles, 3-4x this kernel's fp32 rate there);
without AMX that SDPA is slower than this kernel (Zen 4: 414 against ~180 ms a 1-thread pp512), and
the bf16 path attends here with bf16 products (VDPBF16PS) where the CPU has AVX-512 BF16.
"""

from __future__ import annotations

import ctypes

import torch

from kvcache import Attention, KVCache
from model.cpu import gemm_pool, prefill_bf16, prefill_gemm


def bind(lib: ctypes.CDLL | None) -> ctypes.CDLL | None:
    lib = prefill_gemm.bind(lib)
    if lib is not None and lib.qg_attention.argtypes is None:
        lib.qg_attention.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 3 + [ctypes.c_int] * 6 + [
            ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    return lib


def attend(lib: ctypes.CDLL, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int,
           window_left: int, scale: float, threads: int, bf16: bool = False) -> torch.Tensor | None:
    """Causal attention of q (1, T, Hq, D) fp32 at positions pos.. over the fp16 caches (1, cap,
    Hk, D), rows [0, pos + T) already written; None where the kernel does not serve it. bf16:
    the products in bf16 (AVX-512 BF16: the bf16 prefill's; None on a CPU without it)."""
    _, t, hq, d = q.shape
    hk = k_cache.shape[2]
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return None
    qc = q.contiguous()
    o = torch.empty_like(qc)
    with gemm_pool.LOCK:
        ctx = gemm_pool.context(lib, threads, 0)
        if not ctx or lib.qg_attention(ctx, qc.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), t, pos, hq, hk,
                                       d, window_left, scale, o.data_ptr(), int(bf16)) != 0:
            return None
    return o


class CpuAttention(Attention):
    """The wrapped Attention's backend choice, with the CPU prefill's attention in front of it.
    It records what ran, so the panel and a turn's JSON say 'c' for ours (the C decode step
    records it too) and 'sdpa' for oneDNN's bf16 SDPA or the fallback."""

    @classmethod
    def wrap(cls, inner: Attention) -> CpuAttention:
        out = cls.__new__(cls)
        out.__dict__.update(inner.__dict__)
        return out

    def __call__(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, cache: KVCache,
                 layer_idx: int, causal: bool = True, window_size: tuple[int, int] = (-1, -1),
                 softcap: float = 0.0) -> torch.Tensor:
        k_cache, v_cache = cache.get_layer_cache(layer_idx)
        if (self.requested == "auto" and q.shape[1] > 1 and k is not None and causal and softcap == 0
                and window_size[1] in (0, -1) and q.dtype == torch.float32 and q.device.type == "cpu"
                and k_cache.dtype == torch.float16 and cache.batch_size == 1 and prefill_gemm.enabled()
                and (lib := bind(prefill_gemm.lib()))):
            pos, t = cache.seqlen, q.shape[1]
            k_cache[:, pos:pos + t] = k
            v_cache[:, pos:pos + t] = v
            scale = q.shape[-1] ** -0.5
            bf16, threads = prefill_gemm.path(t) == "bf16", torch.get_num_threads()
            if bf16 and prefill_bf16.amx():
                out = prefill_bf16.attend(q, k_cache, v_cache, pos, window_size[0], scale)
                self.used.add("sdpa")
            else:
                out = attend(lib, q, k_cache, v_cache, pos, window_size[0], scale, threads, bf16)
                if out is None and bf16:   # no AVX-512 BF16, or a head_dim not a multiple of 32
                    out = attend(lib, q, k_cache, v_cache, pos, window_size[0], scale, threads)
                if out is not None:
                    self.used.add("c")
            if out is not None:
                return out
            return super().__call__(q, None, None, cache, layer_idx, causal, window_size, softcap)
        return super().__call__(q, k, v, cache, layer_idx, causal, window_size, softcap)
