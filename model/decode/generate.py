"""Prefill and decode for one sequence over a persistent KVCache (sampling: model/decode/sampling.py).

The session drives it token by token: `prefill(ids)` pushes tokens into the cache in
bounded chunks (on CUDA through captured graphs at bucketed lengths: model/decode/prefill_graphs.py),
`sample()` picks the next token from the last logits, `feed(token)` runs one
decode step (on the CPU, quantized models decode through one C call a token:
model/cpu/). A token that is sampled but not yet fed is "pending": it is in the
conversation but not in the cache, which is exactly what the cache invariant allows.
"""

from __future__ import annotations

import warnings

import torch

from kvcache import KVCache
from model.cpu.step import STEPS_BELOW
from model.decode.graph_config import GraphConfig
from model.decode.graphs import GraphDecoder
from model.decode.prefill_graphs import PrefillGraphs, chunk_tokens
from model.decode.sampling import WINDOW_MAX, SamplingConfig, sample_token
from model.decode.steps import cpu_step


class Generator:
    """One per loaded model and cache. Holds the last logits between calls."""

    def __init__(self, model: torch.nn.Module, cache: KVCache, vocab_size: int, prefill_chunk: int | None = None,
                 graphs: GraphConfig | None | str = "auto"):
        self.model, self.cache = model, cache
        # The CPU keeps 512-token chunks; on CUDA a chunk is as large as memory allows.
        cuda = cache.device.type == "cuda"
        self.prefill_chunk = prefill_chunk or (chunk_tokens(model, cache.device) if cuda else 512)
        # Padded vocabularies (and random models) have ids the tokenizer cannot decode: never sample them.
        self.vocab_size = vocab_size
        self.device = cache.device
        self.logits: torch.Tensor | None = None
        self.rng = torch.Generator(device=self.device)
        self.sampling = SamplingConfig()
        self.reply: list[int] = []  # the tokens fed since `configure`: what the penalties count
        self.graphs = self._make_graphs(graphs) if self.device.type == "cuda" else None
        self.prefill_graphs = self._make_prefill() if self.graphs is not None else None
        if self.prefill_graphs is not None and prefill_chunk is None:
            # A caller's chunks (a trim's progress steps) then split a prefill where one call would.
            self.prefill_chunk = self.prefill_graphs.max_bucket
        self.cpu_step = cpu_step(model, cache) if self.device.type == "cpu" else None

    def _make_graphs(self, cfg: GraphConfig | None | str):
        """On CUDA, decode through a captured graph (model/decode/graphs.py); eager if that is off or
        the architecture has no capturable step."""
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

    def _make_prefill(self) -> PrefillGraphs | None:
        """Graph prefill rides with graph decode: `graphs=None` (the eager reference) has neither."""
        cfg = self.graphs.cfg
        if not cfg.prefill:
            return None
        try:
            return PrefillGraphs(self.model, self.cache, cfg.num_splits, cfg.prefill_bucket,
                                 fused=cfg.fused and cfg.prefill_fused, pool=self.graphs.pool)
        except NotImplementedError:
            return None

    def configure(self, sampling: SamplingConfig) -> None:
        """A reply starts: its settings, and nothing yet for the penalties to count."""
        self.sampling = sampling
        self.reply = []
        if self.graphs is not None:
            self.graphs.sampler.start_reply(sampling)
        if sampling.seed is not None:
            self.rng.manual_seed(sampling.seed)

    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> None:
        """Push `ids` into the cache in chunks, so memory stays bounded for long inputs."""
        self.cache.check_fits(len(ids))
        if self.graphs is not None:
            self.graphs.settle()
        if self.prefill_graphs is not None and ids:
            self._prefill_graphs(ids)
        else:
            for i in range(0, len(ids), self.prefill_chunk):
                part = ids[i:i + self.prefill_chunk]
                if self.cpu_step is not None and len(part) < STEPS_BELOW:   # shorter than the GEMM's fixed cost
                    self.logits = self.cpu_step.prefill(part)[:self.vocab_size]
                    continue
                chunk = torch.tensor([part], dtype=torch.long, device=self.device)
                self.logits = self.model(chunk, self.cache, last=True)[0, -1, :self.vocab_size]
        if self.graphs is not None and ids:
            self.graphs.load_logits(self.logits, ids[-1])
            self.logits = self.graphs.logits

    def _prefill_graphs(self, ids: list[int]) -> None:
        """The largest bucket back to back, then the smallest that holds the rest; a chunk whose
        padding would run past the cache's capacity goes eagerly instead."""
        pg, dev = self.prefill_graphs, torch.tensor(ids, dtype=torch.long, device=self.device)
        i = 0
        while i < len(ids):
            n = min(len(ids) - i, pg.max_bucket)
            bucket = pg.bucket_for(n)
            if bucket is not None:
                logits = pg.run(dev[i:i + n], bucket)
            else:
                n = min(len(ids) - i, self.prefill_chunk)
                logits = self.model(dev[None, i:i + n], self.cache, last=True)[0, -1]
            i += n
        self.logits = logits[:self.vocab_size]
        if (attn := getattr(self.model, "attn", None)) is not None:
            attn.used.update(pg.names)

    @torch.inference_mode()
    def feed(self, token: int) -> None:
        self.reply.append(token)
        if len(self.reply) > 2 * WINDOW_MAX:  # only the last window counts; bound the list
            del self.reply[:-WINDOW_MAX]
        if self.graphs is not None:
            self.graphs.feed(token)
            if self.sampling.penalized:
                self.graphs.sampler.remember(token)
            self.logits = self.graphs.logits
            return
        if self.cpu_step is not None:
            self.logits = self.cpu_step(token)[:self.vocab_size]
            return
        x = torch.tensor([[token]], dtype=torch.long, device=self.device)
        self.logits = self.model(x, self.cache)[0, -1, :self.vocab_size]

    @torch.inference_mode()
    def sample(self) -> int:
        if self.logits is None:
            raise RuntimeError("nothing to sample from: prefill first")
        if self.graphs is not None:
            return self.graphs.sample(self.sampling)
        if self.cpu_step is None:
            return int(sample_token(self.logits, self.sampling, self.rng, self.reply))  # the one host sync per token
        # The sampler's few torch ops on one thread: on two, torch's OpenMP worker spins after
        # each op and takes a core from the C step's next token (7-10% of the default model's decode
        # at the default settings). Setting the count costs 0.2 µs.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return int(sample_token(self.logits, self.sampling, self.rng, self.reply))
        finally:
            torch.set_num_threads(threads)

    def forget(self) -> None:
        """Drop the last logits: after a rewind they no longer belong to the cache end."""
        self.logits = None
        if self.graphs is not None:
            self.graphs.settle()
