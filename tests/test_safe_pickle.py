"""The tokenizer pickle is untrusted: only a tiktoken Encoding's plain state gets through."""

import pickle
from pathlib import Path

import pytest
import tiktoken

from model.errors import ModelLoadError
from model.tokenizers.safe_pickle import load_encoding, loads_encoding

REAL = Path(__file__).parent / "fixtures" / "nanochat" / "tokenizer" / "tokenizer.pkl"


def test_accepts_real_nanochat_tokenizer():
    enc = load_encoding(REAL)
    assert enc.n_vocab == 300
    assert enc.encode_single_token("<|bos|>") == 291 and enc.encode_single_token("<|output_end|>") == 299
    text = "How many r in strawberry?"
    assert enc.decode(enc.encode_ordinary(text)) == text
    assert len(enc.encode_ordinary(text)) < len(text.encode())  # real merges, not just bytes


def test_round_trip_of_a_pickled_encoding():
    enc = tiktoken.Encoding(name="t", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)},
                            special_tokens={"<|bos|>": 256})
    for protocol in range(3, pickle.HIGHEST_PROTOCOL + 1):  # nanochat pickles with the default (4 or 5)
        back = loads_encoding(pickle.dumps(enc, protocol=protocol))
        assert back.encode("hi <|bos|>", allowed_special="all") == enc.encode("hi <|bos|>", allowed_special="all")


def test_refuses_to_import_anything_else(tmp_path):
    marker = tmp_path / "pwned"
    # What `pickle.dumps` makes of an object whose __reduce__ returns (os.system, (cmd,)).
    evil = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(evil)
    with pytest.raises(ModelLoadError, match=r"tokenizer.pkl: .*refuses to import os.system"):
        load_encoding(path)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [
    pickle.dumps({"a": 1}),                                   # plain data, but not an Encoding
    pickle.dumps(print),                                      # a builtin by reference
    pickle.dumps(tiktoken.Encoding.__init__),                 # a function from the allowed module
    b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00.",         # truncated
    b"",                                                      # empty
    b"not a pickle at all",
])
def test_refuses_other_payloads(tmp_path, payload):
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(payload)
    with pytest.raises(ModelLoadError, match="not a usable tokenizer pickle"):
        load_encoding(path)


def encoding_pickle(state) -> bytes:
    """An Encoding pickle (NEWOBJ + BUILD) carrying an arbitrary state."""
    head = b"\x80\x04\x8c\rtiktoken.core\x94\x8c\x08Encoding\x94\x93\x94)\x81\x94"
    return head + pickle.dumps(state, protocol=4)[2:-1] + b"b."


@pytest.mark.parametrize("state, why", [
    ("gpt2", "needs a download"),
    ({"pat_str": "x", "mergeable_ranks": {"a": 0}, "special_tokens": {}}, "bytes -> int"),
    ({"pat_str": "x", "mergeable_ranks": {b"a": 0}, "special_tokens": {"<|x|>": 0}}, "duplicate"),
    ({"pat_str": 3, "mergeable_ranks": {}, "special_tokens": {}}, "not a string"),
    ({"pat_str": "x", "mergeable_ranks": {}, "special_tokens": {}, "evil": 1}, "unexpected fields"),
    ({"pat_str": "(", "mergeable_ranks": {b"a": 0}, "special_tokens": {}}, "not a usable"),
])
def test_checks_the_state_before_building(tmp_path, state, why):
    data = encoding_pickle(state)
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(data)
    with pytest.raises(ModelLoadError, match=why):
        load_encoding(path)


def test_state_forgery_helper_is_faithful():
    """encoding_pickle() builds what pickle itself builds, so the cases above are real."""
    enc = tiktoken.Encoding(name="t", pat_str=r"\S+", mergeable_ranks={b"a": 0}, special_tokens={})
    state = {"name": "t", "pat_str": r"\S+", "mergeable_ranks": {b"a": 0}, "special_tokens": {}}
    assert loads_encoding(encoding_pickle(state)).encode("aa") == enc.encode("aa")


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match=r"nope.pkl: cannot read it \(No such file"):
        load_encoding(tmp_path / "nope.pkl")
