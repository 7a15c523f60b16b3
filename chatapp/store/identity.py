"""Model identity: which exact model made a KV snapshot, and whose token ids a chat holds.

A snapshot is only valid for the model that computed it: same architecture config, same weight
bytes, same dtype, same attention backend on the same kind of device (they round differently).
We hash every parameter's bytes with SHA-256 once per loaded model. Measured on the 135M model
(538 MB in fp32) on a 2-core CPU: 0.4 s. On a CPU that runs in a background thread started when
the chat keeper is made, so it overlaps model warm-up and the user's typing; on a GPU it runs
lazily on first need (copying weights to the host from a second thread could disturb CUDA-graph
capture). A sampled hash would be faster but could miss a small fine-tune; docs/persistence.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import weakref
from dataclasses import dataclass

import torch

from model.cpu.qlinear import QLinear
from model.families.registry import backend_family
from model.loading import LoadedModel
from model.tokenizers.tokenizer import Tokenizer


@dataclass(frozen=True)
class ModelIdentity:
    config: str     # sha256 of the architecture class and its config
    weights: str    # sha256 of every parameter's name, shape, dtype and bytes
    dtype: str
    backend: str    # device type and attention backend, e.g. "cpu/sdpa", "cuda/fa3"

    @property
    def digest(self) -> str:
        return sha256_text("|".join((self.config, self.weights, self.dtype, self.backend)))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ModelIdentity:
        return cls(**json.loads(text))

    def mismatch(self, other: ModelIdentity) -> str | None:
        """Why a snapshot made by `other` cannot go into a cache of this model, or None."""
        if other.config != self.config:
            return "made by a model of another architecture"
        if other.dtype != self.dtype:  # before weights: the same weights in another dtype hash apart
            return f"made in {other.dtype}, this session runs {self.dtype}"
        if other.weights != self.weights:
            return "made by a model with other weights"
        if other.backend != self.backend:
            return f"made with {other.backend}, this session uses {self.backend}"
        return None


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# Config fields added after chats were first stored, with the value that means "as before". At that
# value they stay out of the hash, so a model's identity (and its chats' KV snapshots) survives a
# release that teaches the config something new.
LATER_FIELDS = {"attention_bias": False, "qk_norm": False, "rope_scaling": None, "rope_freq_factors": None}


# The model classes are hashed under the modules they lived in when chats were first stored:
# moving a file (issue 25 laid model/ out by role) must not orphan every stored KV snapshot.
STORED_MODULES = {"model.families.llama": "model.llama", "model.families.gemma": "model.gemma",
                  "model.families.nanochat": "model.nanochat"}


def config_hash(model: torch.nn.Module) -> str:
    cfg = getattr(model, "config", None)
    if dataclasses.is_dataclass(cfg):
        fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in LATER_FIELDS or LATER_FIELDS[k] != v}
        body = json.dumps(fields, sort_keys=True, default=str)
    else:
        body = repr(cfg)
    module = STORED_MODULES.get(type(model).__module__, type(model).__module__)
    return sha256_text(f"{module}.{type(model).__qualname__}:{body}")


def weights_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    # Tied weights are listed once. A QLinear's weights are buffers (the file's blocks); other
    # modules' buffers stay out, so the identities of older chats' models do not change.
    quantized = [(f"{m}.{b}", t) for m, mod in model.named_modules() if isinstance(mod, QLinear)
                 for b, t in mod.named_buffers(recurse=False) if t is not None]
    for name, p in [*model.named_parameters(), *quantized]:
        t = p.detach()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        # hashlib releases the GIL on large buffers, so this thread does not stall generation.
        h.update(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


class Fingerprint:
    """The identity of one loaded model, computed once (in the background on a CPU)."""

    _cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, lm: LoadedModel):
        self.model = lm.model
        self._value: ModelIdentity | None = self._cache.get(lm.model)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if self._value is None and next(lm.model.parameters()).device.type == "cpu":
            # Not a daemon: a process that exits mid-hash would abort inside torch (seen as SIGABRT).
            self._thread = threading.Thread(target=self.get, name="fingerprint")
            self._thread.start()

    def get(self) -> ModelIdentity:
        with self._lock:
            if self._value is None:
                self._value = self._cache.get(self.model) or self._compute()
                self._cache[self.model] = self._value
            return self._value

    def _compute(self) -> ModelIdentity:
        p = next(self.model.parameters())
        dtype = str(p.dtype).removeprefix("torch.")
        if any(isinstance(m, QLinear) for m in self.model.modules()):
            dtype = "blocks/float16-cache"   # the file's quantization, an fp16 cache: not the fp32 reference
        return ModelIdentity(config_hash(self.model), weights_hash(self.model), dtype, backend_family(self.model))


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """Stored token ids are reusable by another model iff this matches: same pieces, same ids."""
    if hasattr(tokenizer, "fingerprint"):   # a tokenizer tiktoken does not run (model/tokenizers/spm.py) hashes itself
        return tokenizer.fingerprint()
    enc = tokenizer.enc
    ranks = getattr(enc, "_mergeable_ranks", None)
    h = hashlib.sha256(f"{enc.n_vocab}|{getattr(enc, '_pat_str', '')}|".encode())
    if ranks is None:  # no table to hash: the encoding's name is the best identity we have
        h.update(enc.name.encode())
    else:
        for piece, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            h.update(rank.to_bytes(4, "little") + len(piece).to_bytes(2, "little") + piece)
    h.update(json.dumps(sorted(tokenizer.special.items())).encode())
    return h.hexdigest()
