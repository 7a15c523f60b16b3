"""Our bf16 GEMM (model/cpu/qgemm_bf16.c, the bf16 prefill's matmuls: AMX tiles where the CPU
has them, else AVX-512 BF16's VDPBF16PS):
each output is the exact sum of the bf16-rounded inputs times the bf16-rounded weights within
fp32's summation error (no bf16 rounding of the result), on every block format, past the
512-token phase, with rows and tokens that fill no whole tile; the same bits on any thread
count; its GLU is act(gate) * up of those sums. Skipped where the CPU (or the build) has neither:
there the bf16 path is oneDNN's (tests/test_prefill_bf16.py)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf import quants
from helpers import packed_linear, random_blocks

from model.cpu import native, prefill_gemm
from model.cpu.file_blocks import FILE_TYPES, as_rows
from model.cpu.qlinear import QLinear

LIB = prefill_gemm.lib()
pytestmark = pytest.mark.skipif(LIB is None or not LIB.qg_bf16(), reason="no AMX or AVX-512 BF16 on this CPU or build")
U32 = 2.0 ** -24


def linear(kind: str, rng, rows: int = 40) -> tuple[QLinear, np.ndarray]:
    if kind in FILE_TYPES:
        raw = random_blocks(kind, rows, 512, rng)
        w = quants.dequantize(raw, Q[kind]).reshape(rows, 512).astype(np.float32)
        return QLinear(kind.lower(), torch.from_numpy(as_rows(kind.lower(), raw, rows, 512))), w
    return packed_linear(kind, seed=3)


def bf16_exact(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 product of the bf16-rounded operands, the sum of their magnitudes)"""
    xb = torch.from_numpy(x).bfloat16().double().numpy()
    wb = torch.from_numpy(w).bfloat16().double().numpy()
    return xb @ wb.T, np.abs(xb) @ np.abs(wb.T)


@pytest.mark.parametrize("kind", ("Q4_0", "Q4_1", "Q8_0") + FILE_TYPES)
def test_the_tile_gemm_is_the_bf16_operands_product_summed_in_fp32(kind):
    rng = np.random.default_rng(4)
    ql, w = linear(kind, rng)
    for t in (1, 37, 530):   # 530: two phases of the 512-token limit, neither a whole tile
        x = rng.normal(0, 1, (t, w.shape[1])).astype(np.float32)
        x[:, 3] = 40.0   # an outlier channel costs nothing: each value is rounded by itself
        got = [prefill_gemm.gemm(LIB, ql.qw(), torch.from_numpy(x), threads, 0) for threads in (1, 2, 3)]
        assert all(torch.equal(got[0], g) for g in got[1:])   # the sum's order is the tile's, not the split's
        exact, size = bf16_exact(x, w)
        err = np.abs(got[0].double().numpy() - exact)
        assert (err <= 2 * w.shape[1] * U32 * size + 1e-30).all()
        assert err.max() <= 1e-5 * np.abs(exact).max()   # fp32 sums: far inside bf16's 4e-3
        assert not np.allclose(got[0].numpy(), x @ w.T, rtol=1e-4, atol=0)   # the operands are bf16


def test_the_tile_gemm_adds_the_bias():
    ql, w = packed_linear("Q4_1", seed=5)
    bias = torch.linspace(-3, 3, w.shape[0])
    ql.set_bias(bias)
    x = torch.randn(50, w.shape[1])
    ql_plain, _ = packed_linear("Q4_1", seed=5)
    torch.testing.assert_close(prefill_gemm.gemm(LIB, ql.qw(), x, 2, 0),
                               prefill_gemm.gemm(LIB, ql_plain.qw(), x, 2, 0) + bias, rtol=0, atol=1e-5)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_the_tile_glu_is_the_activation_of_the_gate_times_the_up(act):
    gate, wg = packed_linear("Q4_1", seed=8)
    up, wu = packed_linear("Q4_1", seed=9)
    x = torch.randn(1, 45, wg.shape[1])
    got = prefill_gemm.glu_with(LIB, gate.qw(), up.qw(), x, 2, act, 0)
    g = prefill_gemm.gemm(LIB, gate.qw(), x, 1, 0)
    u = prefill_gemm.gemm(LIB, up.qw(), x, 1, 0)
    want = (F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")) * u
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * want.abs().max().item())


def test_the_bf16_path_runs_on_the_tiles_here(monkeypatch):
    """Where the tile GEMM exists, the bf16 path's matmuls and GLUs are its (not oneDNN's)."""
    monkeypatch.setenv("NANOCHAT_QGEMM", "bf16")
    ql, w = packed_linear("Q8_0", seed=2)
    x = torch.randn(300, w.shape[1])
    assert torch.equal(prefill_gemm.matmul(ql.qw(), x), prefill_gemm.gemm(LIB, ql.qw(), x, torch.get_num_threads(), 0))
    assert prefill_gemm.stacked([ql.qw()], x, [None]) is None   # q, k and v go one by one
    assert native.library().qg_bf16() in (1, 2)   # 1: the tiles, 2: VDPBF16PS


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed")
def test_clang_builds_the_same_bf16_gemm():
    """clang's build of the kernels has the same bf16 GEMM and gives the same bits (CI installs
    clang, so the AVX-512 BF16 path is compiled by both compilers there)."""
    lib = prefill_gemm.bind(native.build(["-O3", "-march=native", "-pthread"], cc="clang"))
    assert lib is not None and lib.qg_bf16() == LIB.qg_bf16()
    ql, w = packed_linear("Q4_1", seed=3)
    x = torch.randn(70, w.shape[1])
    assert torch.equal(prefill_gemm.gemm(lib, ql.qw(), x, 2, 0), prefill_gemm.gemm(LIB, ql.qw(), x, 2, 0))
    gate, up = packed_linear("Q4_1", seed=8)[0], packed_linear("Q4_1", seed=9)[0]
    assert torch.equal(prefill_gemm.glu_with(lib, gate.qw(), up.qw(), x, 2, "silu", 0),
                       prefill_gemm.glu_with(LIB, gate.qw(), up.qw(), x, 2, "silu", 0))
