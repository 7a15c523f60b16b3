"""min_p and the repetition, presence and frequency penalties (model/decode/sampling.py): their maths
against Hugging Face's logits processors and OpenAI's published formula, the host and the
device samplers counting the same reply with them, and the generator counting exactly the
reply's last `repeat_last_n` tokens."""

import pytest
import torch
from helpers import greedy
from transformers.generation.logits_process import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

from model.decode.generate import Generator
from model.decode.sampling import (
    DeviceSampler,
    SamplingConfig,
    penalize,
    probabilities,
    sample_token,
    settings,
    token_counts,
    window,
)
from model.loading import load_model

V = 500


def one(x: float) -> torch.Tensor:
    return torch.full((1,), x)


def counts_of(ids: list[int]) -> torch.Tensor:
    return token_counts(torch.tensor(ids or [V], dtype=torch.long), V)


@pytest.mark.parametrize("penalty", [1.0, 1.1, 1.3, 2.0, 0.8])
def test_repetition_penalty_is_hugging_faces(penalty):
    logits = torch.randn(V, generator=torch.Generator().manual_seed(1)) * 4
    recent = [3, 3, 17, 250, 499, 0, 17]
    want = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([recent]), logits[None].clone())[0]
    got = penalize(logits, counts_of(recent), one(penalty), one(0.0), one(0.0))
    assert torch.allclose(got, want, atol=0, rtol=1e-6)
    unseen = torch.ones(V, dtype=torch.bool)
    unseen[recent] = False
    assert torch.equal(got[unseen], logits[unseen])


def test_presence_and_frequency_follow_openais_formula():
    """logit - count * frequency - [count > 0] * presence, written as a loop over the tokens."""
    logits = torch.randn(V, generator=torch.Generator().manual_seed(2))
    recent = [5, 5, 5, 9, 400, 9]
    want = logits.clone()
    for tok in set(recent):
        want[tok] -= recent.count(tok) * 0.7 + 0.4
    got = penalize(logits, counts_of(recent), one(1.0), one(0.4), one(0.7))
    assert torch.allclose(got, want, atol=1e-6)
    # negative values encourage repeats instead
    assert penalize(logits, counts_of(recent), one(1.0), one(-1.0), one(0.0))[9] == logits[9] + 1.0


@pytest.mark.parametrize("min_p", [0.0, 0.01, 0.1, 0.5, 1.0])
def test_min_p_keeps_what_hugging_faces_warper_keeps(min_p):
    logits = torch.randn(V, generator=torch.Generator().manual_seed(3)) * 3
    t, kth, top_p, mp = settings(SamplingConfig(temperature=0.8, min_p=min_p), V)
    probs = probabilities(logits, one(t), torch.tensor([kth]), one(top_p), one(mp))
    if min_p == 0:
        assert bool((probs > 0).all())
        return
    hf = MinPLogitsWarper(min_p)(None, (logits / 0.8)[None])[0]
    assert torch.equal(probs > 0, torch.isfinite(hf))
    assert torch.allclose(probs, hf.softmax(-1), atol=1e-6)


def test_min_p_after_top_k_and_top_p_keeps_the_intersection():
    logits = torch.log(torch.tensor([0.04, 0.4, 0.3, 0.2, 0.06]))
    cfg = SamplingConfig(temperature=1.0, top_p=0.95, min_p=0.3)  # 0.3 x 0.4 = 0.12 drops 0.04, 0.06
    g = torch.Generator().manual_seed(0)
    assert {int(sample_token(logits, cfg, g)) for _ in range(400)} == {1, 2, 3}


CONFIGS = [
    SamplingConfig(temperature=0.0, repetition_penalty=1.3),
    SamplingConfig(temperature=0.0, presence_penalty=1.5, frequency_penalty=0.5, repeat_last_n=4),
    SamplingConfig(temperature=1.0, min_p=0.05),
    SamplingConfig(temperature=0.8, top_k=40, top_p=0.9, min_p=0.1, repetition_penalty=1.2),
    SamplingConfig(temperature=1.2, frequency_penalty=1.0, repeat_last_n=3),
    SamplingConfig(temperature=1.0, repetition_penalty=0.7, presence_penalty=-1.0),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=repr)
def test_host_and_device_samplers_count_the_same_reply_with_penalties(cfg):
    """The device sampler's ring (start_reply, remember) and the host's list of the reply give
    the same counts, window and all: the same penalized logits at every step, and the device's
    draw is a token the host's rules keep. Each drawn token joins the reply, so the penalties
    change from draw to draw. (The host's CPU draw races only the kept tokens, with a random
    stream of its own: test_sampling.py.)"""
    base = torch.randn(V, generator=torch.Generator().manual_seed(4)) * 2
    out = torch.zeros(1, dtype=torch.long)
    dev = DeviceSampler(base.clone(), out)
    dev.gen = torch.Generator().manual_seed(9)
    dev.set(cfg)
    dev.start_reply(cfg)
    temperature, kth, top_p, min_p = settings(cfg, V)
    reply, picks = [], []
    for _ in range(40):
        recent = torch.tensor(reply[-window(cfg):], dtype=torch.long)
        host = penalize(base, token_counts(recent, V), one(cfg.repetition_penalty), one(cfg.presence_penalty),
                        one(cfg.frequency_penalty))
        assert torch.equal(dev._penalized(), host)
        dev.greedy_penalized() if cfg.temperature <= 0 else dev.sample()
        token = int(out[0])
        if cfg.temperature <= 0:
            assert token == int(host.argmax()) == int(sample_token(base, cfg, None, reply))
        else:
            assert probabilities(host, one(temperature), torch.tensor([kth]), one(top_p), one(min_p))[token] > 0
        reply.append(token)
        dev.remember(token)
        picks.append(token)
    assert len(set(picks)) > 3  # the penalties pushed it off its favourite tokens


def test_penalties_off_leave_the_draws_unchanged():
    logits = torch.randn(V, generator=torch.Generator().manual_seed(5))
    cfg = SamplingConfig(temperature=1.0, top_k=20)
    a = [int(sample_token(logits, cfg, g)) for g in [torch.Generator().manual_seed(1)] for _ in range(30)]
    b = [int(sample_token(logits, cfg, g, [1, 2, 3])) for g in [torch.Generator().manual_seed(1)] for _ in range(30)]
    assert a == b


def test_the_generator_penalizes_the_replys_last_n_tokens():
    """Greedy with penalties on random:tiny: every token is the argmax of the plain logits
    penalized by the counts of the tokens fed since configure, the last repeat_last_n of them
    (not the prompt's)."""
    lm = load_model("random:tiny")
    gen = Generator(lm.model, lm.model.new_cache(256), lm.tokenizer.vocab_size)
    cfg = SamplingConfig(temperature=0.0, repetition_penalty=1.8, presence_penalty=0.5, repeat_last_n=5)
    gen.configure(cfg)
    prompt = [7, 8, 9, 10, 11, 12] * 4
    gen.prefill(prompt)
    reply, vocab = [], lm.tokenizer.vocab_size
    for _ in range(30):
        logits = gen.logits.clone()
        tok = gen.sample()
        ids = torch.tensor(reply[-5:] or [vocab], dtype=torch.long)
        want = penalize(logits, token_counts(ids, vocab), one(1.8), one(0.5), one(0.0)).argmax()
        assert tok == int(want)
        reply.append(tok)
        gen.feed(tok)
    unpenalized = greedy(Generator(lm.model, lm.model.new_cache(256), vocab), prompt, 30)
    assert unpenalized != reply  # the penalties changed the reply
    assert len(set(reply)) > len(set(unpenalized))
