"""The peak GPU memory of an 8k prefill, measured in a process of its own.

    python -m chatapp.bench.gpu_memory SPEC [--capacity N] [--tokens N]

prints one JSON line. The figure is `torch.cuda.max_memory_reserved()` over the whole process:
every segment the caching allocator held at its highest (the graphs' private pools, cuBLAS's
workspaces, cached free blocks), from the model's load through the Generator (its decode graphs
captured) to the end of the first prefill of `--tokens` random ids (its buckets captured on the
way), as a user's process that loads the model and prefills an 8k file sees it. Nothing is
reset or emptied first, and nothing an earlier measurement left in an allocator counts: the bench
(`bench --gpu-peer`) and tests/test_gpu_prefill.py run it as a child process. The bound it is
held to is the cache plus twice the weights.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

TOKENS = 8192


def measure(spec: str, capacity: int | None, tokens: int) -> dict:
    import torch  # lazy, as everywhere in the bench; `model` sets the allocator's options first (model/__init__.py)

    from chatapp.bench.models import resolve
    from model.decode.generate import Generator
    from model.decode.prefill_graphs import weight_bytes
    from model.loading import LoadOptions

    def now(stage: str) -> dict:
        torch.cuda.synchronize()
        return {"stage": stage, "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated()}

    lm, _ = resolve(spec, LoadOptions(device="cuda", dtype=torch.bfloat16), None)
    stages = [now("load")]
    cache = lm.model.new_cache(min(lm.context_length, capacity or tokens + 128))
    gen = Generator(lm.model, cache, lm.tokenizer.vocab_size)
    stages.append(now("generator"))
    ids = torch.randint(100, min(lm.tokenizer.vocab_size, 30000), (tokens,),
                        generator=torch.Generator().manual_seed(3)).tolist()
    gen.prefill(ids)
    stages.append(now("prefill"))
    w, c = weight_bytes(lm.model), cache.bytes_allocated
    pg = gen.prefill_graphs
    return {"spec": spec, "tokens": tokens, "peak_bytes": torch.cuda.max_memory_reserved(),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(), "bound_bytes": c + 2 * w,
            "weight_bytes": w, "cache_bytes": c, "stages": stages,
            "buckets": sorted(pg.graphs) if pg is not None else [],
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}


def in_child(spec: str, capacity: int | None = None, tokens: int = TOKENS, timeout: float = 300) -> dict:
    """`measure` in a fresh Python process (this module's main); its JSON, or {"error": ...}."""
    cmd = [sys.executable, "-m", "chatapp.bench.gpu_memory", spec, "--tokens", str(tokens)]
    if capacity:
        cmd += ["--capacity", str(capacity)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        return {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chatapp.bench.gpu_memory")
    p.add_argument("spec")
    p.add_argument("--capacity", type=int, default=None)
    p.add_argument("--tokens", type=int, default=TOKENS)
    a = p.parse_args(argv)
    print(json.dumps(measure(a.spec, a.capacity, a.tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
