"""Batch-1 decode speed at a given context, the bytes a token must read, and the copy bandwidth.

MBU = (weight bytes read per token + KV bytes read at that context) / TPOT / peak, where the
peak is a device-to-device copy measured in the same run (bytes read plus bytes written).
"""

from __future__ import annotations

import statistics
import time

import torch

from kvcache import KVCache
from model.decode.generate import Generator
from model.decode.sampling import SamplingConfig


def is_linear_like(mod: torch.nn.Module) -> bool:
    """nn.Linear, or any module that declares `in_features` and `out_features` as nn.Linear does
    (a quantized linear holding packed weights and scales as buffers)."""
    return isinstance(mod, torch.nn.Linear) or (hasattr(mod, "in_features") and hasattr(mod, "out_features"))


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes a decode token reads from the model: every parameter and buffer held directly by a
    linear-like module, as stored (so int4/int8 weights and their scales count at their real
    size). Embedding tables are gathered a row at a time and don't count; a tensor shared by two
    modules (a tied output head) counts once."""
    seen, total = set(), 0
    for mod in model.modules():
        if not is_linear_like(mod):
            continue
        for t in [*mod.parameters(recurse=False), *mod.buffers(recurse=False)]:
            if t is None or t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def kv_bytes_read(cache: KVCache, context: int) -> int:
    return 2 * cache.num_layers * context * cache.k_cache.shape[-2] * cache.k_cache.shape[-1] * \
        cache.k_cache.element_size()


def peak_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Bytes/s of a large device-to-device copy, counting the read and the write."""
    if device.type != "cuda":
        nbytes, reps = 1 << 26, 5
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps + 2):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - t)
    return 2 * nbytes / statistics.median(times[2:])


def read_bandwidth(nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Bytes/s of reading a large CPU tensor (`torch.sum`, on torch's current threads): the
    ceiling for a decode step, which reads its weights once and writes almost nothing. The
    tensor is far beyond any cache, so this is the memory's rate."""
    src = torch.ones(nbytes // 4)
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        src.sum()
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times[1:])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_at(gen: Generator, context: int, tokens: int, seed: int = 0,
              sampling: SamplingConfig | None = None) -> dict:
    """Fill the cache to `context` with random tokens, then time `tokens` decode steps (greedy
    unless `sampling` says otherwise), each one a feed plus a sample, exactly what a chat does
    per token."""
    cache = gen.cache
    cache.reset()
    gen.forget()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, min(gen.vocab_size, 30000), (context,), generator=g).tolist()
    gen.prefill(ids)
    gen.configure(sampling or SamplingConfig(temperature=0.0))
    token = gen.sample()
    times = []
    for _ in range(tokens):
        t = time.perf_counter()
        gen.feed(token)
        token = gen.sample()
        times.append(time.perf_counter() - t)
    tpot = statistics.median(times)
    return {"context": context, "tokens": tokens, "tpot_ms": tpot * 1000, "tok_s": tokens / sum(times),
            "tok_s_median": 1 / tpot}


def with_mbu(row: dict, model: torch.nn.Module, cache: KVCache, peak: float) -> dict:
    moved = weight_bytes_per_token(model) + kv_bytes_read(cache, row["context"])
    row["bytes_per_token"] = moved
    row["mbu"] = moved / (row["tpot_ms"] / 1000) / peak
    return row
