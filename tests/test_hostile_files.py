"""Issue 27 items 2 and 3: hostile model files are refused in one line, in milliseconds, before
anything is allocated; FIFOs, devices and links to them are never read. GGUF headers are built
byte by byte here (struct), so each one claims exactly the hostile count under test."""

from __future__ import annotations

import json
import os
import struct
import threading
import time

import pytest

from model.errors import ModelLoadError
from model.limits import fitting_context
from model.loading import load_model
from model.tokenizers.bpe import tokenizer_from_json


def s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, kind: int, value: bytes) -> bytes:
    return s(key) + struct.pack("<I", kind) + value


def gguf(kvs: list[bytes], tensors: list[bytes] = (), data: bytes = b"", n_tensors: int | None = None,
         n_kv: int | None = None) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


def tensor(name: str, shape: list[int], kind: int = 0, offset: int = 0) -> bytes:
    return s(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape) + struct.pack("<IQ", kind,
                                                                                                          offset)


ARCH = kv("general.architecture", 8, s("llama"))
HOSTILE = {
    "u8-array-2^40": [ARCH, kv("x", 9, struct.pack("<IQ", 0, 1 << 40))],
    "vocab-10^7": [ARCH, kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 10**7) + s("a"))],
    "nested-arrays": [ARCH, kv("x", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 9, 1) * 3)],
    "string-2^40": [ARCH, kv("x", 8, struct.pack("<Q", 1 << 40))],
    "kv-count-2^60": None,
    "tensor-2^40-floats": [ARCH],
    "tensor-past-the-end": [ARCH],
    "five-dims": [ARCH],
    "alignment-type-then-end": None,   # issue 45: struct.error
    "overlapping-tensors": [ARCH],     # issue 45: never checked; such files loaded and replied ""
}


def hostile_bytes(name: str) -> bytes:
    if name == "kv-count-2^60":
        return gguf([ARCH], n_kv=1 << 60)
    if name == "tensor-2^40-floats":
        return gguf([ARCH], [tensor("token_embd.weight", [1 << 20, 1 << 20])], b"\0" * 64)
    if name == "tensor-past-the-end":
        return gguf([ARCH], [tensor("token_embd.weight", [16, 4], offset=0)], b"\0" * 64)  # 256 bytes claimed
    if name == "alignment-type-then-end":   # the file ends right after the key's type
        return b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + ARCH + s("general.alignment") + struct.pack("<I", 4)
    if name == "overlapping-tensors":
        return gguf([ARCH], [tensor("a", [32]), tensor("b", [32], offset=64)], b"\0" * 160)
    if name == "five-dims":
        return gguf([ARCH], [tensor("t", [1, 1, 1, 1, 1])], b"\0" * 64)
    return gguf(HOSTILE[name])


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_gguf_headers_are_one_line_refusals_in_milliseconds(tmp_path, name):
    path = tmp_path / "bad.gguf"
    path.write_bytes(hostile_bytes(name))
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError) as e:
        load_model(str(path))
    assert time.perf_counter() - t0 < 1.0
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg and "truncated or corrupt" in msg, msg


@pytest.mark.parametrize("field, words", [
    (kv("general.architecture", 9, struct.pack("<IQ", 8, 1) + s("llama")),   # was TypeError: unhashable type
     "'general.architecture' should be text, not list"),
    (kv("general.alignment", 8, s("32")), "general.alignment has value type 8, not uint32"),
    (kv("llama.context_length", 8, s("4096")), "'llama.context_length' should be a whole number, not '4096'"),
    (kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 4, 2) + struct.pack("<II", 1, 2)),
     "'tokenizer.ggml.tokens' should be a list of text, not list"),
])
def test_gguf_metadata_of_the_wrong_type_is_one_line_naming_the_key(tmp_path, field, words):
    """Issue 45 finding 8: every field the loader reads is checked for its type before use."""
    path = tmp_path / "typed.gguf"
    path.write_bytes(gguf([field] if b"general.architecture" in field else [ARCH, field]))
    with pytest.raises(ModelLoadError, match=words) as e:
        load_model(str(path))
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("key, value, words", [
    ("num_hidden_layers", 1 << 31, "num_hidden_layers 2,147,483,648 is more than"),
    ("hidden_size", 1e12, r"hidden_size 1e\+12 is not a whole number"),
    ("vocab_size", 10**7, "vocab_size 10,000,000 is more than"),
    ("hidden_size", 1 << 40, "hidden_size 1,099,511,627,776 is more than"),
])
def test_absurd_config_sizes_are_refused_before_any_allocation(tmp_path, key, value, words):
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, key: value}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match=words) as e:
        load_model(str(tmp_path))
    assert time.perf_counter() - t0 < 1.0 and "\n" not in str(e.value)


def test_a_fifo_config_and_a_tokenizer_linked_to_dev_zero_are_never_read(tmp_path):
    os.mkfifo(tmp_path / "config.json")  # a read would block forever
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match="a FIFO, not a regular file"):
        load_model(str(tmp_path))
    (tmp_path / "tokenizer.json").symlink_to("/dev/zero")  # a read would never end
    with pytest.raises(ModelLoadError, match="a character device, not a regular file"):
        tokenizer_from_json(tmp_path / "tokenizer.json", {})
    fifo_gguf = tmp_path / "m.gguf"
    os.mkfifo(fifo_gguf)
    with pytest.raises(ModelLoadError, match="FIFO"):
        load_model(str(fifo_gguf))
    assert time.perf_counter() - t0 < 1.0


def test_tokenizer_json_with_a_huge_added_token_id_or_deep_nesting_is_one_line(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                "added_tokens": [{"id": 10**12, "content": "<x>", "special": True}]}))
    with pytest.raises(ModelLoadError, match="token id 1000000000000 is outside"):
        tokenizer_from_json(path, {})
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelLoadError, match="too deeply nested"):
        tokenizer_from_json(path, {})


def test_a_cache_is_sized_to_what_fits_and_rotary_tables_to_the_cache(tiny):
    per_token = tiny.model.new_cache(1).bytes_per_token
    assert fitting_context(8192, per_token, 8192 * per_token) == 8192          # fits: the model's own
    assert fitting_context(1 << 24, per_token, 5000 * per_token) == 4864      # whole 256s that fit
    assert fitting_context(1 << 31, 1 << 20, 1 << 20) == 256                  # never under 256
    cache = tiny.model.new_cache(300)
    cos, _sin = tiny.model.rope(cache.device)
    assert cos.shape[0] >= 300 and cos.shape[0] <= max(tiny.model.longest_cache, 300)


def test_launch_notes_a_claimed_context_that_does_not_fit(tiny, monkeypatch):
    from chatapp import launch

    notes: list[str] = []
    monkeypatch.setattr(launch, "cache_room", lambda device: 1000 * tiny.model.new_cache(1).bytes_per_token)
    fake = type(tiny)(**{**tiny.__dict__, "context_length": 1 << 24})  # a config claiming 2**24 tokens
    assert launch.fitting(fake, notes.append) == 768
    assert len(notes) == 1 and "16,777,216-token context" in notes[0] and "--context N asks for more" in notes[0]


def test_nanochat_meta_files_nested_too_deeply_are_one_line(tmp_path):
    from model.loading.nanochat import read_json

    (tmp_path / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelLoadError, match="too deeply nested") as e:
        read_json(tmp_path / "meta.json", "the checkpoint's meta file")
    assert "\n" not in str(e.value)
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(ModelLoadError, match="FIFO"):
        read_json(tmp_path / "fifo.json", "the checkpoint's meta file")


def test_a_context_asked_for_past_what_the_machine_holds_is_one_line(tiny, monkeypatch):
    """--context 2**31 on a model claiming 2**31: a bare 'Cannot allocate memory' before."""
    from chatapp import launch
    from chatapp.options import chat_parser
    from model.errors import UserError

    fake = type(tiny)(**{**tiny.__dict__, "context_length": 1 << 31})
    monkeypatch.setattr(launch, "load_model", lambda spec, opts: fake)
    args = chat_parser().parse_args(["--model", "random:tiny", "--context", str(1 << 31), "--device", "cpu"])
    with pytest.raises(UserError, match="cannot allocate a 2,147,483,648-token KV cache") as e:
        launch.open_session(args, warn=lambda _m: None)
    assert "\n" not in str(e.value) and "try a smaller --context" in str(e.value)
    assert tiny.model.longest_cache < 1 << 31  # the failed cache does not size the rotary tables


def refused_at_once(read, path, fifo=None) -> str:
    """`read(path)`'s ModelLoadError, or a failure if it blocks (the FIFO is then opened for
    writing and closed, so a blocked reader sees its end and the test run goes on)."""
    out: list = []

    def run():
        try:
            out.append(read(path))
        except Exception as e:  # noqa: BLE001 - the test asserts which one
            out.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)  # generous: a shared machine is slow, a blocked open is endless
    if t.is_alive():
        os.close(os.open(fifo or path, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        pytest.fail(f"{read.__qualname__} blocked on {path.name}")
    assert isinstance(out[0], ModelLoadError) and "\n" not in str(out[0]), out[0]
    return str(out[0])


def test_fifo_weights_checkpoints_and_tokenizer_pickles_are_refused_unopened(tmp_path):
    """Issue 45 finding 7: a safetensors FIFO hung the load; a nanochat tokenizer.pkl and a
    model_*.pt skipped the regular-file gate too."""
    from model.loading.hf import read_safetensors
    from model.loading.nanochat import read_weights
    from model.tokenizers.safe_pickle import load_encoding

    os.mkfifo(tmp_path / "model.safetensors")
    assert "a FIFO, not a regular file" in refused_at_once(read_safetensors, tmp_path, tmp_path / "model.safetensors")
    for name, read in (("model_000001.pt", read_weights), ("tokenizer.pkl", load_encoding)):
        os.mkfifo(tmp_path / name)
        assert "a FIFO, not a regular file" in refused_at_once(read, tmp_path / name)
    (tmp_path / "zero.pkl").symlink_to("/dev/zero")
    assert "a character device, not a regular file" in refused_at_once(load_encoding, tmp_path / "zero.pkl")
