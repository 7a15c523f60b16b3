"""The process's memory, read by the worker for `Progress` and `Figures` events (the TUI's panel),
and handed back to the system after each turn (`release_freed`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import psutil

from chatapp.chat.events import Memory

PROCESS = psutil.Process()


def read_memory(device: str) -> Memory:
    mem = Memory(PROCESS.memory_info().rss)
    if device.startswith("cuda"):
        import torch  # lazy: on CUDA only (a --backend session has no torch at all)

        mem.cuda_allocated = torch.cuda.memory_allocated(device)
        mem.cuda_reserved = torch.cuda.memory_reserved(device)
    return mem


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (musl, macOS: their allocators return memory themselves)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed() -> None:
    """Give the heap's free pages back to the system. glibc raises its mmap threshold to the size
    of each large block freed (up to 32 MiB), so the next blocks of that size come from the heap,
    and once freed stay resident: a snapshot compaction's copies of the cache (chatapp/store/
    snapshots.py) left 20 MiB behind at turn 33 of a default-model chat, 11 more at turn 49, and
    more each time the chat was longer. Called once a turn is done and saved: about 0.4 ms."""
    if trim := _malloc_trim():
        trim(0)
