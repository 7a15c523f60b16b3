"""Architectures, weight loading, tokenizers and chat templates, and generation."""

import os

# torch's OpenMP threads sleep when they wait instead of spinning (libgomp reads this when torch
# loads, so it must be set before the first `import torch`). Spinning waiters collapse a prefill
# on a busy machine: pp256 fell from ~200 to ~12 tok/s on 2 threads here while other programs
# ran, because every op's barrier waited for a descheduled thread (docs/cpu-threads.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
