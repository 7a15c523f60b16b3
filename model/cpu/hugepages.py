"""The quantized weights moved into one anonymous arena that Linux may back with 2 MB pages.

A converted model's QLinear buffers come from safetensors in 4 KB pages. A decode token reads
every weight once, and with 4 KB pages a GEMV streaming 100-400 MB walks a new page (and a TLB
miss the hardware prefetcher does not cross) every 4 KB: measured on this Zen 4, one thread,
the Qwen3-0.6B shape's 128 MB Q6_K head ran at 13.6 GB/s from those pages and at 17.6 GB/s
from the same bytes in huge pages (docs/notes.md, "CPU decode, fourth push"). Transparent huge
pages are usually in `madvise` mode, so the arena asks for them with MADV_HUGEPAGE; where the
kernel gives none the copy costs nothing at decode time and the weights read as before.
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import torch

HUGE = 2 << 20       # the x86-64 huge page
ALIGN = 64           # every tensor starts on its own cache line


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def into_arena(linears: list) -> int:
    """Copy the block buffers (q, scale, min) of `linears` (QLinears) into one anonymous mapping
    advised MADV_HUGEPAGE, in place of their own; returns the bytes moved (0 where the platform
    has no madvise, or NANOCHAT_HUGEPAGES=0: the buffers stay as they are). Call before anything takes their pointers
    (QLinear.qw, the C step)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None) if os.environ.get("NANOCHAT_HUGEPAGES", "1") != "0" else None
    parts = [(ql, name) for ql in linears for name in ("q", "scale", "min") if getattr(ql, name) is not None]
    total = sum(-(-_nbytes(getattr(ql, n)) // ALIGN) * ALIGN for ql, n in parts)
    if advice is None or total == 0:
        return 0
    area = mmap.mmap(-1, total + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area.madvise(advice)
    whole = torch.frombuffer(area, dtype=torch.uint8)   # holds the mapping for as long as any view lives
    at = -whole.data_ptr() % HUGE                      # start on a huge-page boundary
    for ql, name in parts:
        t = getattr(ql, name)
        n = _nbytes(t)
        # numpy's copy: single-threaded. torch's copy_ wakes its (passive, sleeping) OpenMP pool
        # for every one of a model's hundreds of tensors: 1.4 s for SmolLM2's 96 MB on a busy box
        np.copyto(whole[at:at + n].numpy(), t.contiguous().reshape(-1).view(torch.uint8).numpy())
        setattr(ql, name, whole[at:at + n].view(t.dtype).view(t.shape))
        at += -(-n // ALIGN) * ALIGN
    for ql in linears:
        ql._qw = None   # a descriptor built before would point at the old buffers
    return total


def own_the_rest(model: torch.nn.Module) -> None:
    """Copy the model's other parameters (norms: small) out of the loader's file mapping, so that
    once the arena holds the weights nothing keeps that mapping, and the pages the copy read
    leave our resident memory with it."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()


def model_linears(model: torch.nn.Module) -> list:
    """The model's QLinears, each once (a tied head is the embedding's table)."""
    from model.cpu.qlinear import QLinear

    return list({id(m): m for m in model.modules() if isinstance(m, QLinear)}.values())
