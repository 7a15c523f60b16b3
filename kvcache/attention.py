"""The one attention entry point, with `flash_attn_with_kvcache` semantics.

`Attention.__call__` appends k/v into the layer's cache at cache_seqlens, then attends
causally (bottom-right aligned) with GQA, an optional sliding window and softcap. The
backend is chosen once (auto, or forced with --attn) and any request that backend
cannot serve goes to SDPA, so a missing kernel feature never means wrong output. On CUDA, a
windowed request no flash build can serve (fa3-fwd has no local windows) goes to the Triton
kernel of window_attention.py, which reads only the window: SDPA would score every key.
"""

from __future__ import annotations

import importlib.util

import torch

from kvcache.cache import KVCache
from kvcache.flash import FlashBackend, load_fa2, load_fa3
from kvcache.sdpa import sdpa_with_kvcache

BACKENDS = ("auto", "fa3", "fa2", "sdpa")


def available_backends() -> list[str]:
    found = [b.name for b in (load_fa3(), load_fa2()) if b is not None]
    return found + ["sdpa"]


def window_kernel_runs(q: torch.Tensor) -> bool:
    """The Triton window kernel needs CUDA, Triton, and bf16 tensor-core products (sm_80+)."""
    return (q.is_cuda and torch.cuda.get_device_capability(q.device) >= (8, 0)
            and importlib.util.find_spec("triton") is not None)


class Attention:
    """Routes each attention call to the chosen flash backend or to SDPA."""

    def __init__(self, backend: str = "auto"):
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        self.requested = backend
        self.flash: FlashBackend | None = None
        if backend in ("auto", "fa3"):
            self.flash = load_fa3()
        if self.flash is None and backend in ("auto", "fa2"):
            self.flash = load_fa2()
        if backend in ("fa3", "fa2") and self.flash is None:
            raise RuntimeError(f"attention backend {backend} is not available on this machine "
                               f"(available: {', '.join(available_backends())})")
        self.num_splits = 0  # pinned by the CUDA-graph runner so capture and replay agree
        self.used: set[str] = set()

    @property
    def name(self) -> str:
        """The backends that actually ran, e.g. 'fa3' or 'fa3+sdpa' (windowed layers); 'c': a
        quantized CPU model's own kernels (model/cpu/prefill_attn.py)."""
        if not self.used:
            return self.flash.name if self.flash else "sdpa"
        return "+".join(sorted(self.used, key=("fa3", "fa2", "triton", "c", "sdpa").index))

    def __call__(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                 cache: KVCache, layer_idx: int, causal: bool = True,
                 window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0) -> torch.Tensor:
        k_cache, v_cache = cache.get_layer_cache(layer_idx)
        if self.flash is not None and self.flash.can_serve(q, window_size, softcap):
            self.used.add(self.flash.name)
            return self.flash(q, k_cache, v_cache, k, v, cache.cache_seqlens, causal, window_size,
                              softcap, self.num_splits)
        if self.windowed_kernel(q, window_size, softcap, cache):
            return self._window(q, k, v, cache, layer_idx, window_size[0])
        self.used.add("sdpa")
        if cache.batch_size != 1:
            raise NotImplementedError("the SDPA fallback serves a single-sequence cache (B=1)")
        return sdpa_with_kvcache(q, k_cache, v_cache, k, v, cache.seqlen, causal, window_size, softcap)


    @staticmethod
    def windowed_kernel(q: torch.Tensor, window_size: tuple[int, int], softcap: float, cache: KVCache) -> bool:
        """Whether a request goes to the Triton window kernel (CUDA, a window, no softcap, B=1)."""
        return window_size[0] >= 0 and softcap == 0 and cache.batch_size == 1 and window_kernel_runs(q)

    def _window(self, q, k, v, cache: KVCache, layer_idx: int, window_left: int) -> torch.Tensor:
        from kvcache.window_attention import window_attention  # lazy: imports triton

        k_cache, v_cache = cache.get_layer_cache(layer_idx)
        pos, tq = cache.seqlen, q.shape[1]
        if k is not None:
            k_cache[:, pos:pos + tq] = k
            v_cache[:, pos:pos + tq] = v
        self.used.add("triton")
        return window_attention(q, k_cache, v_cache, cache.cache_seqlens, window_left)
