"""How many CPU threads the model runs on: what this process may use, or `--threads N`.

The count is the CPUs this process may run on (its affinity mask), capped by a cgroup's CPU
quota (a container given 2 of 64 cores gets 2), never the machine's core count: more threads
than CPUs only queue behind each other. A busy machine is handled by the work itself, not by
the count: the C decode step hands its work out dynamically (model/cpu/pool.c) and
torch's OpenMP threads sleep when they wait (OMP_WAIT_POLICY=PASSIVE, set in model/__init__.py
before torch loads), so a thread the OS takes away delays nobody (docs/cpu-threads.md).
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def quota_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """The cgroup v2 CPU quota in whole CPUs (rounded up), or None when unlimited or unknown."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def available_cpus() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not Linux
        n = os.cpu_count() or 1
    q = quota_cpus()
    return max(1, min(n, q) if q else n)


def use_threads(n: int | None = None) -> int:
    """Set torch's intra-op threads (which the C step also takes) to n, else to OMP_NUM_THREADS
    when that is set, else to what this process can use; returns the count."""
    import torch

    if n is not None and n < 1:
        raise ValueError("--threads must be at least 1")
    env = os.environ.get("OMP_NUM_THREADS", "")
    count = n or (int(env) if env.isdigit() and int(env) > 0 else available_cpus())
    torch.set_num_threads(count)
    return count
