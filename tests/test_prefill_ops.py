"""A prefill's norms and rotary in C (model/cpu/prefill_ops.c): rotary gives PyTorch's
apply_rotary bits exactly, so the fp32 reference may take it; the norms, which only the quantized
CPU loader installs, stay within 2 ulp of float64, and fall back to it for what they do not serve."""

from __future__ import annotations

import pytest
import torch

from model.cpu import native, prefill_ops
from model.families.gemma import GemmaRMSNorm
from model.families.layers import RMSNorm, apply_rotary

pytestmark = pytest.mark.skipif(prefill_ops.lib() is None, reason=f"CPU kernels unavailable: {native.why_not()}")


def torch_rotary(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


@pytest.mark.parametrize("d", [64, 256, 18])   # 18: the scalar tail only
def test_rotary_gives_pytorchs_bits(d):
    g = torch.Generator().manual_seed(d)
    x, cos, sin = torch.randn(1, 37, 3, d, generator=g) * 4, torch.randn(37, d // 2, generator=g), torch.randn(
        37, d // 2, generator=g)
    got = prefill_ops.rotary(x, cos, sin)
    assert got is not None and torch.equal(got, torch_rotary(x, cos, sin))
    assert torch.equal(apply_rotary(x, cos, sin), got)
    assert prefill_ops.rotary(x[:, :1], cos[:1], sin[:1]) is None   # one token: PyTorch's ops
    assert prefill_ops.rotary(x.bfloat16(), cos, sin) is None


@pytest.mark.parametrize("cls", [RMSNorm, GemmaRMSNorm])
def test_the_quantized_loaders_norms_are_within_two_ulp_of_float64(cls):
    """PyTorch's own are within 2.3 eps (relative) of float64 here; ours, summing squares in
    double, within 2."""
    gemma = cls is GemmaRMSNorm
    norm = cls(200, 1e-6)
    with torch.no_grad():
        norm.weight.normal_(0, 0.5)
        x = torch.randn(1, 65, 200) * 7
        norm.__class__ = prefill_ops.native_norm(cls)
        got = norm(x)
        assert torch.equal(got, prefill_ops.rms_norm(x, norm.weight, norm.eps, gemma))   # the C pass served it
        assert torch.equal(norm(x.double()), cls.forward(norm, x.double()))   # not fp32: PyTorch's
    xd, wd = x.double(), norm.weight.detach().double()
    want = xd / torch.sqrt((xd ** 2).mean(-1, keepdim=True) + 1e-6) * ((1 + wd) if gemma else wd)
    assert ((got.double() - want).abs() <= 2 * torch.finfo(torch.float32).eps * want.abs()).all()
    assert prefill_ops.rms_norm(x.requires_grad_(), norm.weight, norm.eps, gemma) is None   # autograd: PyTorch's


def test_norm_and_rotary_read_a_column_slice_of_the_stacked_product_in_place():
    """q as columns of the stacked q/k/v GEMM's output (each token's heads contiguous, tokens a
    row of the product apart): the same bits as on a contiguous copy, and no copy is made."""
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(1, 29, 4 * 64 + 2 * 2 * 64, generator=g) * 3
    q = qkv[..., :4 * 64].view(1, 29, 4, 64)
    assert not q.is_contiguous() and prefill_ops._row_groups(q) == (4, qkv.shape[-1])
    w = torch.randn(64, generator=g)
    for gemma in (False, True):
        want = prefill_ops.rms_norm(q.contiguous(), w, 1e-6, gemma)
        assert torch.equal(prefill_ops.rms_norm(q, w, 1e-6, gemma), want)
    cos, sin = torch.randn(29, 32, generator=g), torch.randn(29, 32, generator=g)
    got = prefill_ops.rotary(q, cos, sin)
    assert torch.equal(got, torch_rotary(q.contiguous(), cos, sin)) and got.is_contiguous()
    assert prefill_ops._row_groups(q.transpose(1, 2)) == (0, 0)   # other layouts: a contiguous copy
