"""The AMX prefill (model/cpu/prefill_bf16.py): its bf16 weights are our exact fp32 dequantization
rounded to nearest even, bit for bit, on every block format and thread count; its GEMM is x W^T
within bf16's three roundings; its GLU pairs the product's columns as the gate and the up and
applies the model's activation; a prefill through it and then the C decode step stay within
bf16's error of the fp32 reference over two turns on one cache; and it is the default prefill
exactly where the CPU has a bf16 GEMM (AMX, or AVX-512 BF16 for ours), for chunks of at least
bf16_min_tokens() tokens (288 on AMX, 64 on VDPBF16PS).
NANOCHAT_QGEMM=bf16 runs it on any CPU (oneDNN without AMX), so CI tests it wherever it runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf import quants
from helpers import packed_linear, random_blocks, spied_pair

from model.cpu import native, prefill_attn, prefill_bf16, prefill_gemm
from model.cpu.file_blocks import FILE_TYPES, as_rows
from model.cpu.qlinear import QLinear

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"CPU kernels unavailable: {native.why_not()}")
U = 2.0 ** -8   # bf16's unit roundoff (8 significant bits)


def linear(kind: str, rng) -> tuple[QLinear, np.ndarray]:
    if kind in FILE_TYPES:
        raw = random_blocks(kind, 40, 512, rng)
        w = quants.dequantize(raw, Q[kind]).reshape(40, 512).astype(np.float32)
        return QLinear(kind.lower(), torch.from_numpy(as_rows(kind.lower(), raw, 40, 512))), w
    return packed_linear(kind, seed=3)


@pytest.mark.parametrize("kind", ("Q4_0", "Q4_1", "Q8_0", "Q5_1") + FILE_TYPES)
def test_bf16_weights_are_the_exact_dequantization_rounded_to_nearest_even(kind):
    ql, w = linear(kind, np.random.default_rng(11))
    want = torch.from_numpy(w).bfloat16()   # the gguf package's values, rounded by torch
    assert torch.equal(ql.weight_fp32(), torch.from_numpy(w))   # our fp32 ones are those values
    for threads in (1, 2, 3):
        got = prefill_bf16._weights((ql.qw(),), threads)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)   # as values: -0 and 0 are one weight


@pytest.mark.parametrize("kind", ("Q4_1", "Q4_K", "Q6_K"))
def test_the_bf16_gemm_is_x_w_within_three_bf16_roundings(kind):
    """Inputs and weights each rounded once (u relative), the fp32 sum rounded to bf16 once more."""
    rng = np.random.default_rng(5)
    ql, w = linear(kind, rng)
    x = rng.normal(0, 1, (37, w.shape[1])).astype(np.float32)
    x[:, 7] = 30.0   # an outlier channel: bf16 rounds each value by itself, so it costs nothing extra
    bias = torch.from_numpy(rng.normal(0, 1, w.shape[0]).astype(np.float32))
    y = prefill_bf16.matmul(ql.qw(), torch.from_numpy(x), bias).double().numpy()
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    size = np.abs(x.astype(np.float64)) @ np.abs(w.T.astype(np.float64))
    assert (np.abs(y - bias.double().numpy() - exact) <= 2.05 * U * size + U * np.abs(exact) + 1e-6).all()
    assert not np.array_equal(y, exact + bias.double().numpy())   # it is bf16, not an fp32 GEMM


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_the_bf16_glu_is_the_activation_of_the_gate_times_the_up(act):
    rng = np.random.default_rng(2)
    gate, wg = packed_linear("Q4_1", seed=8)
    up, wu = packed_linear("Q4_1", seed=9)
    x = torch.from_numpy(rng.normal(0, 1, (1, 21, wg.shape[1])).astype(np.float32))
    got = prefill_bf16.glu(gate.qw(), up.qw(), x, act)
    prod = F.linear(x.bfloat16(), torch.from_numpy(np.concatenate([wg, wu])).bfloat16()).float()
    g, u = prod.split(wg.shape[0], dim=-1)
    want = (F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")) * u
    assert got.shape == want.shape == (1, 21, wg.shape[0]) and got.dtype == torch.bfloat16
    # rounded once to bf16 from within ~1e-7 of the fp32 value: at most one step of bf16 off
    # the rounding of torch's fp32 result, and that one only where the two straddle a midpoint
    ref = want.bfloat16().float()
    torch.testing.assert_close(got.float(), ref, rtol=U, atol=1e-6 * want.abs().max().item())
    assert (got.float() == ref).float().mean() > 0.99
    assert prefill_bf16.glu(gate.qw(), up.qw(), x, "relu") is None   # not an activation it has


def test_the_default_prefill_is_bf16_exactly_where_the_cpu_has_a_bf16_gemm(monkeypatch):
    monkeypatch.delenv("NANOCHAT_QGEMM", raising=False)
    assert (prefill_gemm.path(512) == "bf16") == bool(prefill_gemm.lib().qg_bf16() or prefill_bf16.amx())
    assert prefill_gemm.path(prefill_gemm.bf16_min_tokens() - 1) != "bf16"   # a short chat turn: the int16 GEMM
    assert prefill_gemm.bf16_min_tokens() == (64 if prefill_gemm.lib().qg_bf16() == 2 else 288)
    for mode, want in (("bf16", "bf16"), ("1", "int16"), ("int8", "int8"), ("0", None)):
        monkeypatch.setenv("NANOCHAT_QGEMM", mode)
        assert prefill_gemm.path() == want


def test_a_bf16_prefill_then_the_c_step_stays_near_the_reference_over_two_turns(mixed_gguf, home, monkeypatch):  # noqa: F811
    """The bf16 prefill writes the persistent fp16 cache the C step then reads: each turn's
    logits stay within bf16's error of the fp32 reference's, fed the same tokens."""
    monkeypatch.setenv("NANOCHAT_QGEMM", "bf16")
    tiles = prefill_gemm.lib().qg_bf16()   # our bf16 GEMM (tests/test_prefill_tiles.py), else oneDNN's
    owner, name = (prefill_gemm, "tiles") if tiles else (prefill_bf16, "matmul")
    q, gq, gr, calls = spied_pair(mixed_gguf, monkeypatch, owner, name)
    # attention: PyTorch's bf16 SDPA where oneDNN has AMX tiles, else our C kernel (faster there)
    attn_owner = prefill_bf16 if prefill_bf16.amx() else prefill_attn
    attended: list[int] = []
    real_attend = attn_owner.attend
    monkeypatch.setattr(attn_owner, "attend", lambda *a: attended.append(1) or real_attend(*a))
    t = q.template
    for turn in (t.start("") + t.user_turn("hello world, tell me about 1234"), t.user_turn("what next?")):
        with torch.inference_mode():
            for gen in (gq, gr):
                gen.prefill(turn)
            for tok in [5, 17, 42]:   # the same tokens into both, so the logits stay comparable
                scale = gr.logits.abs().max().item()
                assert (gq.logits - gr.logits).abs().max().item() <= 0.03 * scale
                for gen in (gq, gr):
                    gen.feed(tok)
    assert calls and attended and gq.cache.seqlen == gr.cache.seqlen


@pytest.mark.parametrize("pos,window", [(0, -1), (0, 30), (0, 5), (37, -1), (37, 20)])   # (0, 30): is_causal
def test_bf16_attention_sees_exactly_the_causal_window_within_bf16s_error(pos, window):
    """Over cached rows from an earlier turn (pos > 0), GQA, and a sliding window: the float64
    softmax over the same keys, within bf16's rounding; keys it must not see carry huge values,
    so one seen by mistake would show."""
    g = torch.Generator().manual_seed(pos + window)
    t, hq, hk, d = 19, 4, 2, 64
    q = torch.randn(1, t, hq, d, generator=g)
    k_cache = torch.randn(1, 80, hk, d, generator=g).half()
    v_cache = torch.randn(1, 80, hk, d, generator=g).half()
    i = torch.arange(t)[:, None] + pos
    j = torch.arange(80)[None, :]
    seen = (j <= i) & ((j >= i - window) if window >= 0 else True)
    unseen = ~seen.any(0)
    v_cache[:, unseen] = 1e4   # rows no query may see (the future, and before every window)
    got = prefill_bf16.attend(q, k_cache, v_cache, pos, window, d ** -0.5)
    kd, vd = (c.double().repeat_interleave(hq // hk, dim=2) for c in (k_cache, v_cache))
    logits = torch.einsum("bthd,bshd->bhts", q.double(), kd) * d ** -0.5
    p = logits.masked_fill(~seen, float("-inf")).softmax(-1)
    want = torch.einsum("bhts,bshd->bthd", p, vd)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert (got.double() - want).abs().max().item() <= 0.02 * vd[:, seen.any(0)].abs().max().item()


def test_q_k_and_v_as_one_stacked_gemm_are_each_ones_own_product(monkeypatch):
    """The stacked GEMM (q, k and v over one input) splits back into each matrix's product, each
    with its own bias (Qwen2's q/k/v have one), within an ulp of bf16 of the one-matrix GEMM."""
    monkeypatch.setenv("NANOCHAT_QGEMM", "bf16")
    mods = [packed_linear(kind, seed=s)[0] for kind, s in (("Q4_1", 1), ("Q8_0", 2), ("Q4_0", 3))]
    mods[0].set_bias(torch.randn(mods[0].out_features))
    x = torch.randn(1, 33, mods[0].in_features)
    got = prefill_bf16.stacked([m.qw() for m in mods], x, [m.bias for m in mods])
    assert len(got) == 3
    if not prefill_gemm.lib().qg_bf16():   # with our bf16 GEMM, q, k and v go one by one instead
        assert all(torch.equal(a, b) for a, b in zip(mods[0].stacked((mods[1], mods[2]), x), got, strict=True))
    for m, y in zip(mods, got, strict=True):
        want = prefill_bf16.matmul(m.qw(), x, m.bias)
        assert y.shape == want.shape == (1, 33, m.out_features)
        torch.testing.assert_close(y, want, rtol=2 * U, atol=1e-6)
    assert mods[0].stacked((mods[1],), x[:, :1].reshape(-1)) is None   # one row: the decode kernel's
    monkeypatch.setenv("NANOCHAT_QGEMM", "1")
    assert mods[0].stacked((mods[1],), x) is None   # the int16 GEMM shares the quantized input instead
