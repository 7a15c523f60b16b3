"""Where a decode token's time goes: GPU time of the captured step, and its kernels.

`graph_step_us` replays the captured step back to back (no host in the loop): the GPU's own
time per token, to set against the wall time per token that the decode table reports.
`kernel_table` runs the same step outside the graph under the profiler and sums each
kernel's time per token, so the count of launches and the slow ones are plain to see.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile


def graph_step_us(graphs, reps: int = 200) -> float:
    """Mean GPU time of `reps` back-to-back replays at one position, in µs (the step does not
    advance the cache, so every replay does the same work)."""
    if graphs.cache.free < 1:
        return float("nan")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graphs.step_graph.replay()  # warm
    start.record()
    for _ in range(reps):
        graphs.step_graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / reps


def kernel_table(graphs, steps: int = 5, top: int = 12, step=None) -> list[dict]:
    """Per-token kernel time by kernel name (eager launches of the captured step's code);
    `step`: another capturable callable (a prefill bucket's step), per call."""
    step = step or graphs.step
    with torch.inference_mode():
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            name = ev.name[:60]
            per[name][0] += 1
            per[name][1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    rows = [{"kernel": k, "per_token": n / steps, "us_per_token": t / steps} for k, (n, t) in per.items()]
    rows.sort(key=lambda r: -r["us_per_token"])
    total = {"kernel": "TOTAL", "per_token": sum(r["per_token"] for r in rows),
             "us_per_token": sum(r["us_per_token"] for r in rows)}
    return [total] + rows[:top]


def print_profile(name: str, gpu_us: float, rows: list[dict]) -> None:
    print(f"profile {name}: graph replay {gpu_us:.1f} µs/token of GPU time; kernels per token:")
    for r in rows:
        print(f"  {r['kernel']:<60} {r['per_token']:6.1f}x {r['us_per_token']:9.1f} µs")


def prefill_bucket_profile(gen, bucket: int = 512, reps: int = 50) -> dict:
    """A prefill bucket's GPU time (its graph replayed back to back on an empty cache: the step
    does not advance it) and its kernels, per replay."""
    pg = gen.prefill_graphs
    gen.cache.reset()
    gen.forget()
    gen.prefill([1000] * bucket)   # captures the bucket
    gen.cache.reset()
    graph = pg.graphs[bucket]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    rows = kernel_table(None, steps=3, top=10, step=pg.steps[bucket])
    return {"bucket": bucket, "step": pg.kind, "replay_us": start.elapsed_time(end) * 1000 / reps, "kernels": rows}


def print_prefill_profile(p: dict) -> None:
    print(f"prefill bucket {p['bucket']} ({p['step']} step): graph replay {p['replay_us']:.0f} µs of GPU time; "
          "kernels per replay (eager launches of the same step):")
    for r in p["kernels"]:
        print(f"  {r['kernel']:<60} {r['per_token']:6.1f}x {r['us_per_token']:9.1f} µs")
