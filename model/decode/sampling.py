"""Sampling: greedy, temperature, top-k, top-p, min-p and the repetition penalties, one
implementation for the host and the device.

`penalize` and `probabilities` are the maths (fixed shapes, no host sync: capturable). The
eager decode draws from them with torch.multinomial (`sample_token`); the CUDA-graph decode
with `race` (`DeviceSampler`, its settings in device tensors so that one captured graph serves
every setting). For one sample multinomial *is* that exponential race, after a host-side check
of the probabilities, and both take their settings from `settings`: for the same logits,
config, recent tokens and generator state they draw the same token (tests check this on the
CPU, where both run).

The penalties (docs/sampling.md) count the tokens of the reply being written, its last
`repeat_last_n`: the prompt, the chat template's markers and the user's words are never
penalized, so a stop token or a name the user gave stays as likely as the model makes it.
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
    min_p: float = 0.0               # 0 means off: drop tokens below min_p x the best one's probability
    repetition_penalty: float = 1.0  # 1 means off: a seen token's logit is divided (>0) or multiplied (<0) by it
    presence_penalty: float = 0.0    # subtracted once from a seen token's logit
    frequency_penalty: float = 0.0   # subtracted per occurrence
    repeat_last_n: int = 64          # the window of the reply the penalties look at

    @property
    def penalized(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


# Below this, top_p keeps only the top token anyway (its runner-up holds at least 1/V of the
# mass); the floor stops a tiny top_p from rounding to 0 in float32 and dropping every token.
MIN_TOP_P = 1e-6
MIN_TEMPERATURE = 1e-6  # 1e-300 must not turn the logits into inf
TOP_P_OFF = 2.0         # no token has 2 of probability mass before it: nothing is dropped
WINDOW_MAX = 1024       # repeat_last_n's ceiling: the device keeps a ring of this many token ids


def settings(cfg: SamplingConfig, vocab: int) -> tuple[float, int, float, float]:
    """`probabilities`' (temperature, index of the k-th best token, top_p, min_p): floors applied,
    and an 'off' setting made one that keeps every token."""
    kth = (min(cfg.top_k, vocab) if cfg.top_k > 0 else vocab) - 1
    top_p = max(cfg.top_p, MIN_TOP_P) if cfg.top_p < 1.0 else TOP_P_OFF
    return max(cfg.temperature, MIN_TEMPERATURE), kth, top_p, min(max(cfg.min_p, 0.0), 1.0)


def window(cfg: SamplingConfig) -> int:
    return max(1, min(cfg.repeat_last_n, WINDOW_MAX))


def token_counts(recent: torch.Tensor, vocab: int) -> torch.Tensor:
    """(V,) float32 occurrences of each id in `recent` (int64); the id `vocab` is padding."""
    counts = torch.zeros(vocab + 1, device=recent.device)
    return counts.scatter_add_(0, recent, torch.ones_like(recent, dtype=torch.float32))[:vocab]


def penalize(logits: torch.Tensor, counts: torch.Tensor, repetition: torch.Tensor,
             presence: torch.Tensor, frequency: torch.Tensor) -> torch.Tensor:
    """Float32 logits after the penalties: CTRL's repetition penalty as Hugging Face and
    llama.cpp apply it (a seen token's positive logit divided by it, a negative one multiplied),
    then OpenAI's `logit - frequency * count - presence * [count > 0]`. Settings: float32 (1,)."""
    logits = logits.float()
    seen = counts > 0
    scaled = torch.where(logits > 0, logits / repetition, logits * repetition)
    return torch.where(seen, scaled, logits) - frequency * counts - presence * seen.float()


def probabilities(logits: torch.Tensor, temperature: torch.Tensor, kth: torch.Tensor,
                  top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """(V,) probabilities in vocabulary order, after temperature, top-k, top-p and min-p.
    temperature, top_p and min_p: float32 (1,) tensors, kth: int64 (1,), on the logits' device."""
    logits = logits.float() / temperature
    sorted_l, order = torch.sort(logits, descending=True)
    # Top-k by value: the k-th best stays, and so does every token tied with it.
    sorted_l = sorted_l.masked_fill(sorted_l < sorted_l.gather(-1, kth), float("-inf"))
    probs = sorted_l.softmax(-1)
    # Drop a token once the mass before it already reaches top_p; the first always stays.
    # min_p compares with the best token: a ratio of probabilities, which top-p's cut of the
    # tail does not change, so one mask from the same probabilities is top-p then min-p.
    drop = (probs.cumsum(-1) - probs >= top_p) | (probs < min_p * probs[..., :1])
    sorted_l = sorted_l.masked_fill(drop, float("-inf"))
    return logits.scatter(-1, order, sorted_l).softmax(-1)


# top_candidates' reach: the best this many tokens, found without sorting the vocabulary; a
# wider second try still costs a tenth of the sort (1.1 ms against 18.6 for 262,144 tokens)
TOP_CANDIDATES = (64, 1024)
EXP_FLOOR = -87.0   # exp(-87) ~ 1.6e-38: the smallest power of e that float32 holds as a normal number


def top_candidates(logits: torch.Tensor, temperature: float, kth: int, top_p: float,
                   min_p: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The tokens `probabilities` keeps for one (V,) vector and their probabilities, best first,
    found among the best TOP_CANDIDATES without sorting the vocabulary (15 ms of a token's 21 on
    one core for a 151,936-token vocabulary); None when the kept tokens reach past them or a
    logit is NaN or inf (the caller takes the plain path).

    The cut compares the same probabilities `probabilities` computes, their normaliser summed in
    another order: a token whose preceding mass is within float rounding (~1e-7) of top_p may
    fall the other way."""
    logits = logits.float()
    vocab = logits.shape[-1]
    z = inside = None
    for k in (min(k, vocab) for k in TOP_CANDIDATES):
        if kth < vocab - 1 and kth >= k:
            continue   # top-k's threshold lies past these candidates
        vals, idx = torch.topk(logits, k)
        if not bool(torch.isfinite(vals[0])):
            return None   # NaN or inf: the plain path, whose multinomial reports it
        if z is None:
            z, inside = normaliser(logits, vals[0], vals[kth] if kth < vocab - 1 else None, temperature)
        probs = ((vals - vals[0]) / temperature).exp() / z
        drop = (probs.cumsum(-1) - probs >= top_p) | (probs < min_p * probs[0])
        if kth < vocab - 1:
            drop |= vals < vals[kth]
        kept = int(drop.int().argmax()) if bool(drop.any()) else k
        if kept < k or inside <= k:
            return idx[:kept], probs[:kept]
    return None   # the cut falls past the widest candidates


def normaliser(logits: torch.Tensor, best: torch.Tensor, thr: torch.Tensor | None,
               temperature: float) -> tuple[torch.Tensor, int]:
    """The softmax's denominator relative to the best token (over the tokens top-k's threshold
    `thr` keeps, ties included) and how many tokens that is. The scaled logits are clamped where
    exp leaves float32's normal range: a denormal result takes the CPU's slow path, and at
    temperature 0.2 most of a vocabulary lands there (565 µs a token, not 27). What the clamp
    adds, V * exp(-87) ~ 1e-33, is below the sum's rounding."""
    exps = ((logits - best) / temperature).clamp_(min=EXP_FLOOR).exp_()
    if thr is None:
        return exps.sum(), logits.shape[-1]
    return exps.masked_fill_(logits < thr, 0.0).sum(), int((logits >= thr).sum())


def race(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """A 0-d int64 token drawn from `probs` with no host sync: argmax(p / E), E ~ Exp(1), the
    draw torch.multinomial makes for one sample (the same generator gives the same token)."""
    noise = torch.empty_like(probs).exponential_(generator=gen)
    return (probs / noise).argmax(-1)


def _scalar(value: float, dev: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # torch.full launches a fill with the value as its argument: no copy, so no host sync.
    return torch.full((1,), value, dtype=dtype, device=dev)


def sample_token(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None,
                 recent: list[int] | None = None) -> torch.Tensor:
    """Sample from (V,) logits on their device; `recent`: the reply's tokens so far, which the
    penalties count (their last `repeat_last_n`). Returns a 0-d int64 tensor."""
    dev, vocab = logits.device, logits.shape[-1]
    if cfg.penalized and recent:
        ids = torch.tensor(recent[-window(cfg):], dtype=torch.long, device=dev)
        logits = penalize(logits, token_counts(ids, vocab), _scalar(cfg.repetition_penalty, dev),
                          _scalar(cfg.presence_penalty, dev), _scalar(cfg.frequency_penalty, dev))
    if cfg.temperature <= 0:
        return logits.argmax(-1)
    temperature, kth, top_p, min_p = settings(cfg, vocab)
    filtered = kth < vocab - 1 or top_p != TOP_P_OFF or min_p > 0
    host = logits.dim() == 1 and logits.device.type == "cpu"
    if filtered and host and (kept := top_candidates(logits, temperature, kth, top_p, min_p)):
        # The race among the kept tokens only: V exponentials cost 1 ms a token on a
        # 49,152-token vocabulary (a fifth of the default model's step), 64 cost nothing. The
        # same distribution, its own random stream. On the GPU, where each of the candidates'
        # host questions would be a sync, the eager draw stays the graph's whole-vocabulary race.
        ids, probs = kept
        return ids[(probs / torch.empty_like(probs).exponential_(generator=gen)).argmax()]
    t = _scalar(temperature, dev)
    if not filtered:  # nothing to drop: the same maths without its sort
        probs = (logits.float() / t).softmax(-1)
    else:
        probs = probabilities(logits, t, _scalar(kth, dev, torch.long), _scalar(top_p, dev), _scalar(min_p, dev))
    # multinomial is `race` plus a check of the probabilities on the host (the caller syncs on
    # the token anyway): NaN logits from a broken model raise here instead of picking a token.
    return torch.multinomial(probs, 1, generator=gen)[0]


class DeviceSampler:
    """`penalize`, `probabilities` and `race` over fixed buffers, settings held in device
    tensors: `greedy()`, `greedy_penalized()` or `sample()` writes the token into `out`, so each
    can be captured once and replayed for any setting. The reply's recent tokens live in a
    device ring (`remember`), padded with the id V, which counts for nothing."""

    def __init__(self, logits: torch.Tensor, out: torch.Tensor):
        self.logits, self.out = logits, out
        dev, self.vocab = logits.device, logits.shape[-1]
        self.temperature = torch.ones(1, device=dev)
        self.kth = torch.full((1,), self.vocab - 1, dtype=torch.long, device=dev)
        self.top_p = torch.full((1,), TOP_P_OFF, device=dev)
        self.min_p = torch.zeros(1, device=dev)
        self.repetition = torch.ones(1, device=dev)
        self.presence = torch.zeros(1, device=dev)
        self.frequency = torch.zeros(1, device=dev)
        self.recent = torch.full((WINDOW_MAX,), self.vocab, dtype=torch.long, device=dev)
        self.slot, self.ring = 0, 1
        self.gen: torch.Generator | None = None

    def set(self, cfg: SamplingConfig) -> None:
        temperature, kth, top_p, min_p = settings(cfg, self.vocab)
        for buf, value in ((self.temperature, temperature), (self.kth, kth), (self.top_p, top_p),
                           (self.min_p, min_p), (self.repetition, cfg.repetition_penalty),
                           (self.presence, cfg.presence_penalty), (self.frequency, cfg.frequency_penalty)):
            buf.fill_(value)

    def start_reply(self, cfg: SamplingConfig) -> None:
        """A new reply: nothing seen yet, and the ring as long as its window."""
        self.recent.fill_(self.vocab)
        self.slot, self.ring = 0, window(cfg)

    def remember(self, token: int) -> None:
        """A token of the reply went into the cache: it now counts, replacing the oldest one
        once the window is full (a fill kernel with the id as its argument: no host sync)."""
        self.recent[self.slot].fill_(token)
        self.slot = (self.slot + 1) % self.ring

    def _penalized(self) -> torch.Tensor:
        return penalize(self.logits, token_counts(self.recent, self.vocab), self.repetition,
                        self.presence, self.frequency)

    def greedy(self) -> None:
        self.out.copy_(self.logits.argmax(-1, keepdim=True))

    def greedy_penalized(self) -> None:
        self.out.copy_(self._penalized().argmax(-1, keepdim=True))

    def sample(self) -> None:
        probs = probabilities(self._penalized(), self.temperature, self.kth, self.top_p, self.min_p)
        self.out.copy_(race(probs, self.gen))
