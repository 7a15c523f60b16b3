"""A tiny random Llama GGUF with no chat template, named as a base or a tuned model in its
`general.*` metadata (real files carry these; the other random files tests write do not)."""

from __future__ import annotations

import json
from pathlib import Path

from gguf import GGUFWriter
from helpers import add_bpe_vocab, add_hparams, add_random_llama, close_gguf, llama_hparams, trained_vocab

HIDDEN, FFN, HEADS, LAYERS = 32, 64, 2, 1


def write_named_gguf(path: Path, name: str, finetune: str | None = None) -> Path:
    model = json.loads(trained_vocab().to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    w = GGUFWriter(str(path), "llama")
    w.add_type("model")
    w.add_name(name)
    if finetune:
        w.add_string("general.finetune", finetune)
    add_hparams(w, "llama", llama_hparams(LAYERS, HIDDEN, FFN, HEADS, HEADS, 256))
    add_bpe_vocab(w, tokens, model["merges"], bos=0, eos=0)
    add_random_llama(w, len(tokens), LAYERS, HIDDEN, FFN)
    close_gguf(w)
    return path
