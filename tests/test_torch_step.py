"""The capturable PyTorch decode step (what the CUDA graph replays: each family's own forward,
called with the position on the device) equals the eager forward, on the CPU.

It reads the position from `cache_seqlens` instead of the host mirror and mask attention
over the whole capacity; on the CPU (no flash backend) they take the SDPA path, bit for bit
the same maths as the eager model, so the comparison is exact up to SDPA's masked sums.
"""

from pathlib import Path

import pytest
import torch

from model.decode.torch_step import TorchStep
from model.families.llama import RANDOM, LlamaConfig
from model.loading import LoadOptions, load_model
from model.loading.random import random_model

FIX = Path(__file__).parent / "fixtures" / "nanochat"
NANOCHAT = ["oct2025", "jan2026", "mar2026a", "head"]


def step_vs_eager(model, step_cls=TorchStep, prompt: int = 9, tokens=(5, 17, 3)) -> float:
    """Largest |logit difference| between the step and the eager forward over a few tokens."""
    ids = torch.randint(0, 200, (1, prompt), generator=torch.Generator().manual_seed(prompt))
    ref_cache, cache = model.new_cache(64), model.new_cache(64)
    worst = 0.0
    with torch.inference_mode():
        model(ids, ref_cache)
        model(ids, cache)
        step = step_cls(model, cache)
        for token in tokens:
            ref = model(torch.tensor([[token]]), ref_cache)[0, -1]
            step.token.fill_(token)
            out = step()[:ref.shape[0]]
            cache.advance(1)
            worst = max(worst, float((out - ref).abs().max()))
    return worst


def test_llama_torch_step_equals_eager():
    assert step_vs_eager(load_model("random:tiny").model, TorchStep) < 1e-4


@pytest.mark.parametrize("extra", [
    dict(attention_bias=True),                                     # Qwen2
    dict(qk_norm=True, head_dim=32, tie_word_embeddings=False),    # Qwen3: head_dim != hidden / heads
    dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 16}),  # Llama 3.x
], ids=["biases", "qk-norm-head-dim-untied", "llama3-rope"])
def test_llama_shapes_torch_step_equals_eager(extra):
    cfg = LlamaConfig(**{**RANDOM.presets["tiny"], **extra})
    model = random_model(cfg, LoadOptions())
    with torch.no_grad():   # the random preset leaves biases and norms plain: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "q_norm" in name or "k_norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.5)
    assert step_vs_eager(model, TorchStep) < 1e-4


@pytest.mark.parametrize("name", NANOCHAT)
def test_nanochat_torch_step_equals_eager(name):
    opts = LoadOptions(tokenizer=str(FIX / "tokenizer" / "tokenizer.pkl"), attn="sdpa")
    assert step_vs_eager(load_model(str(FIX / name), opts).model, TorchStep) < 1e-4
