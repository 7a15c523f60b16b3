"""Split-KV attention for one query token over the (T, Hk, D) cache (flash-decoding), merged in-kernel.

Each program takes one KV head with its whole GQA group of query heads (padded to 16
rows so the two products run on tensor cores) and a contiguous range of key blocks, and
writes an fp32 partial output with its log-sum-exp. The last program of a KV head to
finish (an atomic counter of live splits tells it) merges the partials and writes the bf16
output, so no combine kernel runs. The merge is on every layer's critical path, so it has
two shapes: up to 20 live splits, all heads of the group together, two splits a step; more
than that, one head at a time with every split in one load (docs/gpu.md). The key count
comes from `cache_seqlens` on the device (the new token's K/V were written just before)
and the split count is fixed: safe in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _merge(o_ptr, lse_ptr, out_ptr, kvh, active, G: tl.constexpr, NH: tl.constexpr, D: tl.constexpr,
           SPLITS: tl.constexpr):
    """All live partials of each head in one load (not one round trip per split): the shape
    for many splits (SmolLM2 at 8k, 63 live: 534 µs a step, vs 728 in pairs)."""
    sp = tl.arange(0, SPLITS)
    live = sp < active
    offs_d = tl.arange(0, D)
    for g in tl.static_range(G):
        head = kvh * G + g
        lse = tl.load(lse_ptr + sp * NH + head, mask=live, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(o_ptr + (sp[:, None] * NH + head) * D + offs_d[None, :], mask=live[:, None], other=0.0,
                    cache_modifier=".cg")
        w = tl.exp(lse - tl.max(lse, 0))
        out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
        tl.store(out_ptr + head * D + offs_d, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _merge_few(o_ptr, lse_ptr, out_ptr, kvh, active, G: tl.constexpr, GM: tl.constexpr, NH: tl.constexpr,
               D: tl.constexpr):
    """The whole GQA group at once, as a running softmax over pairs of splits: [2, GM, D] tiles
    reduce within a thread, where a wide split axis would cross warps (SmolLM2 at 520 tokens,
    5 live splits: 458 -> 399 µs a step)."""
    rows = tl.arange(0, GM)
    hm = rows < G
    heads = kvh * G + rows
    offs_d = tl.arange(0, D)
    m = tl.full([GM], float("-inf"), tl.float32)
    lsum = tl.zeros([GM], tl.float32)
    acc = tl.zeros([GM, D], tl.float32)
    c = 0
    while c < active:
        sp = c + tl.arange(0, 2)
        ok = (sp < active)[:, None] & hm[None, :]
        lse = tl.load(lse_ptr + sp[:, None] * NH + heads[None, :], mask=ok, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(o_ptr + (sp[:, None, None] * NH + heads[None, :, None]) * D + offs_d[None, None, :],
                    mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
        m_new = tl.where(hm, tl.maximum(m, tl.max(lse, 0)), 0.0)   # padding rows: 0, not -inf - -inf
        w = tl.exp(lse - m_new[None, :])
        alpha = tl.exp(m - m_new)
        acc = acc * alpha[:, None] + tl.sum(o * w[:, :, None], 0)
        lsum = lsum * alpha + tl.sum(w, 0)
        m = m_new
        c += 2
    tl.store(out_ptr + heads[:, None] * D + offs_d[None, :], (acc / lsum[:, None]).to(out_ptr.dtype.element_ty),
             mask=hm[:, None])


@triton.jit
def _attend_block(q, k, v, nm, m, lsum, acc, qk_scale):
    """Online softmax over one block of keys (base 2)."""
    s = tl.dot(q, tl.trans(k)) * qk_scale
    s = tl.where(nm[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    lsum = lsum * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)   # P in the cache dtype, like FA
    return m_new, lsum, acc


@triton.jit
def _decode_attn_kernel(q_ptr, kc_ptr, vc_ptr, pos_ptr, o_ptr, lse_ptr, out_ptr, count_ptr, scale,
                        stride_t, stride_h,
                        G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                        SPLITS: tl.constexpr, NH: tl.constexpr, GM: tl.constexpr, WINDOW: tl.constexpr,
                        PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    kvh = tl.program_id(0)
    sp = tl.program_id(1)
    n = tl.load(pos_ptr) + 1                 # keys visible to the new token, itself included
    # A sliding window (WINDOW keys, the new one included) starts the key range at n - WINDOW: the
    # blocks tile [lo, n) exactly as they would tile a gathered copy of those keys.
    lo = n * 0
    if WINDOW > 0:
        lo = tl.maximum(n - WINDOW, 0)
    nblocks = tl.cdiv(n - lo, BLOCK_N)
    per = tl.cdiv(nblocks, SPLITS)
    active = tl.cdiv(nblocks, per)           # splits that own at least one block
    b0 = sp * per
    b1 = tl.minimum(b0 + per, nblocks)
    rows = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D)
    heads = kvh * G + rows
    hm = rows < G
    live = sp < active   # a split that owns no keys does nothing: the merge counts only live ones
    # Keys before the new token were written by earlier steps, so the first block streams in
    # before the wait; only the newest row (the previous kernel's write) is read after it.
    offs_n = lo + b0 * BLOCK_N + tl.arange(0, BLOCK_N)
    kv_off = offs_n[:, None] * stride_t + kvh * stride_h + offs_d[None, :]
    old = offs_n < tl.where(live, n - 1, 0)   # a comparison, not a &: the interpreter wants a bool mask
    k = tl.load(kc_ptr + kv_off, mask=old[:, None], other=0.0)
    v = tl.load(vc_ptr + kv_off, mask=old[:, None], other=0.0)
    if live:
        # Only live programs wait: split 0 is always live, so this grid still cannot complete
        # before the one it depends on, and the idle splits of a short context (165 of 192 for
        # SmolLM2 at 512 tokens) leave at once instead of holding their SM slots until then.
        if PDL:
            tl.extra.cuda.gdc_wait()
        newest = offs_n == n - 1
        k = tl.where(newest[:, None], tl.load(kc_ptr + kv_off, mask=newest[:, None], other=0.0), k)
        v = tl.where(newest[:, None], tl.load(vc_ptr + kv_off, mask=newest[:, None], other=0.0), v)
        q = tl.load(q_ptr + heads[:, None] * D + offs_d[None, :], mask=hm[:, None], other=0.0)
        m = tl.full([G_PAD], float("-inf"), tl.float32)
        lsum = tl.zeros([G_PAD], tl.float32)
        acc = tl.zeros([G_PAD, D], tl.float32)
        qk_scale = scale * 1.4426950408889634   # softmax in base 2
        m, lsum, acc = _attend_block(q, k, v, offs_n < n, m, lsum, acc, qk_scale)
        # A while loop, not range(): Triton software-pipelines a range() loop that feeds tl.dot
        # (staging K/V through shared memory), which cost 8% of a d20 step at 2k tokens for
        # splits of 2-3 blocks; and the CPU interpreter's range() cannot take a loaded bound.
        b = b0 + 1
        while b < b1:
            offs_b = lo + b * BLOCK_N + tl.arange(0, BLOCK_N)
            nm = offs_b < n
            off = offs_b[:, None] * stride_t + kvh * stride_h + offs_d[None, :]
            kb = tl.load(kc_ptr + off, mask=nm[:, None], other=0.0)
            vb = tl.load(vc_ptr + off, mask=nm[:, None], other=0.0)
            m, lsum, acc = _attend_block(q, kb, vb, nm, m, lsum, acc, qk_scale)
            b += 1
        if active == 1:  # one split saw every key: its result is final, nothing to merge
            tl.store(out_ptr + heads[:, None] * D + offs_d[None, :],
                     (acc / lsum[:, None]).to(out_ptr.dtype.element_ty), mask=hm[:, None])
        else:
            lse = m / 1.4426950408889634 + tl.log(lsum)
            tl.store(o_ptr + (sp * NH + heads[:, None]) * D + offs_d[None, :], acc / lsum[:, None],
                     mask=hm[:, None])
            tl.store(lse_ptr + sp * NH + heads, lse, mask=hm)
            # Each live split checks in; the last one of this KV head merges. The barrier makes all
            # of this program's stores part of what the release (acq_rel) publishes.
            tl.debug_barrier()
            done = tl.atomic_add(count_ptr + kvh, 1, sem="acq_rel")
            tl.debug_barrier()
            if done == active - 1:
                few = active <= 20
                if G == 1:       # MHA gains nothing from the group-wide merge (d20 at 512: +3%)
                    few = False
                if few:
                    _merge_few(o_ptr, lse_ptr, out_ptr, kvh, active, G, GM, NH, D)
                else:
                    _merge(o_ptr, lse_ptr, out_ptr, kvh, active, G, NH, D, SPLITS)
                tl.atomic_xchg(count_ptr + kvh, 0)   # ready for the next call (and the next replay)


def default_splits(n_kv: int, capacity: int) -> int:
    """Enough programs to keep the SMs busy at long contexts; the merge reads only live splits."""
    s = 1
    while s < 64 and n_kv * s < 256 and s * 128 < capacity:
        s *= 2
    return s


class DecodeAttention:
    """Buffers for one model's decode attention: partials, their LSEs and the per-head counters."""

    def __init__(self, n_head: int, n_kv: int, head_dim: int, capacity: int, device, splits: int = 0,
                 window: int = 0):
        """`window` > 0: each query sees only its last `window` keys (itself included), read in place
        from the cache; `capacity` is then the most keys a query sees (the window, if smaller)."""
        self.window = window
        # a power of two: the merge loads every split's partials as one arange
        self.splits = triton.next_power_of_2(splits) if splits else default_splits(n_kv, capacity)
        self.o = torch.zeros(self.splits, n_head, head_dim, dtype=torch.float32, device=device)
        self.lse = torch.zeros(self.splits, n_head, dtype=torch.float32, device=device)
        self.count = torch.zeros(n_kv, dtype=torch.int32, device=device)
        self.n_head, self.n_kv, self.hd = n_head, n_kv, head_dim
        # Keys a block: 128 x D K and V tiles up to D = 64 (SmolLM2 at 8k: 600 -> 536 µs a step),
        # 64 beyond, where a 128-row tile of D = 128 spills (d20 at 512: 539 -> 625 µs).
        self.block_n = 128 if head_dim <= 64 else 64

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                 out: torch.Tensor, scale: float | None = None, pdl: bool = False) -> torch.Tensor:
        """q: (Hq*D,) or (Hq, D); caches: one layer, (T, Hk, D) with an optional leading 1;
        pos: int32 (1,) = index of the newest key. Writes out (Hq*D,) in the cache dtype."""
        g = self.n_head // self.n_kv
        _decode_attn_kernel[(self.n_kv, self.splits)](
            q, k_cache, v_cache, pos, self.o, self.lse, out, self.count,
            scale if scale is not None else self.hd ** -0.5, k_cache.stride(-3), k_cache.stride(-2),
            G=g, G_PAD=max(16, triton.next_power_of_2(g)), D=self.hd, BLOCK_N=self.block_n, SPLITS=self.splits,
            NH=self.n_head, GM=triton.next_power_of_2(g), WINDOW=self.window, PDL=pdl, num_warps=4, launch_pdl=pdl)
        return out
