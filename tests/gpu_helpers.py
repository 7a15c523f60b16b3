"""What the GPU tests share (tests/test_gpu.py, tests/test_gpu_prefill.py)."""

from __future__ import annotations

from model.decode.generate import Generator


def share_prefill(graph: Generator, eager: Generator, ids: list[int]) -> None:
    """Give eager the graph's prefill K/V, then recompute its last prompt token over them (so
    its logits belong to that history)."""
    p = len(ids)
    eager.cache.k_cache[:, :, :p].copy_(graph.cache.k_cache[:, :, :p])
    eager.cache.v_cache[:, :, :p].copy_(graph.cache.v_cache[:, :, :p])
    eager.cache.rewind(p - 1)
    eager.forget()
    eager.prefill(ids[-1:])
