"""Sampling: greedy, top-k and top-p keep exactly the tokens they should; the device sampler
(model/decode/sampling.py, the CUDA graph's) draws what the plain rules draw from the same seed;
the CPU's draw among the candidates keeps the same tokens and draws them in proportion."""

import pytest
import torch

from model.decode.sampling import (
    MIN_TOP_P,
    TOP_CANDIDATES,
    DeviceSampler,
    SamplingConfig,
    probabilities,
    sample_token,
    settings,
    top_candidates,
)


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


CONFIGS = [
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=0.0, top_k=3, top_p=0.5),   # greedy ignores the filters
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=50),
    SamplingConfig(temperature=1.0, top_k=1),
    SamplingConfig(temperature=1.0, top_k=10**6),          # past the vocabulary: off
    SamplingConfig(temperature=1.0, top_p=0.9),
    SamplingConfig(temperature=1.3, top_k=5, top_p=0.5),
    SamplingConfig(temperature=1.0, top_p=1e-9),           # below the floor: the top token only
    SamplingConfig(temperature=1.0, top_p=MIN_TOP_P),
    SamplingConfig(temperature=1e-300, top_k=0),           # floored, not inf
    SamplingConfig(temperature=5.0, top_k=0, top_p=1.0),
]


def reference(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator) -> int:
    """The rules written out the plain way (the host sampler before the device one shared its
    maths): a top-k threshold, a top-p cut over sorted probabilities, torch.multinomial."""
    if cfg.temperature <= 0:
        return int(logits.argmax())
    logits = logits.float() / max(cfg.temperature, 1e-6)
    if cfg.top_k > 0:
        kth = torch.topk(logits, min(cfg.top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= max(cfg.top_p, MIN_TOP_P)
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return int(torch.multinomial(logits.softmax(-1), 1, generator=gen)[0])


def device_draws(logits: torch.Tensor, cfg: SamplingConfig, seed: int, n: int) -> list[int]:
    """DeviceSampler's code path, buffers and all, on CPU tensors (the graph only replays it)."""
    out = torch.zeros(1, dtype=torch.long)
    sampler = DeviceSampler(logits.clone(), out)
    sampler.gen = torch.Generator().manual_seed(seed)
    sampler.set(cfg)
    picks = []
    for _ in range(n):
        sampler.greedy() if cfg.temperature <= 0 else sampler.sample()
        picks.append(int(out[0]))
    return picks


def host_draws(logits: torch.Tensor, cfg: SamplingConfig, seed: int, n: int, fn=sample_token) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(fn(logits, cfg, g)) for _ in range(n)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"t{c.temperature}-k{c.top_k}-p{c.top_p}")
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_device_sampler_draws_what_the_plain_rules_draw(cfg, seed):
    """On the GPU the eager draw is this too (no candidates there): the graph and eager decodes
    draw the same tokens from one seed. The CPU's host draw does too whenever the candidates
    decline (greedy, nothing filtered, or a cut past them)."""
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(100 + seed)) * 3
    device = device_draws(logits, cfg, seed, 60)
    assert device == host_draws(logits, cfg, seed, 60, reference)
    temperature, kth, top_p, min_p = settings(cfg, 1000)
    if cfg.temperature <= 0 or top_candidates(logits, temperature, kth, top_p, min_p) is None:
        assert host_draws(logits, cfg, seed, 60) == device
    if cfg.temperature >= 0.7 and cfg.top_k != 1 and cfg.top_p >= 0.9:
        assert len(set(device)) > 1  # the comparison is of real draws, not of one forced token


def test_nan_logits_raise_on_the_host():
    """A broken model (NaN logits) must fail the turn, not sample a token: the session relies on it."""
    with pytest.raises(RuntimeError):
        sample_token(torch.full((10,), float("nan")), SamplingConfig(temperature=1.0), torch.Generator())


@pytest.mark.parametrize("cfg", CONFIGS[2:] + [SamplingConfig(temperature=0.2, top_p=0.9),
                                               SamplingConfig(temperature=1.0, min_p=0.05),
                                               SamplingConfig(temperature=0.7, top_k=40, top_p=0.95)],
                         ids=lambda c: f"t{c.temperature}-k{c.top_k}-p{c.top_p}-m{c.min_p}")
def test_the_candidates_are_the_tokens_the_sort_keeps(cfg):
    """top_candidates (the CPU's path: no sort of the vocabulary) keeps exactly the tokens
    `probabilities` keeps, with their probabilities, whenever it answers, and answers None (the
    caller sorts) when the kept tokens reach past it."""
    vocab, answered = 5000, 0
    for seed in range(4):
        logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * (1 + 2 * seed)
        temperature, kth, top_p, min_p = settings(cfg, vocab)
        kept = top_candidates(logits, temperature, kth, top_p, min_p)
        want = probabilities(logits, torch.full((1,), temperature), torch.tensor([kth]), torch.tensor([top_p]),
                             torch.tensor([min_p]))
        if kept is not None:
            answered += 1
            ids, probs = kept
            assert sorted(ids.tolist()) == sorted(torch.nonzero(want).flatten().tolist())
            torch.testing.assert_close(probs / probs.sum(), want[ids], rtol=1e-5, atol=1e-7)
        else:
            assert int((want > 0).sum()) > TOP_CANDIDATES[-1] or kth >= TOP_CANDIDATES[-1]
    flat = top_candidates(torch.zeros(vocab), 1.0, vocab - 1, 0.99, 0.0)
    assert flat is None   # 99% of a flat distribution: thousands of tokens, the sort's job
    if cfg.top_p <= 0.95 or 0 < cfg.top_k <= TOP_CANDIDATES[-1] or cfg.min_p > 0:
        assert answered > 0


def test_a_nucleus_wider_than_the_first_candidates_is_found_among_the_second():
    """A warm temperature over flat logits keeps hundreds of tokens: the second, wider topk finds
    them (still a tenth of the sort's cost), the same set the sort keeps."""
    logits = torch.randn(5000, generator=torch.Generator().manual_seed(2))
    kept = top_candidates(logits, 1.0, 4999, 0.5, 0.0)
    want = probabilities(logits, torch.ones(1), torch.tensor([4999]), torch.tensor([0.5]), torch.zeros(1))
    assert kept is not None and TOP_CANDIDATES[0] < len(kept[0]) <= TOP_CANDIDATES[-1]
    assert sorted(kept[0].tolist()) == sorted(torch.nonzero(want).flatten().tolist())


def test_the_host_draws_the_kept_tokens_in_proportion():
    """The CPU's race among the candidates draws from the distribution `probabilities` gives:
    5,000 draws, each kept token's count within 5 standard deviations of its expectation, and
    nothing outside the kept set; at 0.2 most of the vocabulary's exp underflows (the clamp)."""
    for temperature, top_p in ((1.0, 0.9), (0.2, 0.9)):
        logits = torch.randn(8192, generator=torch.Generator().manual_seed(3)) * 2
        logits[[5, 99, 1234, 4000, 777, 3, 8000]] = torch.tensor([16.0, 15.5, 15.0, 14.5, 14.0, 13.0, 12.0])
        cfg = SamplingConfig(temperature=temperature, top_p=top_p)
        t, kth, p, m = settings(cfg, 8192)
        want = probabilities(logits, torch.full((1,), t), torch.tensor([kth]), torch.tensor([p]), torch.tensor([m]))
        assert top_candidates(logits, t, kth, p, m) is not None  # the candidates' path is what this tests
        g, n = torch.Generator().manual_seed(0), 5000
        counts = torch.bincount(torch.stack([sample_token(logits, cfg, g) for _ in range(n)]), minlength=8192)
        assert set(torch.nonzero(counts).flatten().tolist()) <= set(torch.nonzero(want).flatten().tolist())
        expect = want * n
        assert bool(((counts - expect).abs() <= 5 * (expect * (1 - want)).sqrt() + 1).all())
