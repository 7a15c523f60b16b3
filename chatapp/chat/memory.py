"""The process's memory, read by the worker for `Progress` and `Figures` events (the TUI's panel)."""

from __future__ import annotations

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
