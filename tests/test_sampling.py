"""Sampling: greedy, top-k and top-p keep exactly the tokens they should."""

import torch

from model.generate import SamplingConfig, sample_token


def draws(logits, cfg, n=400):
    g = torch.Generator().manual_seed(0)
    return {int(sample_token(logits, cfg, g)) for _ in range(n)}


LOGITS = torch.log(torch.tensor([0.05, 0.4, 0.3, 0.2, 0.05]))


def test_greedy_at_temperature_zero():
    assert draws(LOGITS, SamplingConfig(temperature=0.0), n=5) == {1}


def test_top_k_keeps_the_k_best():
    assert draws(LOGITS, SamplingConfig(temperature=1.0, top_k=2)) == {1, 2}


def test_top_p_keeps_the_smallest_set_reaching_p():
    # 0.4 + 0.3 = 0.7 < 0.75, so the third-best (0.2) is still needed; the 0.05s never are
    assert draws(LOGITS, SamplingConfig(temperature=1.0, top_p=0.75)) == {1, 2, 3}
    assert draws(LOGITS, SamplingConfig(temperature=1.0, top_p=0.3)) == {1}


def test_full_sampling_reaches_every_token():
    assert draws(LOGITS, SamplingConfig(temperature=1.0), n=2000) == {0, 1, 2, 3, 4}
