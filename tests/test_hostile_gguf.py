"""Issue 45 findings 8 and 12 on whole GGUF files (a tiny random Llama, as the campaign mutated
the default model's): tensors whose bytes overlap loaded (never checked) and replied nothing; an
embedding narrower than the vocabulary loaded, then failed every turn with an IndexError; a
model whose first reply ends at once says nothing about why."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from helpers import add_bpe_vocab, add_hparams, close_gguf, llama_hparams, trained_vocab

from chatapp.chat.events import Info, TurnStats
from chatapp.chat.reply import EMPTY_FIRST_REPLY
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from model.errors import ModelLoadError
from model.loading import load_model

HIDDEN, FFN = 32, 64
PARTS = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (HIDDEN, HIDDEN), "attn_v": (HIDDEN, HIDDEN),
         "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN),
         "ffn_down": (HIDDEN, FFN), "attn_norm": (HIDDEN,), "ffn_norm": (HIDDEN,)}


def tiny_gguf(path: Path, embedding_rows: int | None = None, output_norm: float | None = None) -> Path:
    """One layer, F32, tied head, ChatML tokens (EOS is id 0, <|endoftext|>), no template.
    `output_norm`: every weight of the final norm (0: every logit is 0, so greedy picks id 0)."""
    model = json.loads(trained_vocab().to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    add_hparams(w, "llama", llama_hparams(1, HIDDEN, FFN, 2, 2, 256))
    add_bpe_vocab(w, tokens, model["merges"], bos=0, eos=0)

    def add(name: str, shape: tuple, value: float | None = None):
        data = np.full(shape, value) if value is not None else \
            1 + rng.normal(0, 0.02, shape) if "norm" in name else rng.normal(0, 0.5, shape)
        w.add_tensor(name, data.astype(np.float32))

    add("token_embd.weight", (embedding_rows or len(tokens), HIDDEN))
    for part, shape in PARTS.items():
        add(f"blk.0.{part}.weight", shape)
    add("output_norm.weight", (HIDDEN,), output_norm)
    close_gguf(w)
    return path


def tensor_offset_at(data: bytes, name: str) -> int:
    """Where a tensor's data offset (u64) sits in its header entry: name, dims, shape, type, offset."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    (dims,) = struct.unpack_from("<I", data, at)
    return at + 4 + 8 * dims + 4


def test_tensors_whose_bytes_overlap_are_refused_in_one_line(tmp_path):
    path = tiny_gguf(tmp_path / "overlap.gguf")
    data = bytearray(path.read_bytes())
    q, k = (tensor_offset_at(data, f"blk.0.{p}.weight") for p in ("attn_q", "attn_k"))
    data[k:k + 8] = data[q:q + 8]   # attn_k now reads attn_q's bytes: the same shape, so it loaded
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="tensors 'blk.0.attn_q.weight' and 'blk.0.attn_k.weight' share bytes") \
            as e:
        load_model(str(path))
    assert "\n" not in str(e.value)


def test_an_embedding_narrower_than_the_vocabulary_is_refused_at_load(tmp_path):
    n = len(json.loads(trained_vocab().to_str())["model"]["vocab"])
    with pytest.raises(ModelLoadError, match=f"the vocabulary has {n:,} tokens but the embedding only {n - 10:,} "
                                             "rows") as e:
        load_model(str(tiny_gguf(tmp_path / "narrow.gguf", embedding_rows=n - 10)))
    assert str(e.value).startswith(str(tmp_path / "narrow.gguf")) and "\n" not in str(e.value)


def test_a_new_chats_empty_first_reply_says_the_file_may_be_damaged_once(tmp_path):
    """A zeroed final norm, as a damaged file's NaN-free cousin: every logit 0, so greedy decoding
    picks id 0, the end token, first. The note comes with the chat's first reply only: an empty
    reply later in a chat is the model's choice, not news about the file."""
    s = Session(load_model(str(tiny_gguf(tmp_path / "mute.gguf", output_norm=0.0))),
                Settings(temperature=0.0, max_new_tokens=8))
    first = list(s.send("hello"))
    assert [e.text for e in first if isinstance(e, Info)] == [EMPTY_FIRST_REPLY]
    (st,) = [e for e in first if isinstance(e, TurnStats)]
    assert st.reply == "" and st.stop == "end" and st.decode_tokens == 0
    second = list(s.send("hello again"))
    assert not [e for e in second if isinstance(e, Info)]
    assert [e.stop for e in second if isinstance(e, TurnStats)] == ["end"]
