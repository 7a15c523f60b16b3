"""Random-weight GGUFs at real models' shapes and vocabularies, for timing larger models on the
CPU against llama.cpp (issue 24): `python -m chatapp.bench.shapes NAME VOCAB.gguf META.json`.

VOCAB.gguf is one of llama.cpp's vocabulary-only test files (`models/ggml-vocab-qwen2.gguf`
for Qwen3, `ggml-vocab-llama-bpe.gguf` for Llama 3), whose tokenizer keys are copied; the
architecture keys and the tensor list come from SHAPES. META.json is what
`../shared/peers/gguf_random.py build META.json OUT.gguf f16` turns into a GGUF, which
`llama-quantize OUT.gguf Q4_K_M.gguf Q4_K_M` then quantizes as a real file would be.
Speed depends on shapes and types, not on the weights' values. Not modelled: Llama 3's rotary
frequency scaling (a table of 32 factors; it changes no timing).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

U32, F32, STR = 4, 6, 8   # GGUFValueType codes


@dataclass(frozen=True)
class Shape:
    arch: str
    layers: int
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    rope_base: float
    eps: float
    context: int
    qk_norm: bool = False


SHAPES = {   # the models' config.json (Hugging Face); both tie the head to the embedding
    "qwen3-0.6b": Shape("qwen3", 28, 1024, 16, 8, 128, 3072, 1_000_000.0, 1e-6, 40960, qk_norm=True),
    "llama-3.2-1b": Shape("llama", 16, 2048, 32, 8, 64, 8192, 500_000.0, 1e-5, 131072),
}


def tensors(s: Shape, vocab: int) -> list[dict]:
    """GGUF tensor names and shapes (ne0 first, as GGUF lists them)."""
    qd, kvd = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = [{"name": "token_embd.weight", "shape": [s.dim, vocab], "type": "F16"}]
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [{"name": b + n, "shape": shape, "type": "F32" if len(shape) == 1 else "F16"} for n, shape in (
            ("attn_norm.weight", [s.dim]), ("attn_q.weight", [s.dim, qd]), ("attn_k.weight", [s.dim, kvd]),
            ("attn_v.weight", [s.dim, kvd]), ("attn_output.weight", [qd, s.dim]), ("ffn_norm.weight", [s.dim]),
            ("ffn_gate.weight", [s.dim, s.hidden]), ("ffn_up.weight", [s.dim, s.hidden]),
            ("ffn_down.weight", [s.hidden, s.dim]),
            *((("attn_q_norm.weight", [s.head_dim]), ("attn_k_norm.weight", [s.head_dim])) if s.qk_norm else ()))]
    return out + [{"name": "output_norm.weight", "shape": [s.dim], "type": "F32"}]


def arch_kvs(name: str, s: Shape, vocab: int) -> list[dict]:
    a = s.arch
    kv = [("general.name", STR, name), (f"{a}.block_count", U32, s.layers), (f"{a}.context_length", U32, s.context),
          (f"{a}.embedding_length", U32, s.dim), (f"{a}.feed_forward_length", U32, s.hidden),
          (f"{a}.attention.head_count", U32, s.heads), (f"{a}.attention.head_count_kv", U32, s.kv_heads),
          (f"{a}.attention.key_length", U32, s.head_dim), (f"{a}.attention.value_length", U32, s.head_dim),
          (f"{a}.rope.dimension_count", U32, s.head_dim), (f"{a}.rope.freq_base", F32, s.rope_base),
          (f"{a}.attention.layer_norm_rms_epsilon", F32, s.eps), (f"{a}.vocab_size", U32, vocab),
          ("general.file_type", U32, 1),
          # a stand-in for the tuned model: not a base model (model/chat_formats/completion.py), so it chats
          ("general.finetune", STR, "Instruct")]
    return [{"key": k, "type": t, "sub": None, "val": v} for k, t, v in kv]


def meta(name: str, vocab_gguf: str) -> dict:
    """gguf_random.py's META for model `name`: the vocabulary file's tokenizer keys, our shape."""
    from gguf import GGUFReader, GGUFValueType

    r = GGUFReader(vocab_gguf)
    s = SHAPES[name]
    kvs = []
    for k, f in r.fields.items():
        if not k.startswith("tokenizer."):
            continue
        t = f.types[0]
        sub = f.types[-1] if t == GGUFValueType.ARRAY else None
        kvs.append({"key": k, "type": int(t), "sub": int(sub) if sub is not None else None, "val": f.contents()})
    vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    return {"arch": s.arch, "kvs": arch_kvs(name, s, vocab) + kvs, "tensors": tensors(s, vocab)}


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: python -m chatapp.bench.shapes {{{','.join(SHAPES)}}} VOCAB.gguf META.json")
    with open(sys.argv[3], "w") as f:
        json.dump(meta(sys.argv[1], sys.argv[2]), f)
