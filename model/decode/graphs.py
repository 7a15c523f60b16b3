"""CUDA-graph decode: one captured step per session, replayed for every token.

The step (model/decode/) reads the token from a static buffer and its position from
`cache_seqlens` on the device and writes static logits, so one capture stays valid at any
position: across turns, rewinds, /reset and trims. Sampling is a second small graph that
writes the token straight into the step's input buffer.

One host sync per token: `sample()` copies the token to pinned memory and, before waiting
for it, already launches the next step with it (lookahead): its K/V land at cache_seqlens,
past the cache's end, where nothing reads them (docs/cache-invariant.md). Only `feed()` of
that same token advances the cache; anything else (a stop token, a rewind, another token)
just drops the speculative result. So `cache_seqlens == cache.seqlen` holds at every moment.

Greedy decoding skips the sampler graph: the step graph ends with the argmax itself
(decode/greedy.py), which leaves the token in the step's input and in a pinned host slot,
so a greedy token costs one graph launch and an event.
"""

from __future__ import annotations

import torch

from kvcache import KVCache
from model.decode import triton_available
from model.decode.capture import capture
from model.decode.graph_config import GraphConfig
from model.decode.sampling import DeviceSampler, SamplingConfig
from model.decode.steps import build_step


class GraphDecoder:
    """Captured decode for one model and cache: `feed(token)` and `sample(cfg)`."""

    def __init__(self, model: torch.nn.Module, cache: KVCache, vocab_size: int, cfg: GraphConfig,
                 rng: torch.Generator | None = None):
        step = build_step(model, cache, cfg)
        if step is None:
            raise NotImplementedError(f"no capturable decode step for {type(model).__name__}")
        self.step, self.cache, self.cfg = step, cache, cfg
        self.attn = model.attn if hasattr(model, "attn") else None
        self.logits = step.logits[:vocab_size]
        self.sampler = DeviceSampler(self.logits, step.token)
        self.pool = torch.cuda.graph_pool_handle()  # the prefill graphs share it (decode/generate.py)
        self.host_token = torch.zeros(1, dtype=torch.long).pin_memory()
        self.events = [torch.cuda.Event() for _ in range(4)]  # a ring: at most two are waited on at once
        self.ahead: tuple[int, int] | None = None   # (pos, token) of a step launched speculatively
        self.picked: tuple[int, torch.cuda.Event] | None = None  # the latest replay's position, done-event
        self.last_token: int | None = None          # the newest token in the cache
        self.mode: str | None = None
        self.picks = triton_available()  # else greedy goes through the sampler graph
        self.host_picks = torch.zeros(cache.capacity + 1, dtype=torch.long).pin_memory()
        self.pdl = getattr(step, "pdl", False)
        with torch.inference_mode():
            self.step_graph = self._capture(self._step_and_pick)
            self.sample_graphs = {"greedy": self._capture(self.sampler.greedy)}
            self.sample_graphs["sample"] = self._capture(self.sampler.sample, rng)
            self.sample_graphs["greedy_penalized"] = self._capture(self.sampler.greedy_penalized)
        self.name = getattr(step, "name", "graph")

    def _capture(self, fn, rng: torch.Generator | None = None) -> torch.cuda.CUDAGraph:
        if self.cache.free < 1:
            raise RuntimeError("cannot capture the decode step with a full cache")
        if rng is not None and hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
            self.sampler.gen = rng
        # two warm-ups compile the kernels; their K/V land past the end (decode/capture.py)
        return capture(fn, self.cache.device, self.pool, warmups=2, rng=rng)

    def _step_and_pick(self) -> None:
        self.step()
        if self.picks:
            # Lazy: greedy.py imports triton, absent where no kernel runs (self.picks is False there).
            from model.decode.greedy import greedy_pick
            greedy_pick(self.logits, self.cache.cache_seqlens, self.step.token, self.host_picks, self.pdl)

    def _replay(self) -> None:
        """One step at cache_seqlens; its greedy token lands in host slot `cache.seqlen`."""
        self.step_graph.replay()
        self.events.append(ev := self.events.pop(0))
        ev.record()
        self.picked = (self.cache.seqlen, ev)

    # --- the state the host and the device must agree on -----------------------
    def settle(self) -> None:
        """Drop a speculative step: its K/V sit past the cache end and its logits are stale."""
        self.ahead = None
        self.picked = None

    def load_logits(self, logits: torch.Tensor, last_token: int) -> None:
        """After an eager prefill: its last logits become the sampler's input."""
        self.logits.copy_(logits)
        self.last_token = last_token
        self.picked = None

    # --- per token ----------------------------------------------------------------
    def feed(self, token: int) -> None:
        c = self.cache
        if self.ahead is not None:
            if self.ahead == (c.seqlen, token):  # already computed while the host read the token
                self.ahead = None
                self._advanced(token)
                return
            self.settle()
        c.check_fits(1)
        self.step.token.fill_(token)
        self._replay()
        self._advanced(token)

    def _advanced(self, token: int) -> None:
        self.cache.advance(1)  # host mirror and device counter, queued after the step
        self.last_token = token
        if self.attn is not None:
            self.attn.used.add(self.step.attn_name)

    def sample(self, cfg: SamplingConfig) -> int:
        if self.ahead is not None:  # sampled before, never fed: the logits moved on; recompute
            self._refeed_last()
        mode = ("greedy_penalized" if cfg.penalized else "greedy") if cfg.temperature <= 0 else "sample"
        pos = self.cache.seqlen
        picked = self.picked if mode == "greedy" and self.picks else None
        if picked is not None and picked[0] == pos - 1:  # the last step already picked it
            done, host = picked[1], self.host_picks[pos - 1:pos]
        else:
            if mode != "greedy" and self.mode != (key := repr(cfg)):
                self.sampler.set(cfg)
                self.mode = key
            self.sample_graphs[mode].replay()
            self.host_token.copy_(self.step.token, non_blocking=True)
            self.events.append(done := self.events.pop(0))
            done.record()
            host = self.host_token
        launched = self.cfg.lookahead and self.cache.free >= 1
        if launched:
            self._replay()
        done.synchronize()  # the one host sync per token
        token = int(host[0])
        if launched:
            self.ahead = (pos, token)
        return token

    def _refeed_last(self) -> None:
        self.settle()
        if self.last_token is None or self.cache.seqlen < 1:
            raise RuntimeError("no logits to sample from: prefill first")
        self.cache.rewind(self.cache.seqlen - 1)
        self.feed(self.last_token)
