"""Sampling: greedy, temperature, top-k and top-p, one implementation for the host and the device.

`probabilities` is the maths (fixed shapes, no host sync: capturable). The eager decode
draws from it with torch.multinomial (`sample_token`); the CUDA-graph decode with `race`
(`DeviceSampler`, its settings in device tensors so that one captured graph serves every
setting). For one sample multinomial *is* that exponential race, after a host-side check of
the probabilities, and both take their settings from `settings`: for the same logits, config
and generator state they draw the same token (tests check this on the CPU, where both run).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingConfig:
    temperature: float = 0.0   # 0 means greedy
    top_k: int = 0             # 0 means off
    top_p: float = 1.0         # 1 means off
    seed: int | None = None


# Below this, top_p keeps only the top token anyway (its runner-up holds at least 1/V of the
# mass); the floor stops a tiny top_p from rounding to 0 in float32 and dropping every token.
MIN_TOP_P = 1e-6
MIN_TEMPERATURE = 1e-6  # 1e-300 must not turn the logits into inf
TOP_P_OFF = 2.0         # no token has 2 of probability mass before it: nothing is dropped


def settings(cfg: SamplingConfig, vocab: int) -> tuple[float, int, float]:
    """`probabilities`' (temperature, index of the k-th best token, top_p): floors applied, and an
    'off' setting made one that keeps every token."""
    kth = (min(cfg.top_k, vocab) if cfg.top_k > 0 else vocab) - 1
    top_p = max(cfg.top_p, MIN_TOP_P) if cfg.top_p < 1.0 else TOP_P_OFF
    return max(cfg.temperature, MIN_TEMPERATURE), kth, top_p


def probabilities(logits: torch.Tensor, temperature: torch.Tensor, kth: torch.Tensor,
                  top_p: torch.Tensor) -> torch.Tensor:
    """(V,) probabilities in vocabulary order, after temperature, top-k and top-p. temperature
    and top_p: float32 (1,) tensors, kth: int64 (1,), on the logits' device."""
    logits = logits.float() / temperature
    sorted_l, order = torch.sort(logits, descending=True)
    # Top-k by value: the k-th best stays, and so does every token tied with it.
    sorted_l = sorted_l.masked_fill(sorted_l < sorted_l.gather(-1, kth), float("-inf"))
    probs = sorted_l.softmax(-1)
    # Drop a token once the mass before it already reaches top_p; the first always stays.
    sorted_l = sorted_l.masked_fill(probs.cumsum(-1) - probs >= top_p, float("-inf"))
    return logits.scatter(-1, order, sorted_l).softmax(-1)


def race(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """A 0-d int64 token drawn from `probs` with no host sync: argmax(p / E), E ~ Exp(1), the
    draw torch.multinomial makes for one sample (the same generator gives the same token)."""
    noise = torch.empty_like(probs).exponential_(generator=gen)
    return (probs / noise).argmax(-1)


def sample_token(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None) -> torch.Tensor:
    """Sample from (V,) logits on their device; returns a 0-d int64 tensor."""
    if cfg.temperature <= 0:
        return logits.argmax(-1)
    temperature, kth, top_p = settings(cfg, logits.shape[-1])
    dev = logits.device
    # torch.full launches a fill with the value as its argument: no copy, so no host sync.
    t = torch.full((1,), temperature, device=dev)
    if kth == logits.shape[-1] - 1 and top_p == TOP_P_OFF:  # nothing to drop: the same maths without its sort
        probs = (logits.float() / t).softmax(-1)
    else:
        probs = probabilities(logits, t, torch.full((1,), kth, dtype=torch.long, device=dev),
                              torch.full((1,), top_p, device=dev))
    # multinomial is `race` plus a check of the probabilities on the host (the caller syncs on
    # the token anyway): NaN logits from a broken model raise here instead of picking a token.
    return torch.multinomial(probs, 1, generator=gen)[0]


class DeviceSampler:
    """`probabilities` and `race` over fixed buffers, settings held in device tensors: `greedy()` or `sample()`
    writes the token into `out`, so each can be captured once and replayed for any setting."""

    def __init__(self, logits: torch.Tensor, out: torch.Tensor):
        self.logits, self.out = logits, out
        dev = logits.device
        self.temperature = torch.ones(1, device=dev)
        self.kth = torch.full((1,), logits.shape[-1] - 1, dtype=torch.long, device=dev)
        self.top_p = torch.full((1,), TOP_P_OFF, device=dev)
        self.gen: torch.Generator | None = None

    def set(self, cfg: SamplingConfig) -> None:
        temperature, kth, top_p = settings(cfg, self.logits.shape[-1])
        self.temperature.fill_(temperature)
        self.kth.fill_(kth)
        self.top_p.fill_(top_p)

    def greedy(self) -> None:
        self.out.copy_(self.logits.argmax(-1, keepdim=True))

    def sample(self) -> None:
        self.out.copy_(race(probabilities(self.logits, self.temperature, self.kth, self.top_p), self.gen))
