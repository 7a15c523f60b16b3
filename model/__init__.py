"""Architectures, weight loading, tokenizers and chat templates, and generation."""

import os

# torch's OpenMP threads sleep when they wait instead of spinning (libgomp reads this when torch
# loads, so it must be set before the first `import torch`). Spinning waiters collapse a prefill
# on a busy machine: pp256 fell from ~200 to ~12 tok/s on 2 threads here while other programs
# ran, because every op's barrier waited for a descheduled thread (docs/cpu-threads.md).
# Whether we set it, so a benchmark can run a peer (llama.cpp) as its own users run it.
OMP_WAIT_POLICY_DEFAULTED = "OMP_WAIT_POLICY" not in os.environ
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# CUDA's caching allocator grows one segment per stream and pool and maps it in 2 MB pages
# ("expandable segments") instead of cudaMalloc-ing a fixed segment per request size: blocks
# freed by a prefill's warm-up, a repacked weight or a longer chunk are reused or handed back
# instead of stranding memory (docs/gpu.md, "Prefill memory"). Read once, when CUDA starts; a
# user's own PYTORCH_CUDA_ALLOC_CONF wins.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
