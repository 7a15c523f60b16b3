"""A tiny random Llama GGUF with no chat template, named as a base or a tuned model in its
`general.*` metadata (real files carry these; the other random files tests write do not)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from test_gguf import trained_vocab

HIDDEN, FFN, HEADS, LAYERS = 32, 64, 2, 1


def write_named_gguf(path: Path, name: str, finetune: str | None = None) -> Path:
    model = json.loads(trained_vocab().to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    w = GGUFWriter(str(path), "llama")
    w.add_type("model")
    w.add_name(name)
    if finetune:
        w.add_string("general.finetune", finetune)
    for key, value in {"block_count": LAYERS, "context_length": 256, "embedding_length": HIDDEN,
                       "feed_forward_length": FFN, "attention.head_count": HEADS, "attention.head_count_kv": HEADS,
                       "rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": 1e-5}.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"llama.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges([" ".join(m) for m in model["merges"]])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    rng = np.random.default_rng(0)

    def add(n: str, shape: tuple):
        w.add_tensor(n, (1 + rng.normal(0, 0.02, shape) if "norm" in n else rng.normal(0, 0.5, shape))
                     .astype(np.float32))

    add("token_embd.weight", (len(tokens), HIDDEN))
    for name_, shape in [("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (HIDDEN, HIDDEN)), ("attn_v", (HIDDEN, HIDDEN)),
                         ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN)),
                         ("ffn_down", (HIDDEN, FFN)), ("attn_norm", (HIDDEN,)), ("ffn_norm", (HIDDEN,))]:
        add(f"blk.0.{name_}.weight", shape)
    add("output_norm.weight", (HIDDEN,))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
