"""FastReader reads a GGUF's metadata as gguf-py's GGUFReader does, value for value, and the same
tensors: every metadata type, arrays of strings and numbers, an alignment other than the default."""

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from model.loading.gguf_fast import FastReader


def test_fast_reader_equals_gguf_py(tmp_path):
    path = tmp_path / "m.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_uint32("general.alignment", 64)
    for i, kind in enumerate([GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
                              GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64]):
        w.add_key_value(f"t.int{i}", 7 + i, kind)
    w.add_key_value("t.f32", 1e-5, GGUFValueType.FLOAT32)
    w.add_key_value("t.f64", 0.1, GGUFValueType.FLOAT64)
    w.add_key_value("t.bool", True, GGUFValueType.BOOL)
    w.add_string("t.str", "héllo ▁ 😀")
    w.add_token_list(["<s>", "▁a", "", "日本", "Ġ Ġ"])
    w.add_token_scores([0.0, -1.5, -2.0, -1e9, 3.0])
    w.add_token_types([3, 1, 1, 1, 4])
    w.add_array("t.bools", [True, False, True])
    w.add_tensor("a.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("b.weight", np.ones((5,), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref, fast = GGUFReader(path), FastReader(path)
    assert fast.values == {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert fast.values["tokenizer.ggml.tokens"][3] == "日本" and fast.alignment == ref.alignment == 64
    assert fast.data_offset == ref.data_offset
    for a, b in zip(ref.tensors, fast.tensors, strict=True):
        assert (a.name, a.tensor_type, list(a.shape)) == (b.name, b.tensor_type, list(b.shape))
        np.testing.assert_array_equal(a.data, b.data)
    # A second open of a file whose tokenizer is cached leaves the vocabulary's strings unread
    # and still finds every other key and every tensor.
    lean = FastReader(path, vocabulary=False)
    assert lean.values == {k: v for k, v in fast.values.items() if k != "tokenizer.ggml.tokens"}
    assert lean.data_offset == ref.data_offset
    for a, b in zip(ref.tensors, lean.tensors, strict=True):
        assert (a.name, a.tensor_type, list(a.shape)) == (b.name, b.tensor_type, list(b.shape))
        np.testing.assert_array_equal(a.data, b.data)
