"""FlashAttention backends (FA3 on Hopper, FA2 elsewhere on CUDA), found at run time.

Each backend states what it can serve; the router in attention.py falls back to SDPA
for anything it cannot, instead of letting a kernel compute the wrong thing.
"""

from __future__ import annotations

import importlib

import torch


class FlashBackend:
    """A `flash_attn_with_kvcache` implementation and the requests it can serve."""

    def __init__(self, name: str, fn, dtypes: tuple[torch.dtype, ...], windows: bool, softcap: bool):
        self.name, self.fn, self.dtypes = name, fn, dtypes
        self.windows, self.softcap = windows, softcap

    def can_serve(self, q: torch.Tensor, window_size: tuple[int, int], softcap: float) -> bool:
        if not q.is_cuda or q.dtype not in self.dtypes:
            return False
        if window_size[0] >= 0 and not self.windows:  # (-1, 0) under causal is no window at all
            return False
        return softcap == 0 or self.softcap

    def __call__(self, q, k_cache, v_cache, k, v, cache_seqlens, causal, window_size, softcap,
                 num_splits: int = 0):
        kwargs = dict(k=k, v=v, cache_seqlens=cache_seqlens, causal=causal, window_size=window_size)
        if softcap:
            kwargs["softcap"] = softcap
        if num_splits and self.name == "fa3":
            kwargs["num_splits"] = num_splits
        return self.fn(q, k_cache, v_cache, **kwargs)


def _import(module: str):
    try:
        return importlib.import_module(module)
    except Exception:  # a missing or broken CUDA extension just means "not available"
        return None


def _probe_windows(fn) -> bool:
    """fa3-fwd is built without local attention; ask the kernel instead of guessing."""
    try:
        q = torch.zeros(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16)
        kc = torch.zeros(1, 8, 1, 64, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.ones(1, dtype=torch.int32, device="cuda")
        fn(q, kc, kc.clone(), cache_seqlens=seqlens, causal=True, window_size=(2, 0))
        return True
    except Exception:
        return False


def load_fa3() -> FlashBackend | None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return None
    for module in ("flash_attn_interface", "fa3_fwd_interface"):
        mod = _import(module)
        if mod is not None and hasattr(mod, "flash_attn_with_kvcache"):
            fn = mod.flash_attn_with_kvcache
            # The official build has fp16; fa3-fwd has bf16 only. bf16 is what we run.
            dtypes = (torch.bfloat16, torch.float16) if module == "flash_attn_interface" else (torch.bfloat16,)
            return FlashBackend("fa3", fn, dtypes, windows=_probe_windows(fn), softcap=True)
    return None


def load_fa2() -> FlashBackend | None:
    if not torch.cuda.is_available():
        return None
    mod = _import("flash_attn")
    if mod is None or not hasattr(mod, "flash_attn_with_kvcache"):
        return None
    return FlashBackend("fa2", mod.flash_attn_with_kvcache, (torch.bfloat16, torch.float16),
                        windows=True, softcap=True)
