"""A real vocabulary (one of llama.cpp's ggml-vocab-*.gguf) wrapped in a tiny random Llama: a GGUF
the app opens, with the vocabulary's own tokenizer metadata and a chat template of our choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter

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
    for key, value in {"block_count": LAYERS, "context_length": 512, "embedding_length": HIDDEN,
                       "feed_forward_length": FFN, "attention.head_count": HEADS, "attention.head_count_kv": HEADS,
                       "rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": 1e-5}.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"llama.{key}", value)
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
    rng = np.random.default_rng(0)

    def add(name: str, shape: tuple):
        w.add_tensor(name, (1 + rng.normal(0, 0.02, shape) if "norm" in name else
                            rng.normal(0, 0.5, shape)).astype(np.float32))

    add("token_embd.weight", (len(tokens), HIDDEN))
    for i in range(LAYERS):
        for name, shape in [("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (HIDDEN, HIDDEN)), ("attn_v", (HIDDEN, HIDDEN)),
                            ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN)),
                            ("ffn_down", (HIDDEN, FFN)), ("attn_norm", (HIDDEN,)), ("ffn_norm", (HIDDEN,))]:
            add(f"blk.{i}.{name}.weight", shape)
    add("output_norm.weight", (HIDDEN,))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
