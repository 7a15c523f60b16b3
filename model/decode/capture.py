"""Capturing a CUDA graph without leaving memory behind: one side stream, the warm-up released.

Every capture here (the decode step, its samplers, each prefill bucket) warms its callable up
eagerly first (Triton compiles, cuBLAS makes its handle) and then records it. Done naively, each
capture on a new `torch.cuda.Stream()` costs memory that no graph uses:

- cuBLAS keeps a workspace per (handle, stream), 32 MiB on Hopper, for the life of the process:
  a pooled stream per bucket was one more workspace per bucket, and the graph's own capture
  stream another, allocated inside the graph's pool;
- the warm-up's activations are freed into blocks of the side stream, which neither the graph's
  private pool nor the main stream can reuse: an 8k prefill's warm-up stayed reserved beside the
  graph's pool of the same size.

So all captures share one side stream per device, warm up and record on it (one workspace), and
a large warm-up is released (`torch.cuda.empty_cache`) before the graph allocates its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one stream every warm-up and capture on `device` runs on."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream(device=index)
    return _STREAMS[index]


def capture(fn: Callable[[], object], device: torch.device, pool, warmups: int = 1,
            rng: torch.Generator | None = None, release: bool = False,
            mode: str = "global") -> torch.cuda.CUDAGraph:
    """Warm `fn` up `warmups` times, then record it into a graph whose memory comes from `pool`
    (a `graph_pool_handle()` shared by graphs that never run at the same time). `release`: hand
    the warm-up's freed blocks back to the driver before recording (worth a sync for large ones).
    `mode`: torch's `capture_error_mode`."""
    graph = torch.cuda.CUDAGraph()
    if rng is not None and hasattr(graph, "register_generator_state"):
        graph.register_generator_state(rng)
    side = capture_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    if release:
        side.synchronize()
        torch.cuda.empty_cache()
    with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode=mode):
        fn()
    return graph
