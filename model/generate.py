"""Prefill, decode and sampling for one sequence over a persistent KVCache.

The session drives it token by token: `prefill(ids)` pushes tokens into the cache in
bounded chunks, `sample()` picks the next token from the last logits, `feed(tok)` runs one
decode step. A token that is sampled but not yet fed is "pending": it is in the
conversation but not in the cache, which is exactly what the cache invariant allows.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kvcache import KVCache

if TYPE_CHECKING:
    from model.graphs import GraphConfig


@dataclass
class SamplingConfig:
    temperature: float = 0.0   # 0 means greedy
    top_k: int = 0             # 0 means off
    top_p: float = 1.0         # 1 means off
    seed: int | None = None


# Below this, top_p keeps only the top token anyway (its runner-up holds at least 1/V of the
# mass); the floor stops a tiny top_p from rounding to 0 in float32 and dropping every token.
MIN_TOP_P = 1e-6


def sample_token(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None) -> torch.Tensor:
    """Sample from (V,) logits on their device; returns a 0-d int64 tensor (no host sync)."""
    if cfg.temperature <= 0:
        return logits.argmax(-1)
    logits = logits.float() / max(cfg.temperature, 1e-6)  # like the device sampler: 1e-300 must not make inf
    if cfg.top_k > 0:
        kth = torch.topk(logits, min(cfg.top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token once the mass before it already reaches top_p; the first always stays.
        drop = probs.cumsum(-1) - probs >= max(cfg.top_p, MIN_TOP_P)
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=gen)[0]


class Generator:
    """One per loaded model and cache. Holds the last logits between calls."""

    def __init__(self, model: torch.nn.Module, cache: KVCache, vocab_size: int, prefill_chunk: int = 512,
                 graphs: GraphConfig | None | str = "auto"):
        self.model, self.cache, self.prefill_chunk = model, cache, prefill_chunk
        # Padded vocabularies (and random models) have ids the tokenizer cannot decode: never sample them.
        self.vocab_size = vocab_size
        self.device = cache.device
        self.logits: torch.Tensor | None = None
        self.rng = torch.Generator(device=self.device)
        self.sampling = SamplingConfig()
        self.graphs = self._make_graphs(graphs) if self.device.type == "cuda" else None

    def _make_graphs(self, cfg: GraphConfig | None | str):
        """On CUDA, decode through a captured graph (model/graphs.py); eager if that is off or
        the architecture has no capturable step."""
        from model.graphs import GraphConfig, GraphDecoder

        auto = cfg == "auto"
        if auto:
            cfg = GraphConfig.from_env()
        if cfg is None:
            return None
        try:
            return GraphDecoder(self.model, self.cache, self.vocab_size, cfg, self.rng)
        except NotImplementedError:
            return None
        except Exception as e:  # the app still chats, eagerly; an explicit config (tests, bench) raises
            if not auto:
                raise
            warnings.warn(f"CUDA-graph decode unavailable, decoding eagerly: {e}", stacklevel=2)
            return None

    def configure(self, sampling: SamplingConfig) -> None:
        self.sampling = sampling
        if sampling.seed is not None:
            self.rng.manual_seed(sampling.seed)

    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> None:
        """Push `ids` into the cache in chunks, so memory stays bounded for long inputs."""
        self.cache.check_fits(len(ids))
        if self.graphs is not None:
            self.graphs.settle()
        for i in range(0, len(ids), self.prefill_chunk):
            chunk = torch.tensor([ids[i:i + self.prefill_chunk]], dtype=torch.long, device=self.device)
            self.logits = self.model(chunk, self.cache)[0, -1, :self.vocab_size]
        if self.graphs is not None and ids:
            self.graphs.load_logits(self.logits, ids[-1])
            self.logits = self.graphs.logits

    @torch.inference_mode()
    def feed(self, tok: int) -> None:
        if self.graphs is not None:
            self.graphs.feed(tok)
            self.logits = self.graphs.logits
            return
        x = torch.tensor([[tok]], dtype=torch.long, device=self.device)
        self.logits = self.model(x, self.cache)[0, -1, :self.vocab_size]

    @torch.inference_mode()
    def sample(self) -> int:
        if self.logits is None:
            raise RuntimeError("nothing to sample from: prefill first")
        if self.graphs is not None:
            return self.graphs.sample(self.sampling)
        return int(sample_token(self.logits, self.sampling, self.rng))  # the one host sync per token

    def forget(self) -> None:
        """Drop the last logits: after a rewind they no longer belong to the cache end."""
        self.logits = None
        if self.graphs is not None:
            self.graphs.settle()
