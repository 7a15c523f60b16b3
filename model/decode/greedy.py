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

BLOCK = 4096   # logits a program scans: 64 programs for Gemma 3's 262,144 (one program took ~10 us)

_scratch: dict = {}


@triton.jit
def _greedy_kernel(logits_ptr, pos_ptr, tok_ptr, host_ptr, pmax_ptr, pidx_ptr, count_ptr, V,
                   BLOCK: tl.constexpr, NP: tl.constexpr, PDL: tl.constexpr):
    """Each program takes the first maximum of its block; the last one to finish (an atomic
    counter, as in decode_attention.py) takes the first of the blocks' maxima: torch.argmax."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pos = tl.load(pos_ptr)   # the position is not written by the step: read it before the wait
    if PDL:
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    tl.store(pmax_ptr + pid, tl.max(x, 0))
    tl.store(pidx_ptr + pid, pid * BLOCK + tl.argmax(x, 0))   # the first of equal maxima
    tl.debug_barrier()
    done = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    tl.debug_barrier()
    if done == tl.num_programs(0) - 1:
        p = tl.arange(0, NP)
        live = p < tl.num_programs(0)
        pm = tl.load(pmax_ptr + p, mask=live, other=float("-inf"), cache_modifier=".cg")
        pi = tl.load(pidx_ptr + p, mask=live, other=V, cache_modifier=".cg")
        best = tl.min(tl.where(pm == tl.max(pm, 0), pi, V), 0)   # an earlier block keeps a tie
        tl.store(tok_ptr, best.to(tl.int64))
        tl.store(host_ptr + pos, best.to(tl.int64))
        tl.atomic_xchg(count_ptr, 0)   # ready for the next call (and the next replay)


def greedy_pick(logits: torch.Tensor, pos: torch.Tensor, token: torch.Tensor, host: torch.Tensor,
                pdl: bool = False) -> None:
    """token[0] = host[pos[0]] = argmax(logits). `host` is pinned (or, on the CPU, plain) int64
    with a slot for every position the cache can hold."""
    v = logits.shape[-1]
    n = triton.cdiv(v, BLOCK)
    key = (logits.device, n)
    if key not in _scratch:  # allocated at the warm-up call, before any capture (model/decode/graphs.py)
        _scratch[key] = (torch.zeros(n, dtype=torch.float32, device=logits.device),
                         torch.zeros(n, dtype=torch.int32, device=logits.device),
                         torch.zeros(1, dtype=torch.int32, device=logits.device))
    pmax, pidx, count = _scratch[key]
    _greedy_kernel[(n,)](logits, pos, token, host, pmax, pidx, count, v, BLOCK=BLOCK,
                         NP=triton.next_power_of_2(n), PDL=pdl, num_warps=4, launch_pdl=pdl)
