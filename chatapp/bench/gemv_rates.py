"""Each weight format's GEMV read rate from memory, one thread, by thread CPU time; and the whole C
step's CPU time a token, for builds of the kernels compared in one process, alternating.

`python -m chatapp.bench.gemv_rates FILE.gguf [--build=FLAGS | --build DIR[:FLAGS]]... [--step DEPTH]`

Each `--build` is one build of model/cpu: extra compiler flags (`-DPF_FAR=0`), or a
folder holding another version of the sources (`git show OLD:model/cpu/qdecode.c` and
its includes, for a before/after), optionally with flags after a colon. Without `--build` it
measures this checkout's build.

Per build, the layers' matrices of one name (all `gate_proj`s, ...) are concatenated into one
matrix per format, so each is read from memory rather than from the 32 MB L3 (a 64 MB buffer is
read between runs as well); the rate is bytes / the best of 4 runs' thread CPU time. With
`--step DEPTH`, each build also runs the C step (one thread, the model's threads otherwise
idle) at that depth: CPU ms a token, and its logits' largest difference from the first build's.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import torch

from model.cpu import native
from model.cpu.qlinear import QLinear
from model.cpu.step import CpuStep
from model.loading import LoadOptions
from model.loading.dispatch import load_model

BASE = ["-O3", "-march=native", "-pthread"]


def build(spec: str) -> ctypes.CDLL:
    folder, _, flags = spec.partition(":") if not spec.startswith("-") else ("", "", spec)
    saved = native.SOURCE
    try:
        if folder:
            native.SOURCE = Path(folder) / "qdecode.c"
        lib = native.build(BASE + flags.split())
    finally:
        native.SOURCE = saved
    if lib is None:
        raise SystemExit(f"build {spec!r} failed")
    return lib


def matrices(model: torch.nn.Module) -> dict[str, tuple[native.QW, list[torch.Tensor], int]]:
    """name/kind -> (a QW over the concatenated rows, the tensors it points into, bytes)."""
    groups: dict[tuple[str, int], list[QLinear]] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, QLinear) and ".layers." in name:
            groups.setdefault((name.rsplit(".", 1)[-1], mod.qw().kind), []).append(mod)
    head = model.lm_head
    out = {"head": (head.qw(), [], sum(b.numel() * b.element_size() for b in head.buffers(recurse=False)))}
    for (name, kind), mods in groups.items():
        qw, keep = mods[0].qw(), []
        qw = native.QW.from_buffer_copy(qw)
        for field in ("q", "scale", "min"):
            if getattr(mods[0], field) is not None:
                keep.append(torch.cat([getattr(m, field) for m in mods]))
                setattr(qw, field, keep[-1].data_ptr())
        qw.rows = sum(m.out_features for m in mods)
        out[f"{name}/k{kind}"] = (qw, keep, sum(t.numel() * t.element_size() for t in keep))
    return out


def rates(lib: ctypes.CDLL, mats: dict, flush: torch.Tensor) -> dict[str, float]:
    res = {}
    for key, (qw, _, nbytes) in mats.items():
        x, y = torch.randn(qw.cols), torch.empty(qw.rows)
        best = float("inf")
        for _ in range(4):
            flush.sum()
            t = time.thread_time()
            lib.qd_gemv(ctypes.byref(qw), x.data_ptr(), y.data_ptr(), 1)
            best = min(best, time.thread_time() - t)
        res[key] = nbytes / best / 1e9
    return res


def step_ms(lib: ctypes.CDLL, step: CpuStep, depth: int, tokens: int = 24) -> tuple[float, torch.Tensor]:
    ctx = lib.qd_new(ctypes.byref(step.model))
    c, logits = step.cache, torch.empty_like(step.logits)
    args = (c.k_cache.data_ptr(), c.v_cache.data_ptr(), logits.data_ptr())
    try:
        for p in range(depth):   # the cache's contents don't change the timing
            lib.qd_step(ctx, 100 + p % 50, p, *args)
        t = time.process_time()
        for i in range(tokens):
            lib.qd_step(ctx, 100 + i, depth + i, *args)
        return (time.process_time() - t) / tokens * 1e3, logits
    finally:
        lib.qd_free(ctx)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--build", action="append", default=None, help="FLAGS, or DIR[:FLAGS] (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--step", type=int, default=None, metavar="DEPTH", help="also time the C step at DEPTH")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    lm = load_model(args.gguf, LoadOptions(quantized=True))
    specs = args.build or [""]
    libs = [build(s) for s in specs]
    mats, flush = matrices(lm.model), torch.ones(1 << 24)
    step = CpuStep(lm.model, lm.model.new_cache(args.step + 32), 1) if args.step is not None else None
    for r in range(args.rounds):
        first = None
        for spec, lib in zip(specs, libs, strict=True):
            line = " | ".join(f"{k} {mats[k][2] / 1e6:.0f} MB {v:.1f}" for k, v in rates(lib, mats, flush).items())
            if step is not None:
                ms, logits = step_ms(lib, step, args.step)
                first = logits if first is None else first
                line += f" || step {ms:.2f} ms CPU, logits vs first build {float((logits - first).abs().max()):.2g}"
            print(f"round {r + 1} [{spec or 'this checkout'}] GB/s: {line}", flush=True)


if __name__ == "__main__":
    main()
