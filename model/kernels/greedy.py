"""Greedy pick at the end of the captured decode step: argmax of the logits, written where
both sides need it.

As a separate sampler graph plus a device-to-host copy, picking the greedy token cost
~25 µs a token on the H200 (two graph launches' worth of gaps, torch's argmax and copy
kernels, a copy-engine transfer): 5% of a SmolLM2 token. Here one program scans the logits
right after the lm_head (PDL lets it launch early) and stores the token twice: into the
step's input buffer, so the next step can be launched before the host has looked, and into
pinned host memory at slot `cache_seqlens`, which the host reads after an event. Each
position has its own slot, so a step launched ahead cannot overwrite a token the host has
not read yet.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 8192


@triton.jit
def _greedy_kernel(logits_ptr, pos_ptr, tok_ptr, host_ptr, V, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pos = tl.load(pos_ptr)   # the position is not written by the step: read it before the wait
    if PDL:
        tl.extra.cuda.gdc_wait()
    offs = tl.arange(0, BLOCK)
    best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    best_i = tl.argmax(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    c = 0
    while c < V:
        x = tl.load(logits_ptr + c + offs, mask=c + offs < V, other=float("-inf")).to(tl.float32)
        m = tl.max(x, 0)
        i = tl.argmax(x, 0)          # the first of equal maxima, like torch.argmax
        better = m > best            # strictly: an earlier chunk keeps a tie
        best_i = tl.where(better, c + i, best_i)
        best = tl.where(better, m, best)
        c += BLOCK
    tl.store(tok_ptr, best_i.to(tl.int64))
    tl.store(host_ptr + pos, best_i.to(tl.int64))


def greedy_pick(logits: torch.Tensor, pos: torch.Tensor, tok: torch.Tensor, host: torch.Tensor,
                pdl: bool = False) -> None:
    """tok[0] = host[pos[0]] = argmax(logits). `host` is pinned (or, on the CPU, plain) int64
    with a slot for every position the cache can hold."""
    _greedy_kernel[(1,)](logits, pos, tok, host, logits.shape[-1], BLOCK=BLOCK, PDL=pdl, num_warps=16,
                         launch_pdl=pdl)
