"""The larger shapes' GGUF metadata (chatapp/bench/shapes.py): the vocabulary file's tokenizer
keys, and tensors at Qwen3-0.6B's and Llama-3.2-1B's real shapes."""

from __future__ import annotations

import numpy as np
from gguf import GGUFWriter

from chatapp.bench.shapes import SHAPES, meta


def test_meta_has_the_shapes_and_the_vocabulary(tmp_path):
    path = tmp_path / "vocab.gguf"
    w = GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(300)])
    w.add_token_types([1] * 300)
    w.add_uint32("qwen2.block_count", 99)   # the vocabulary file's own arch keys are not copied
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    m = meta("qwen3-0.6b", str(path))
    assert m["arch"] == "qwen3"
    kv = {k["key"]: k["val"] for k in m["kvs"]}
    assert kv["qwen3.block_count"] == 28 and kv["qwen3.attention.head_count_kv"] == 8
    assert kv["qwen3.attention.key_length"] == 128 and kv["qwen3.vocab_size"] == 300
    assert kv["tokenizer.ggml.model"] == "gpt2" and len(kv["tokenizer.ggml.tokens"]) == 300
    assert "qwen2.block_count" not in kv
    t = {x["name"]: x["shape"] for x in m["tensors"]}
    assert t["token_embd.weight"] == [1024, 300] and t["blk.27.attn_q.weight"] == [1024, 2048]
    assert t["blk.0.attn_k_norm.weight"] == [128] and "output.weight" not in t   # tied head
    s = SHAPES["llama-3.2-1b"]
    params = sum(int(np.prod(x["shape"])) for x in meta("llama-3.2-1b", str(path))["tensors"])
    assert s.layers == 16 and params - 300 * 2048 == 16 * (2 * 2048 + 2 * 2048 * 2048 + 2 * 2048 * 512
                                                           + 3 * 2048 * 8192) + 2048
