"""A real vocabulary (one of llama.cpp's ggml-vocab-*.gguf) wrapped in a tiny random Llama: a GGUF
the app opens, with the vocabulary's own tokenizer metadata and a chat template of our choice."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFValueType, GGUFWriter
from helpers import add_hparams, add_random_llama, close_gguf, llama_hparams

from model.loading.gguf_fast import FastReader

HIDDEN, HEADS, FFN, LAYERS = 16, 2, 32, 1
TYPES = {"tokenizer.ggml.model": GGUFValueType.STRING, "tokenizer.ggml.pre": GGUFValueType.STRING,
         "tokenizer.ggml.add_bos_token": GGUFValueType.BOOL, "tokenizer.ggml.add_eos_token": GGUFValueType.BOOL,
         "tokenizer.ggml.add_space_prefix": GGUFValueType.BOOL}


def wrap_vocab(vocab: Path, out: Path, template: str | None, rename: dict[int, str] | None = None) -> Path:
    """Write `out`: `vocab`'s tokenizer.ggml.* metadata (tokens renamed per `rename`, id -> text)
    and `template`, around random weights."""
    meta = FastReader(vocab).values
    tokens = list(meta["tokenizer.ggml.tokens"])
    for i, text in (rename or {}).items():
        tokens[i] = text
    w = GGUFWriter(str(out), "llama")
    add_hparams(w, "llama", llama_hparams(LAYERS, HIDDEN, FFN, HEADS, HEADS, 512))
    w.add_token_list(tokens)
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.scores" in meta:
        w.add_token_scores(meta["tokenizer.ggml.scores"])
    if "tokenizer.ggml.merges" in meta:
        w.add_token_merges(meta["tokenizer.ggml.merges"])
    for key, value in meta.items():
        if key in TYPES:
            w.add_key_value(key, value, TYPES[key])
        elif key.endswith("_token_id"):
            w.add_uint32(key, value)
    if template:
        w.add_chat_template(template)
    add_random_llama(w, len(tokens), LAYERS, HIDDEN, FFN)
    close_gguf(w)
    return out
