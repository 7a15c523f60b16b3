"""The one rotary convention (model/families/layers.py) gives each family its checkpoints' rotation, bit for bit."""

import pytest
import torch

from model.families.layers import apply_rotary, rotary_tables


def halves(x: torch.Tensor):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_tables_rotate_by_plus_angle_in_fp32(dtype):
    """Llama (Hugging Face's rotate_half): fp32 tables lift a bf16 x, the result is x's dtype."""
    cos, sin = rotary_tables(16, 40, 10000.0)
    x = torch.randn(1, 40, 3, 16).to(dtype)
    x1, x2 = halves(x.float())
    c, s = cos[None, :, None], sin[None, :, None]
    want = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(dtype)
    assert torch.equal(apply_rotary(x, cos, sin), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reversed_tables_are_nanochats_rotation_by_minus_angle(dtype):
    """nanochat's own formula, in x's dtype, with its fp32 angles: reverse=True only negates the sine."""
    cos, sin = (t.to(dtype) for t in rotary_tables(16, 40, 100000.0, torch.float32))
    rcos, rsin = (t.to(dtype) for t in rotary_tables(16, 40, 100000.0, torch.float32, reverse=True))
    x = torch.randn(1, 40, 3, 16).to(dtype)
    x1, x2 = halves(x)
    c, s = cos[None, :, None], sin[None, :, None]
    want = torch.cat([x1 * c + x2 * s, x2 * c - x1 * s], -1)
    assert torch.equal(apply_rotary(x, rcos, rsin), want)


def test_float64_angles_are_the_exact_tables():
    cos, _ = rotary_tables(8, 3000, 10000.0)
    exact = torch.cos(torch.tensor(2999.0, dtype=torch.float64)).float()
    assert cos[2999, 0] == exact
