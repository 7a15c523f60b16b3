"""CUDA-graph prefill at bucketed lengths, and the chunk sizes memory allows.

An eager forward costs ~20 ms of host time on the H200 whatever its length (the SmolLM2 shape:
30 layers of ~20 launches each, FA3 ~100 µs a call), so a turn's 100 new tokens took ~21 ms to
first token while the GPU worked ~1 ms. Here each bucket length B (16, 32, ... up to what memory
allows) is captured once, lazily, as one graph of `PrefillStep` (model/decode/prefill_step.py): the
tokens go into a static buffer, padded up to B, the graph replays, and the cache advances by the
real count only. Longer inputs replay the largest bucket back to back, so the GPU never waits on
Python. Where the cache cannot hold a bucket's padding (its last B - n positions), that chunk
runs eagerly instead.
"""

from __future__ import annotations

import torch

from kvcache import KVCache
from model.decode import triton_available
from model.decode.capture import capture
from model.decode.steps import family_name, prefill_step_for

BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def activation_bytes_per_token(model: torch.nn.Module) -> int:
    """A generous bound on one token's live activations in a forward: the fp32 norm and rotary
    temporaries, q/k/v, and the MLP's hidden rows (gate, up, product)."""
    c = model.config
    hidden = getattr(c, "hidden_size", None) or c.n_embd
    heads = getattr(c, "num_attention_heads", None) or c.n_head
    kv = getattr(c, "num_key_value_heads", None) or c.n_kv_head
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    ffn = getattr(c, "intermediate_size", None) or 4 * hidden
    return 4 * (4 * hidden + 4 * (heads + 2 * kv) * head_dim + 2 * ffn)


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())


def chunk_tokens(model: torch.nn.Module, device: torch.device, floor: int = 512) -> int:
    """Tokens one prefill chunk may hold: activations within the weights' own size (so an 8k
    prefill peaks under the cache plus twice the weights) and a quarter of the free memory."""
    budget = weight_bytes(model)
    if device.type == "cuda":
        budget = min(budget, torch.cuda.mem_get_info(device)[0] // 4)
    return max(floor, budget // activation_bytes_per_token(model))


def fused_step(model: torch.nn.Module, cache: KVCache) -> type | None:
    """The fused-kernel prefill step (model/decode/prefill_fused.py) where it runs: CUDA with
    Triton on sm_80+, a family and weights it fuses; None: the step of the model's own modules."""
    if cache.device.type != "cuda" or torch.cuda.get_device_capability(cache.device) < (8, 0):
        return None
    if not triton_available():
        return None
    from model.decode.prefill_fused import fused_prefill_class  # lazy: imports triton

    return fused_prefill_class(model, family_name(model))


class PrefillGraphs:
    """Captured prefill for one model and cache: `run(ids, n)` pushes n <= max_bucket tokens."""

    def __init__(self, model: torch.nn.Module, cache: KVCache, num_splits: int = 1, max_bucket: int = 0,
                 fused: bool = False, pool=None):
        plain = prefill_step_for(model)
        if plain is None:
            raise NotImplementedError(f"no capturable prefill for {type(model).__name__}")
        make = fused_step(model, cache) if fused else None
        self.kind = "fused" if make is not None else "modules"  # which step the graphs capture
        limit = max_bucket or chunk_tokens(model, cache.device)
        self.buckets = tuple(b for b in BUCKETS if b <= limit) or BUCKETS[:1]
        self.max_bucket = self.buckets[-1]
        self.model, self.cache, self.num_splits = model, cache, num_splits
        self.make = make or plain
        dev = cache.device
        self.ids = torch.zeros(1, self.max_bucket, dtype=torch.long, device=dev)
        self.last = torch.zeros(1, dtype=torch.long, device=dev)
        self.logits = torch.zeros(model.config.vocab_size, dtype=torch.float32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.steps: dict[int, object] = {}
        # Shared by every bucket and the decode graphs (`pool`): each graph's memory is scratch,
        # and no two of them ever run at once (one stream).
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.largest_first = True

    def bucket_for(self, n: int) -> int | None:
        """The smallest bucket holding n tokens whose padding fits in the cache, or None."""
        return next((b for b in self.buckets if b >= n and b <= self.cache.free), None)

    def run(self, ids: torch.Tensor, bucket: int) -> torch.Tensor:
        """ids: (n,) int64 on the device, n <= bucket. Advances the cache by n; returns the logits
        of the last token (a static buffer, overwritten by the next run)."""
        n = ids.shape[0]
        self.cache.check_fits(bucket)  # the padding's K/V land in the cache too
        self.ids[0, :n].copy_(ids)
        self.last.fill_(n - 1)
        graph = self.graphs.get(bucket) or self._capture_for(bucket)
        graph.replay()
        self.cache.advance(n)
        return self.logits

    @property
    def names(self) -> set[str]:
        return set().union(*(s.attend.names for s in self.steps.values()))

    def _capture_for(self, bucket: int) -> torch.cuda.CUDAGraph:
        """The largest bucket is captured before any other (where the cache has room for its
        padding): a smaller one then reuses the blocks it freed in the shared pool, so the pool
        holds one bucket's activations, not the sum of every length a session meets."""
        top = self.max_bucket
        if self.largest_first and bucket < top and top not in self.graphs and top <= self.cache.free:
            self._capture(top)
        return self._capture(bucket)

    def _capture(self, bucket: int) -> torch.cuda.CUDAGraph:
        step = self.make(self.model, self.cache, self.ids[:, :bucket], self.last, self.logits, self.num_splits)
        # The warm-up compiles kernels and makes cuBLAS's handle; its K/V land past the end, and its
        # activations are released before the graph allocates its own (decode/capture.py).
        graph = capture(step, self.cache.device, self.pool, release=True, mode="thread_local")
        self.graphs[bucket], self.steps[bucket] = graph, step
        return graph
