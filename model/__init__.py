"""Architectures, weight loading, tokenizers and chat templates, and generation."""

import os

# torch's OpenMP threads sleep when they wait instead of spinning (libgomp reads this when torch
# loads, so it must be set before the first `import torch`). Spinning waiters collapse a prefill
# on a busy machine: pp256 fell from ~200 to ~12 tok/s on 2 threads here while other programs
# ran, because every op's barrier waited for a descheduled thread (docs/cpu-threads.md).
# Whether we set it, so a benchmark can run a peer (llama.cpp) as its own users run it.
OMP_WAIT_POLICY_DEFAULTED = "OMP_WAIT_POLICY" not in os.environ
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
