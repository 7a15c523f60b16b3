"""The whole Llama decode step as one persistent Triton kernel: one launch a token.

With one kernel per stage, each of the ~150 dependencies in a step costs a kernel boundary
(the grid drains, completes, and the next grid's wait releases): about 3 µs each on the
H200 even with PDL, which is most of a SmolLM2 token (docs/gpu.md). Here a fixed grid of
programs, all resident at once, walks every layer's stages itself and meets at a grid
barrier (an atomic counter in L2) wherever a stage needs the previous stage's whole output:

    per layer: norm+QKV+rotary+cache write | split-KV attention (last split merges)
               | o_proj+residual | norm+gate/up+SwiGLU | down+residual
    then:      final norm + lm_head

Each stage hands its units (row blocks, or (KV head, split) pairs) to the programs round
robin. The maths and the bf16 rounding points are those of the per-stage kernels in
gemv.py, qkv_rope.py and decode_attention.py. Two rules keep the barrier sound:

- a program's writes reach L2 before its arrival (a CTA barrier, then a release atomic),
  and it reads after the barrier only with `.cg` loads, which skip the SM's L1, where a
  line from an earlier layer could still sit;
- the grid never has more programs than the GPU holds at once (the host sizes it from the
  compiled kernel's registers), or the first barrier would wait forever. A bounded spin
  turns such a bug into a flagged error instead of a hung GPU.

On the CPU (TRITON_INTERPRET=1) programs run one after another, so only a one-program
grid can pass a barrier: that is how the tests check the maths without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvcache import KVCache
from model.kernels.decode_attention import _attend_block, _merge, default_splits
from model.kernels.gemv import load_rows
from model.kernels.llama_step import pack_rows, point_rows
from model.llama import Llama


@triton.jit
def _act(ptr, n: tl.constexpr, NP: tl.constexpr):
    """A vector another program wrote in this launch: read through L2, never a stale L1 line."""
    c = tl.arange(0, NP)
    return tl.load(ptr + c, mask=c < n, other=0.0, cache_modifier=".cg").to(tl.float32)


@triton.jit
def _vec(ptr, n: tl.constexpr, NP: tl.constexpr):
    c = tl.arange(0, NP)
    return tl.load(ptr + c, mask=c < n, other=0.0).to(tl.float32)


@triton.jit
def _ld_acquire(ptr, ASM: tl.constexpr):
    """A plain acquire load of a counter: polling with atomics would queue behind the arrivals."""
    if ASM:
        return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr],
                                         dtype=tl.int32, is_pure=False, pack=1)
    else:   # the interpreter has no PTX
        return tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def _grid_sync(bar_ptr, target, ok, ASM: tl.constexpr):
    """Wait until the arrival counter reaches `target` (every program, once more). Returns False,
    and flags bar[2], if it gave up; after that the launch stops waiting and its output is garbage."""
    tl.debug_barrier()                        # the whole CTA's stores come before the arrival
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = _ld_acquire(bar_ptr, ASM)
    tries = 0
    while ok & (seen < target) & (tries < 4194304):   # seconds: far past any real wait
        seen = _ld_acquire(bar_ptr, ASM)
        tries += 1
    if seen < target:
        tl.atomic_xchg(bar_ptr + 2, 1)
    tl.debug_barrier()
    return seen >= target


# Each stage is split in two: `*_first` loads the weights of this program's first unit and runs
# before the barrier (nothing in the step writes weights), the stage itself runs after it. With
# a grid the size of the GPU most stages have one unit a program, so the weight stream overlaps
# the barrier, as it overlaps `gdc_wait` in the per-stage kernels.

@triton.jit
def _qkv_first(w_ptr, pid, H: tl.constexpr, HP: tl.constexpr, HQ: tl.constexpr, HK: tl.constexpr,
               D: tl.constexpr, BP: tl.constexpr):
    half: tl.constexpr = D // 2
    NJ: tl.constexpr = half // BP
    h = pid // NJ
    pairs = (pid % NJ) * BP + tl.arange(0, BP)
    ok = (pairs < half) & (h < HQ + 2 * HK)
    r1 = h * D + pairs
    return load_rows(w_ptr, r1, ok, H, HP), load_rows(w_ptr, r1 + half, ok, H, HP)


@triton.jit
def _qkv_stage(w1_0, w2_0, x_ptr, nw_ptr, w_ptr, cos_ptr, sin_ptr, pos, q_ptr, kc_ptr, vc_ptr, eps,
               stride_t, stride_h, pid, NPROG: tl.constexpr, H: tl.constexpr, HP: tl.constexpr,
               HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, BP: tl.constexpr):
    """Units: BP rotary pairs (rows i, i + D/2) of one head slot: queries, keys, then values."""
    half: tl.constexpr = D // 2
    NJ: tl.constexpr = half // BP
    x = _act(x_ptr, H, HP)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / H + eps)
    x = x * _vec(nw_ptr, H, HP)
    dt = w_ptr.dtype.element_ty
    w1, w2 = w1_0, w2_0
    for t in range(tl.cdiv((HQ + 2 * HK) * NJ, NPROG)):
        u = t * NPROG + pid
        if t > 0:
            w1, w2 = _qkv_first(w_ptr, u, H, HP, HQ, HK, D, BP)
        h = u // NJ
        pairs = (u % NJ) * BP + tl.arange(0, BP)
        y1 = (tl.sum(w1.to(tl.float32) * x[None, :], 1) * rstd).to(dt).to(tl.float32)
        y2 = (tl.sum(w2.to(tl.float32) * x[None, :], 1) * rstd).to(dt).to(tl.float32)
        if h >= HQ + 2 * HK:   # the last round may run past the last unit
            pass
        elif h < HQ + HK:
            c = tl.load(cos_ptr + pos * half + pairs)
            s = tl.load(sin_ptr + pos * half + pairs)
            o1 = (y1 * c - y2 * s).to(dt)
            o2 = (y2 * c + y1 * s).to(dt)
            if h < HQ:
                tl.store(q_ptr + h * D + pairs, o1)
                tl.store(q_ptr + h * D + half + pairs, o2)
            else:
                base = kc_ptr + pos * stride_t + (h - HQ) * stride_h
                tl.store(base + pairs, o1)
                tl.store(base + half + pairs, o2)
        else:
            base = vc_ptr + pos * stride_t + (h - HQ - HK) * stride_h
            tl.store(base + pairs, y1.to(dt))
            tl.store(base + half + pairs, y2.to(dt))


@triton.jit
def _split_layout(pos, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    n = pos + 1                    # keys visible to the new token, itself included
    nblocks = tl.cdiv(n, BLOCK_N)
    per = tl.cdiv(nblocks, SPLITS)
    return n, nblocks, per, tl.cdiv(nblocks, per)   # the last: splits that own at least one block


@triton.jit
def _attn_first(kc_ptr, vc_ptr, pos, u, stride_t, stride_h, D: tl.constexpr, HK: tl.constexpr,
                BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    """The first key block of unit u, minus the newest row (this step writes it)."""
    n, nblocks, per, active = _split_layout(pos, BLOCK_N, SPLITS)
    kvh = u // active
    offs_n = (u % active) * per * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    off = offs_n[:, None] * stride_t + kvh * stride_h + offs_d[None, :]
    old = ((offs_n < n - 1) & (kvh < HK))[:, None]
    return tl.load(kc_ptr + off, mask=old, other=0.0), tl.load(vc_ptr + off, mask=old, other=0.0)


@triton.jit
def _attn_stage(k0, v0, q_ptr, kc_ptr, vc_ptr, pos, o_ptr, lse_ptr, out_ptr, count_ptr, scale, stride_t,
                stride_h, pid, NPROG: tl.constexpr, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                G_PAD: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    """Units: (KV head, split) pairs; the last live split of a KV head merges (decode_attention.py)."""
    G: tl.constexpr = HQ // HK
    n, nblocks, per, active = _split_layout(pos, BLOCK_N, SPLITS)
    rows = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D)
    hm = rows < G
    qk_scale = scale * 1.4426950408889634
    k, v = k0, v0
    for t in range(tl.cdiv(HK * SPLITS, NPROG)):
        u = t * NPROG + pid
        if u < HK * active:
            if t > 0:
                k, v = _attn_first(kc_ptr, vc_ptr, pos, u, stride_t, stride_h, D, HK, BLOCK_N, SPLITS)
            kvh = u // active
            sp = u % active
            heads = kvh * G + rows
            b = sp * per
            offs_n = b * BLOCK_N + tl.arange(0, BLOCK_N)
            off = offs_n[:, None] * stride_t + kvh * stride_h + offs_d[None, :]
            newest = (offs_n == n - 1)[:, None]
            k = tl.where(newest, tl.load(kc_ptr + off, mask=newest, other=0.0, cache_modifier=".cg"), k)
            v = tl.where(newest, tl.load(vc_ptr + off, mask=newest, other=0.0, cache_modifier=".cg"), v)
            q = tl.load(q_ptr + heads[:, None] * D + offs_d[None, :], mask=hm[:, None], other=0.0,
                        cache_modifier=".cg")
            m = tl.full([G_PAD], float("-inf"), tl.float32)
            lsum = tl.zeros([G_PAD], tl.float32)
            acc = tl.zeros([G_PAD, D], tl.float32)
            m, lsum, acc = _attend_block(q, k, v, offs_n < n, m, lsum, acc, qk_scale)
            b += 1
            end = tl.minimum(sp * per + per, nblocks)
            while b < end:   # a while loop, not range(): the interpreter's range() wants Python ints
                offs_n = b * BLOCK_N + tl.arange(0, BLOCK_N)
                nm = offs_n < n
                off = offs_n[:, None] * stride_t + kvh * stride_h + offs_d[None, :]
                kb = tl.load(kc_ptr + off, mask=nm[:, None], other=0.0, cache_modifier=".cg")
                vb = tl.load(vc_ptr + off, mask=nm[:, None], other=0.0, cache_modifier=".cg")
                m, lsum, acc = _attend_block(q, kb, vb, nm, m, lsum, acc, qk_scale)
                b += 1
            if active == 1:
                tl.store(out_ptr + heads[:, None] * D + offs_d[None, :],
                         (acc / lsum[:, None]).to(out_ptr.dtype.element_ty), mask=hm[:, None])
            else:
                lse = m / 1.4426950408889634 + tl.log(lsum)
                tl.store(o_ptr + (sp * HQ + heads[:, None]) * D + offs_d[None, :], acc / lsum[:, None],
                         mask=hm[:, None])
                tl.store(lse_ptr + sp * HQ + heads, lse, mask=hm)
                tl.debug_barrier()
                done = tl.atomic_add(count_ptr + kvh, 1, sem="acq_rel", scope="gpu")
                tl.debug_barrier()
                if done == active - 1:
                    _merge(o_ptr, lse_ptr, out_ptr, kvh, active, G, HQ, D, SPLITS)
                    tl.atomic_xchg(count_ptr + kvh, 0)


@triton.jit
def _rows_first(w_ptr, u, N, K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr, SWIGLU: tl.constexpr):
    """Unit u's rows of W; for SwiGLU also the up rows, N below (else the same tile again, unused)."""
    rows = u * BN + tl.arange(0, BN)
    rm = rows < N
    w = load_rows(w_ptr, rows, rm, K, KP)
    if SWIGLU:
        return w, load_rows(w_ptr, rows + N, rm, K, KP)
    else:
        return w, w


@triton.jit
def _gemv_residual_stage(w0, w_ptr, a_ptr, x_ptr, pid, NPROG: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                         KP: tl.constexpr, BN: tl.constexpr):
    """x[rows] += W[rows] @ a, rounded like `x + linear(a)`."""
    a = _act(a_ptr, K, KP)
    dt = w_ptr.dtype.element_ty
    w = w0
    for t in range(tl.cdiv(tl.cdiv(N, BN), NPROG)):
        u = t * NPROG + pid
        if t > 0:
            w, _ = _rows_first(w_ptr, u, N, K, KP, BN, False)
        rows = u * BN + tl.arange(0, BN)
        rm = rows < N
        y = tl.sum(w.to(tl.float32) * a[None, :], 1).to(dt).to(tl.float32)
        r = tl.load(x_ptr + rows, mask=rm, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(x_ptr + rows, (r + y).to(dt), mask=rm)


@triton.jit
def _norm_gemv_stage(w0, u0, x_ptr, nw_ptr, w_ptr, out_ptr, eps, pid, NPROG: tl.constexpr, N, K: tl.constexpr,
                     KP: tl.constexpr, BN: tl.constexpr, SWIGLU: tl.constexpr):
    """out[rows] = RMSNorm(x) @ W[rows].T, or SiLU(gate) * up with the up rows N below."""
    x = _act(x_ptr, K, KP)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / K + eps)
    x = x * _vec(nw_ptr, K, KP)
    dt = w_ptr.dtype.element_ty
    w, wu = w0, u0
    for t in range(tl.cdiv(tl.cdiv(N, BN), NPROG)):
        u = t * NPROG + pid
        if t > 0:
            w, wu = _rows_first(w_ptr, u, N, K, KP, BN, SWIGLU)
        rows = u * BN + tl.arange(0, BN)
        rm = rows < N
        y = (tl.sum(w.to(tl.float32) * x[None, :], 1) * rstd).to(dt).to(tl.float32)
        if SWIGLU:
            up = (tl.sum(wu.to(tl.float32) * x[None, :], 1) * rstd).to(dt).to(tl.float32)
            y = (y / (1.0 + tl.exp(-y))).to(dt).to(tl.float32) * up
        tl.store(out_ptr + rows, y.to(dt).to(out_ptr.dtype.element_ty), mask=rm)


@triton.jit
def _llama_step_kernel(
        tok_ptr, emb_ptr, pos_ptr, x_ptr, q_ptr, attn_ptr, h_ptr, logits_ptr, bar_ptr,
        ln1_ptr, wqkv_ptr, wo_ptr, ln2_ptr, wgu_ptr, wdn_ptr, lnf_ptr, lm_ptr,
        kc_ptr, vc_ptr, cos_ptr, sin_ptr, o_ptr, lse_ptr, count_ptr,
        eps, scale, stride_l, stride_t, stride_h, L: tl.constexpr, V: tl.constexpr,
        H: tl.constexpr, HP: tl.constexpr, F: tl.constexpr, FP: tl.constexpr,
        HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, QDP: tl.constexpr, G_PAD: tl.constexpr,
        BP: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_DN: tl.constexpr, BN_LM: tl.constexpr,
        SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, NPROG: tl.constexpr, ASM: tl.constexpr):
    pid = tl.program_id(0)
    pos = tl.load(pos_ptr)
    emb_row = emb_ptr + tl.load(tok_ptr) * H
    if pid == 0:   # the residual stream starts as the token's embedding (read after the first barrier)
        c = tl.arange(0, HP)
        tl.store(x_ptr + c, tl.load(emb_row + c, mask=c < H), mask=c < H)
    NQKV: tl.constexpr = (HQ + 2 * HK) * D
    QD: tl.constexpr = HQ * D
    syncs = 0
    ok = pid >= 0
    w1, w2 = _qkv_first(wqkv_ptr, pid, H, HP, HQ, HK, D, BP)
    for i in range(L):
        li = tl.cast(i, tl.int64)   # layer offsets pass 2**31 elements on d32-sized models
        kc = kc_ptr + li * stride_l
        vc = vc_ptr + li * stride_l
        src = x_ptr
        if i == 0:
            src = emb_row   # layer 0 reads the embedding itself: no barrier before it
        _qkv_stage(w1, w2, src, ln1_ptr + li * H, wqkv_ptr + li * (NQKV * H), cos_ptr, sin_ptr, pos, q_ptr,
                   kc, vc, eps, stride_t, stride_h, pid, NPROG, H, HP, HQ, HK, D, BP)
        k0, v0 = _attn_first(kc, vc, pos, pid, stride_t, stride_h, D, HK, BLOCK_N, SPLITS)
        syncs += 1
        ok = _grid_sync(bar_ptr, syncs * NPROG, ok, ASM)
        _attn_stage(k0, v0, q_ptr, kc, vc, pos, o_ptr, lse_ptr, attn_ptr, count_ptr, scale, stride_t, stride_h,
                    pid, NPROG, HQ, HK, D, G_PAD, BLOCK_N, SPLITS)
        wo = wo_ptr + li * (H * QD)
        w0, _ = _rows_first(wo, pid, H, QD, QDP, BN_O, False)
        syncs += 1
        ok = _grid_sync(bar_ptr, syncs * NPROG, ok, ASM)
        _gemv_residual_stage(w0, wo, attn_ptr, x_ptr, pid, NPROG, H, QD, QDP, BN_O)
        wgu = wgu_ptr + li * (2 * F * H)
        g0, u0 = _rows_first(wgu, pid, F, H, HP, BN_GU, True)
        syncs += 1
        ok = _grid_sync(bar_ptr, syncs * NPROG, ok, ASM)
        _norm_gemv_stage(g0, u0, x_ptr, ln2_ptr + li * H, wgu, h_ptr, eps, pid, NPROG, F, H, HP, BN_GU, True)
        wdn = wdn_ptr + li * (H * F)
        d0, _ = _rows_first(wdn, pid, H, F, FP, BN_DN, False)
        syncs += 1
        ok = _grid_sync(bar_ptr, syncs * NPROG, ok, ASM)
        _gemv_residual_stage(d0, wdn, h_ptr, x_ptr, pid, NPROG, H, F, FP, BN_DN)
        nxt = tl.cast(tl.minimum(i + 1, L - 1), tl.int64)   # the last layer re-reads its own: harmless
        w1, w2 = _qkv_first(wqkv_ptr + nxt * (NQKV * H), pid, H, HP, HQ, HK, D, BP)
        syncs += 1
        ok = _grid_sync(bar_ptr, syncs * NPROG, ok, ASM)
    l0, _ = _rows_first(lm_ptr, pid, V, H, HP, BN_LM, False)
    _norm_gemv_stage(l0, l0, x_ptr, lnf_ptr, lm_ptr, logits_ptr, eps, pid, NPROG, V, H, HP, BN_LM, False)
    # The last program out resets the counters for the next launch: by then every program has
    # passed every barrier, so no one still polls them.
    tl.debug_barrier()
    gone = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if gone == NPROG - 1:
        tl.atomic_xchg(bar_ptr, 0)
        tl.atomic_xchg(bar_ptr + 1, 0)


def _rows_per_unit(n: int, k: int, units: int, mats: int = 1, tile: int = 16384) -> int:
    """Rows a unit holds: as many as fit `tile` padded elements, halved until every program has one."""
    kp = triton.next_power_of_2(k)
    bn = 1
    while bn * 2 * kp * mats <= tile:
        bn *= 2
    while bn > 1 and triton.cdiv(n, bn) < units:
        bn //= 2
    return bn


def stack_layers(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One contiguous (L, ...) copy of per-layer weights, so the kernel finds layer i at a fixed
    stride. Callers point the modules at its slices, so the model keeps one copy."""
    return torch.stack([t.detach() for t in tensors]).contiguous()


class LlamaPersistentStep:
    """Same contract as LlamaFusedStep: feed `tok` at cache_seqlens, write `logits`. One launch."""

    attn_name = "triton"

    def __init__(self, model: Llama, cache: KVCache, splits: int = 0, programs: int = 0):
        cfg = model.config
        self.model, self.cache, self.cfg = model, cache, cfg
        dev, dt = cache.device, cache.dtype
        hq, hk, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        layers = model.model.layers
        for layer in layers:   # gate/up and q/k/v rows packed, as the per-stage kernels use them
            a, mlp = layer.self_attn, layer.mlp
            pack_rows([a.q_proj, a.k_proj, a.v_proj])
            pack_rows([mlp.gate_proj, mlp.up_proj])
        self.ln1 = _stack_params([layer.input_layernorm.weight for layer in layers])
        self.ln2 = _stack_params([layer.post_attention_layernorm.weight for layer in layers])
        self.wo = _stack_params([layer.self_attn.o_proj.weight for layer in layers])
        self.wdn = _stack_params([layer.mlp.down_proj.weight for layer in layers])
        self.wqkv = stack_layers([layer.self_attn.q_proj._packed_rows for layer in layers])
        self.wgu = stack_layers([layer.mlp.gate_proj._packed_rows for layer in layers])
        for layer, wqkv, wgu in zip(layers, self.wqkv, self.wgu, strict=True):
            point_rows([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], wqkv)
            point_rows([layer.mlp.gate_proj, layer.mlp.up_proj], wgu)
        self.cos, self.sin = model.rope(dev)
        if cache.capacity > self.cos.shape[0]:
            raise ValueError(f"cache capacity {cache.capacity} > rotary table {self.cos.shape[0]}")
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.x = torch.zeros(cfg.hidden_size, dtype=dt, device=dev)
        self.q = torch.zeros(hq * d, dtype=dt, device=dev)
        self.attn_out = torch.zeros(hq * d, dtype=dt, device=dev)
        self.h = torch.zeros(cfg.intermediate_size, dtype=dt, device=dev)
        self.logits = torch.zeros(cfg.vocab_size, dtype=torch.float32, device=dev)
        self.bar = torch.zeros(3, dtype=torch.int32, device=dev)   # arrivals, exits, stuck flag
        self.programs = programs or _resident_programs(dev)
        s = triton.next_power_of_2(splits) if splits else max(default_splits(hk, cache.capacity),
                                                              _pow2_below(self.programs // hk))
        self.splits = min(s, triton.next_power_of_2(triton.cdiv(cache.capacity, 64)))
        self.o = torch.zeros(self.splits, hq, d, dtype=torch.float32, device=dev)
        self.lse = torch.zeros(self.splits, hq, dtype=torch.float32, device=dev)
        self.count = torch.zeros(hk, dtype=torch.int32, device=dev)
        h, i, p = cfg.hidden_size, cfg.intermediate_size, self.programs
        half = d // 2
        bp = half
        while bp > 1 and ((hq + 2 * hk) * (half // bp) < p or bp * 2 * triton.next_power_of_2(h) > 16384):
            bp //= 2
        self.meta = dict(L=cfg.num_hidden_layers, V=cfg.vocab_size,
                         H=h, HP=triton.next_power_of_2(h), F=i, FP=triton.next_power_of_2(i), HQ=hq, HK=hk, D=d,
                         QDP=triton.next_power_of_2(hq * d), G_PAD=max(16, triton.next_power_of_2(hq // hk)),
                         BP=bp, BN_O=_rows_per_unit(h, hq * d, p), BN_GU=_rows_per_unit(i, h, p, 2),
                         BN_DN=_rows_per_unit(h, i, p), BN_LM=_rows_per_unit(cfg.vocab_size, h, p),
                         SPLITS=self.splits, BLOCK_N=64, NPROG=self.programs,
                         ASM=dev.type == "cuda")
        self.name = "persistent+triton"

    def __call__(self) -> torch.Tensor:
        m, c, cfg = self.model, self.cache, self.cfg
        _llama_step_kernel[(self.programs,)](
            self.tok, m.model.embed_tokens.weight, c.cache_seqlens, self.x, self.q, self.attn_out, self.h,
            self.logits, self.bar, self.ln1, self.wqkv, self.wo, self.ln2, self.wgu, self.wdn,
            m.model.norm.weight, m.lm_head.weight, c.k_cache, c.v_cache, self.cos, self.sin,
            self.o, self.lse, self.count, cfg.rms_norm_eps, cfg.head_dim ** -0.5,
            c.k_cache.stride(0), c.k_cache.stride(2), c.k_cache.stride(3), **self.meta, num_warps=4)
        return self.logits

    def stuck(self) -> bool:
        """True if a barrier ever gave up waiting (a grid larger than the GPU can hold)."""
        return bool(self.bar[2])


def _stack_params(params: list[torch.nn.Parameter]) -> torch.Tensor:
    stacked = stack_layers(params)
    for p, t in zip(params, stacked, strict=True):
        p.data = t
    return stacked


def _pow2_below(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _resident_programs(device: torch.device) -> int:
    """Two 4-warp programs per SM: 2 x 128 threads x 255 registers always fit in 64K registers,
    and the kernel's shared memory (one 16 x 64 attention tile) is far below the SM's."""
    if device.type != "cuda":
        return 1
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count
