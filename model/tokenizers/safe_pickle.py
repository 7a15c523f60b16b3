"""Read nanochat's tokenizer.pkl (a pickled tiktoken Encoding) without trusting it.

A pickle can import and call anything. This unpickler resolves exactly one global,
tiktoken's Encoding, and even that to an inert stand-in that only records the state it
is given. Everything else in the file can only be plain data (dicts, str, bytes, int).
The Encoding is then built here, by us, from that state once it has been checked.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import tiktoken

from model.errors import ModelLoadError
from model.files import read_bytes
from model.tokenizers.tokenizer import check_split_pattern, new_encoding

ALLOWED = {("tiktoken.core", "Encoding")}
STATE_KEYS = {"name", "pat_str", "mergeable_ranks", "special_tokens", "explicit_n_vocab"}
MAX_BYTES = 256 * 1024 * 1024  # a 65K-token tokenizer.pkl is about 1 MB


class _EncodingState:
    """Stands in for tiktoken.core.Encoding while unpickling: holds the state, runs nothing."""

    def __init__(self, *args, **kwargs):
        raise pickle.UnpicklingError("tiktoken.core.Encoding may only be rebuilt from its state")

    def __setstate__(self, state) -> None:
        self.state = state


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED:
            return _EncodingState
        raise pickle.UnpicklingError(f"refuses to import {module}.{name}; only tiktoken's Encoding is allowed")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refuses persistent references")


def _check_state(state) -> dict:
    if isinstance(state, str):
        raise ValueError(f"refers to tiktoken's registered encoding {state!r}, which needs a download")
    if not isinstance(state, dict) or not {"pat_str", "mergeable_ranks", "special_tokens"} <= set(state):
        raise ValueError("is not a tiktoken Encoding's state")
    if set(state) - STATE_KEYS:
        raise ValueError(f"has unexpected fields {sorted(set(state) - STATE_KEYS)}")
    ranks, special = state["mergeable_ranks"], state["special_tokens"]
    if not isinstance(state["pat_str"], str) or not isinstance(state.get("name", ""), str):
        raise ValueError("has a name or split pattern that is not a string")
    if not isinstance(ranks, dict) or not all(type(k) is bytes and type(v) is int for k, v in ranks.items()):
        raise ValueError("has mergeable ranks that are not bytes -> int")
    if not isinstance(special, dict) or not all(type(k) is str and type(v) is int for k, v in special.items()):
        raise ValueError("has special tokens that are not str -> int")
    ids = list(ranks.values()) + list(special.values())
    if len(set(ids)) != len(ids) or min(ids, default=0) < 0:
        raise ValueError("has duplicate or negative token ids")
    n_vocab = state.get("explicit_n_vocab")
    if n_vocab is not None and (type(n_vocab) is not int or n_vocab != len(ids)):
        raise ValueError(f"says it has {n_vocab} tokens but holds {len(ids)}")
    return state


def loads_encoding(data: bytes) -> tiktoken.Encoding:
    """A tiktoken Encoding from pickled bytes; ValueError or pickle.UnpicklingError otherwise."""
    obj = _RestrictedUnpickler(io.BytesIO(data)).load()
    if not isinstance(obj, _EncodingState):
        raise ValueError(f"holds a {type(obj).__name__}, not a tiktoken Encoding")
    state = _check_state(getattr(obj, "state", None))
    return new_encoding(state.get("name", "nanochat"), state["pat_str"], state["mergeable_ranks"],
                        state["special_tokens"])


def load_encoding(path: str | Path) -> tiktoken.Encoding:
    """Load a nanochat tokenizer.pkl; any problem is a one-line ModelLoadError naming the file."""
    path = Path(path)
    data = read_bytes(path, "tokenizer pickle", MAX_BYTES)  # a FIFO or /dev/zero: refused unread
    try:
        enc = loads_encoding(data)
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError, OSError, MemoryError,
            RecursionError, IndexError, KeyError, AttributeError, UnicodeDecodeError, ModelLoadError) as e:
        raise ModelLoadError(f"{path}: not a usable tokenizer pickle ({e})") from None
    check_split_pattern(enc, str(path))
    return enc
