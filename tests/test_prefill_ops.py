"""A prefill's norms and rotary in C (model/cpu/prefill_ops.c): rotary gives PyTorch's
apply_rotary bits exactly, so the fp32 reference may take it; the norms, which only the quantized
CPU loader installs, stay within 2 ulp of float64, and fall back to it for what they do not serve."""

from __future__ import annotations

import pytest
import torch

from model.cpu import native, prefill_ops
from model.families.gemma import GemmaRMSNorm
from model.families.layers import RMSNorm, apply_rotary
from model.loading.quantized import native_norm

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
        norm.__class__ = native_norm(cls)
        got = norm(x)
        assert torch.equal(got, prefill_ops.rms_norm(x, norm.weight, norm.eps, gemma))   # the C pass served it
        assert torch.equal(norm(x.double()), cls.forward(norm, x.double()))   # not fp32: PyTorch's
    xd, wd = x.double(), norm.weight.detach().double()
    want = xd / torch.sqrt((xd ** 2).mean(-1, keepdim=True) + 1e-6) * ((1 + wd) if gemma else wd)
    assert ((got.double() - want).abs() <= 2 * torch.finfo(torch.float32).eps * want.abs()).all()
    assert prefill_ops.rms_norm(x.requires_grad_(), norm.weight, norm.eps, gemma) is None   # autograd: PyTorch's
