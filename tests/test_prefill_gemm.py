"""The prefill's integer GEMM (model/cpu/qgemm.c), int16 activations (the default) and
int8: its integer core equals an exact integer reference bit for bit, on every build (AVX-512
VNNI where the CPU has it, portable C, clang); on every block format it stays within the stated
bound of the gguf package's dequantization (the activations' rounding, and fp32's in the
scaled block sums); thread counts give the same bits; and a prefill through it, then the C
decode step, picks the fp32 reference's greedy tokens over the persistent cache."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants
from helpers import assert_invariant, both, packed_linear, random_blocks, spied_pair

from model.cpu import native, prefill_gemm
from model.cpu.blocks import Q4, Q8
from model.cpu.file_blocks import FILE_TYPES, as_rows
from model.cpu.qlinear import QLinear

pytestmark = pytest.mark.skipif(prefill_gemm.lib() is None, reason=f"CPU kernels unavailable: {native.why_not()}")


@pytest.fixture(scope="module")
def builds() -> dict:
    """The default build, the portable C one (no -march=native) and clang's two where installed (the
    flags test_quant.py builds with, so the suite compiles each once)."""
    out = {"default": prefill_gemm.lib(), "portable": prefill_gemm.bind(native.build(["-O3", "-fopenmp", "-pthread"]))}
    assert out["portable"].qg_simd() == 0
    if shutil.which("clang"):
        for name, flags in (("clang", ["-O3", "-march=native", "-pthread"]), ("clang-portable", ["-O3", "-pthread"])):
            lib = native.build(flags, cc="clang")
            assert lib is not None, f"clang failed on qdecode.c with {flags}"
            out[name] = prefill_gemm.bind(lib)
    return out


def run(lib, ql: QLinear, x: np.ndarray, threads: int = 2, bits: int = 16) -> np.ndarray:
    y = prefill_gemm.gemm(lib, ql.qw(), torch.from_numpy(x), threads, bits)
    assert y is not None
    return y.numpy()


def integer_case(kind: str, rows: int, cols: int, tokens: int, seed: int, bits: int):
    """A weight whose scales are powers of two and mins integers, and inputs that are integers
    with the int type's largest value in every 32-block (so its scale is exactly 1): every float
    step is exact, and the product must equal the integer one."""
    rng = np.random.default_rng(seed)
    sub = 16 if kind == "q8/16" else 32
    q = rng.integers(0, 16, (rows, cols)) if kind == Q4 else rng.integers(-128, 128, (rows, cols))
    top = 127 if bits == 8 else 32767
    x = rng.integers(-127, 128, (tokens, cols)) * (1 if bits == 8 else 3)
    x[:, ::32] = top * rng.choice([-1, 1], (tokens, cols // 32))
    if bits == 16:   # the sums stay within fp32's 24 bits: small weights where x is largest
        q[:, ::32] = rng.integers(0, 2, (rows, cols // 32))
    if kind == Q4:
        halves = q.reshape(rows, -1, 2, 16)
        qt = torch.from_numpy((halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(rows, -1).astype(np.uint8))
    else:
        qt = torch.from_numpy(q.astype(np.int8))
    s = 2.0 ** rng.integers(-1, 1, (rows, cols // sub))
    m = rng.integers(-3, 4, (rows, cols // sub)).astype(np.float64)
    ql = QLinear(Q4 if kind == Q4 else Q8, qt, torch.from_numpy(s).half(), torch.from_numpy(m).half())
    w = np.repeat(s, sub, axis=1) * q + np.repeat(m, sub, axis=1)   # exact in float64
    return ql, x.astype(np.float32), w @ x.T.astype(np.float64)


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("kind", [Q4, Q8, "q8/16"])
def test_gemm_equals_the_integer_product_bit_for_bit(kind, bits, builds):
    # 70 rows: blocks of 4 with a remainder; 37 tokens: groups of 16 with a padded last one
    ql, x, want = integer_case(kind, 70, 256, 37, seed=len(kind), bits=bits)
    for name, lib in builds.items():
        assert np.array_equal(run(lib, ql, x, bits=bits), want.T.astype(np.float32)), name


def rounded_reference(w: np.ndarray, x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x rounded to int8/int16 per 32 as the kernel rounds it, times W in float64; the sum of
    the terms' sizes (for fp32's rounding); the bound on the distance to x W: half a step of
    each block, times |W|)."""
    xb = x.reshape(x.shape[0], -1, 32)
    d = np.abs(xb).max(axis=2, keepdims=True) / np.float32(127 if bits == 8 else 32767)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    xq = (np.rint(xb * inv) * d).reshape(x.shape).astype(np.float64)
    half_step = np.repeat(d[..., 0] / 2, 32, axis=1).astype(np.float64)
    aw = np.abs(w.T.astype(np.float64))
    return xq @ w.T.astype(np.float64), np.abs(xq) @ aw, half_step @ aw


def file_linear(kind: str, rows: int, cols: int, rng) -> tuple[QLinear, np.ndarray]:
    raw = random_blocks(kind, rows, cols, rng)
    w = quants.dequantize(raw, Q[kind]).reshape(rows, cols).astype(np.float32)
    return QLinear(kind.lower(), torch.from_numpy(as_rows(kind.lower(), raw, rows, cols))), w


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("kind", ("Q4_0", "Q4_1", "Q8_0", "Q5_1") + FILE_TYPES)
def test_gemm_is_the_gguf_product_within_the_activations_rounding(kind, bits, builds):
    rng = np.random.default_rng(7)
    if kind in FILE_TYPES:
        ql, w = file_linear(kind, 21, 512, rng)
    else:
        ql, w = packed_linear(kind, seed=3)
    x = rng.normal(0, 1, (40, w.shape[1])).astype(np.float32)
    x[:, 7] = 30.0   # an outlier channel, as real hidden states have
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    rounded, size, bound = rounded_reference(w, x, bits)
    for name, lib in builds.items():
        y = run(lib, ql, x, bits=bits)
        # the integer sums are exact: only fp32 rounding of the scaled block sums remains
        assert (np.abs(y - rounded) <= 2e-6 * size).all(), name
        assert (np.abs(y - exact) <= bound + 1e-5 * size).all(), name


def test_thread_counts_give_the_same_bits(builds):
    ql, w = file_linear("Q4_K", 300, 512, np.random.default_rng(1))
    x = np.random.default_rng(2).normal(0, 1, (100, 512)).astype(np.float32)
    lib = builds["default"]
    for bits in (16, 8):
        one = run(lib, ql, x, threads=1, bits=bits)
        for threads in (2, 3):
            assert np.array_equal(run(lib, ql, x, threads=threads, bits=bits), one)
        assert np.array_equal(run(builds["portable"], ql, x, threads=2, bits=bits), one)   # the portable C sums


def test_a_shared_input_is_quantized_once_and_a_changed_one_again():
    """q, k and v read one input: the second call reuses its int8 copy; an input written in
    place between calls (its version moves) is quantized anew."""
    lib = prefill_gemm.lib()
    ql, w = packed_linear("Q4_1", seed=5)
    x = torch.randn(20, w.shape[1])
    a = prefill_gemm.gemm(lib, ql.qw(), x, 2)
    assert torch.equal(prefill_gemm.gemm(lib, ql.qw(), x, 2), a)
    x.mul_(2)
    b = prefill_gemm.gemm(lib, ql.qw(), x, 2)
    torch.testing.assert_close(b, 2 * a, rtol=2e-2, atol=2e-2 * a.abs().max().item())
    assert not torch.equal(b, a)


def test_prefill_through_the_gemm_then_decode_picks_the_references_tokens(mixed_gguf, home, monkeypatch):  # noqa: F811
    """The default CPU path (GEMM prefill, then the C step over the persistent fp16 cache) and
    the fp32 reference greedy-decode the same tokens, over two turns on one cache."""
    monkeypatch.setenv("NANOCHAT_QGEMM", "1")   # the GEMM on any build, so CI runs it too
    q, gq, gr, calls = spied_pair(mixed_gguf, monkeypatch, prefill_gemm, "gemm")
    t = q.template
    for turn in (t.start("") + t.user_turn("hello world, tell me about 1234"), t.user_turn("what next?")):
        got, want = [], []
        for gen, out in ((gq, got), (gr, want)):
            with torch.inference_mode():
                gen.prefill(turn)
                for _ in range(12):
                    tok = int(gen.logits.argmax())
                    out.append(tok)
                    gen.feed(tok)
        assert got == want
    assert calls   # the prefill really went through the GEMM
    assert gq.cache.seqlen == gr.cache.seqlen


def test_a_weight_the_gemm_does_not_serve_falls_back():
    """Dense weights and rows that are not whole 32-blocks go to PyTorch's GEMM (None here)."""
    lib = prefill_gemm.lib()
    dense = QLinear.dense(torch.randn(8, 64))
    assert prefill_gemm.gemm(lib, dense.qw(), torch.randn(4, 64), 2) is None
    qw = native.QW(3, 0, 8, 48, 16, 0, None, None, None, None)   # 48 columns: not whole 32-blocks
    assert not lib.qg_supports(ctypes.byref(qw))


def test_a_chat_with_retry_and_undo_matches_the_reference_over_the_gemm_prefill(mixed_gguf, home, monkeypatch):  # noqa: F811
    """A session on the default CPU path (GEMM prefill, C decode step) says what the fp32
    reference says through send, /retry, /undo and another send, and its cache stays what a fresh
    prefill of its tokens writes (both round activations to int16 as the decode step does)."""
    from chatapp.chat.session import Session
    from chatapp.chat.settings import Settings
    from chatapp.keeper.keeper import ChatKeeper

    monkeypatch.setenv("NANOCHAT_QGEMM", "1")
    q, ref = both(mixed_gguf)
    s = Session(q, Settings(temperature=0.0, max_new_tokens=10), context=200)
    r = Session(ref, Settings(temperature=0.0, max_new_tokens=10), context=200)
    for kind, text in [("send", "hello world"), ("send", "what 1234"), ("cmd", "/retry"), ("cmd", "/undo"),
                       ("send", "world hello")]:
        for sess in (s, r):
            list(sess.send(text) if kind == "send" else ChatKeeper(sess, None).run_command(text))
        assert s.tokens == r.tokens and s.cache.seqlen == r.cache.seqlen
        assert_invariant(s, atol=5e-2, rtol=2e-2)   # fp16; int8 activations on the K-quant rows
