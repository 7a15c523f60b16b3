"""The quantized weights in one anonymous arena that Linux may back with 2 MB pages.

A model's QLinear buffers come from a file's mapping in 4 KB pages. A decode token reads
every weight once, and with 4 KB pages a GEMV streaming 100-400 MB walks a new page (and a TLB
miss the hardware prefetcher does not cross) every 4 KB: measured on this Zen 4, one thread,
the Qwen3-0.6B shape's 128 MB Q6_K head ran at 13.6 GB/s from those pages and at 17.6 GB/s
from the same bytes in huge pages (docs/notes.md, "CPU decode, fourth push"). Transparent huge
pages are usually in `madvise` mode, so the arena asks for them with MADV_HUGEPAGE; where the
kernel gives none the copy costs nothing at decode time and the weights read as before.

Never two copies at once: as each tensor is copied in, the file pages it was read from are
dropped from this process's resident memory (`release`), so a load peaks at the arena plus one
tensor, not at the arena plus the file (docs/weight-formats.md, "Memory").
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

import numpy as np
import torch

HUGE = 2 << 20       # the x86-64 huge page
ALIGN = 64           # every tensor starts on its own cache line
PAGE = mmap.PAGESIZE


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Arena:
    """One anonymous mapping advised MADV_HUGEPAGE, filled front to back by `put`."""

    def __init__(self, size: int, advice: int):
        area = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        area.madvise(advice)
        self.whole = torch.frombuffer(area, dtype=torch.uint8)   # holds the mapping while any view lives
        self.at = -self.whole.data_ptr() % HUGE                  # start on a huge-page boundary
        self.end = self.at + size

    def put(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of `t` in the arena (same dtype and shape); the file pages `t` was read from,
        if it is a view of a file's mapping, leave our resident memory."""
        n = nbytes(t)
        if self.at + n > self.end:
            raise ValueError(f"the arena has {self.end - self.at} bytes left, not {n}")
        # numpy's copy: single-threaded. torch's copy_ wakes its (passive, sleeping) OpenMP pool
        # for every one of a model's hundreds of tensors: 1.4 s for SmolLM2's 96 MB on a busy box
        src = t.contiguous()
        np.copyto(self.whole[self.at:self.at + n].numpy(), src.reshape(-1).view(torch.uint8).numpy())
        release(src.data_ptr(), n)
        out = self.whole[self.at:self.at + n].view(t.dtype).view(t.shape)
        self.at += aligned(n)
        return out


def arena(size: int) -> Arena | None:
    """An arena of `size` bytes, or None where the platform has no MADV_HUGEPAGE or
    NANOCHAT_HUGEPAGES=0 (the weights are then read where they are)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None) if os.environ.get("NANOCHAT_HUGEPAGES", "1") != "0" else None
    return None if advice is None or size == 0 else Arena(size, advice)


def into_arena(linears: list) -> int:
    """Copy the block buffers (q, scale, min) of `linears` (QLinears) into one arena, in place of
    their own; returns the bytes moved (0 where `arena` gives none: the buffers stay as they
    are). Call before anything takes their pointers (QLinear.qw, the C step)."""
    parts = [(ql, name) for ql in linears for name in ("q", "scale", "min") if getattr(ql, name) is not None]
    total = sum(aligned(nbytes(getattr(ql, n))) for ql, n in parts)
    if (area := arena(total)) is None:
        return 0
    for ql, name in parts:
        setattr(ql, name, area.put(getattr(ql, name)))
    for ql in linears:
        ql._qw = None   # a descriptor built before would point at the old buffers
    return total


def release(addr: int, size: int) -> None:
    """Drop the whole pages of [addr, addr + size) from our resident memory where they belong to
    a file's mapping (MADV_DONTNEED: read again from the file, or the page cache, if touched).
    Anonymous memory is left alone: there it would zero the bytes."""
    lo, hi = -(-addr // PAGE) * PAGE, (addr + size) // PAGE * PAGE
    if hi <= lo or not sys.platform.startswith("linux") or not file_backed(lo, hi):
        return
    ctypes.CDLL(None).madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), mmap.MADV_DONTNEED)


def file_backed(lo: int, hi: int) -> bool:
    """Whether [lo, hi) lies inside one mapping of a file (/proc/self/maps: an inode, a path)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= lo < end:
                return hi <= end and fields[4] != "0" and len(fields) > 5 and fields[5].startswith("/")
    return False


def own_the_rest(model: torch.nn.Module) -> None:
    """Copy the model's other parameters (norms: small) out of the loader's file mapping, so that
    once the arena holds the weights nothing keeps that mapping."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()


def model_linears(model: torch.nn.Module) -> list:
    """The model's QLinears, each once (a tied head is the embedding's table)."""
    from model.cpu.qlinear import QLinear

    return list({id(m): m for m in model.modules() if isinstance(m, QLinear)}.values())
