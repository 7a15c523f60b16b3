"""The prefill's fused gated-MLP half (qgemm.c's qg_gemm_glu): act(x Wg^T) * (x Wu^T) in one C
call equals the two GEMMs followed by PyTorch's activation and product, within the activation's
stated error (relative 1e-6: act_rows' exp polynomial against Sleef's, on every build), and
GatedMLP really takes it for a prefill of block-format weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.cpu import native, prefill_gemm
from model.cpu.blocks import Q4
from model.cpu.qlinear import QLinear
from model.families.layers import GatedMLP, gelu_tanh

pytestmark = pytest.mark.skipif(prefill_gemm.lib() is None, reason=f"CPU kernels unavailable: {native.why_not()}")

ACTS = {"silu": F.silu, "gelu_tanh": gelu_tanh}


def q4(rows: int, cols: int, seed: int) -> QLinear:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8, generator=g)
    scale = (torch.rand(rows, cols // 32, generator=g) * 0.05).half()
    return QLinear(Q4, q, scale, (-8 * scale.float()).half())


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Relative 1e-6 of each value, plus 1e-6 of the largest for values near an activation's zero."""
    return bool(((got - want).abs() <= 1e-6 * want.abs() + 1e-6 * want.abs().max()).all())


@pytest.mark.parametrize("act", list(ACTS))
def test_glu_is_the_activation_of_the_gate_times_up(act):
    portable = prefill_gemm.bind(native.build(["-O3", "-fopenmp", "-pthread"]))
    gate, up = q4(72, 128, 1), q4(72, 128, 2)
    x = torch.randn(37, 128) * 3   # GELU's and SiLU's tails on both sides
    for lib in (prefill_gemm.lib(), portable):
        g = prefill_gemm.gemm(lib, gate.qw(), x, 2)
        u = prefill_gemm.gemm(lib, up.qw(), x, 2)
        got = prefill_gemm.glu_with(lib, gate.qw(), up.qw(), x, 2, act)
        assert got is not None and close(got, ACTS[act](g) * u), lib
        # threads give the same bits
        assert torch.equal(prefill_gemm.glu_with(lib, gate.qw(), up.qw(), x, 1, act), got)


def test_a_gated_mlp_prefill_takes_the_fused_call(monkeypatch):
    monkeypatch.setenv("NANOCHAT_QGEMM", "1")   # any build, so CI runs it too
    calls = []
    real = prefill_gemm.glu
    monkeypatch.setattr(prefill_gemm, "glu", lambda *a: calls.append(a[3]) or real(*a))
    for name, act in ACTS.items():
        mlp = GatedMLP(128, 96, act)
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = q4(96, 128, 3), q4(96, 128, 4), q4(128, 96, 5)
        x = torch.randn(1, 20, 128)
        with torch.inference_mode():
            got = mlp(x)
            want = mlp.down_proj(act(mlp.gate_proj(x)) * mlp.up_proj(x))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        assert calls[-1] == name
        n = len(calls)
        with torch.inference_mode():
            assert mlp(x[:, :1]).shape == (1, 1, 128)   # one row: the decode kernels, not the fused call
        assert len(calls) == n


def test_glu_refuses_what_it_cannot_fuse():
    lib = prefill_gemm.lib()
    x = torch.randn(4, 128)
    assert prefill_gemm.glu_with(lib, q4(72, 128, 1).qw(), q4(64, 128, 2).qw(), x, 1, "silu") is None   # rows differ
    gate = q4(72, 128, 1)
    gate.set_bias(torch.ones(72))
    assert prefill_gemm.glu_with(lib, gate.qw(), q4(72, 128, 2).qw(), x, 1, "silu") is None   # a bias
