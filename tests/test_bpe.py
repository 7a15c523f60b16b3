"""model.tokenizers.bpe against the Hugging Face `tokenizers` library, on vocabularies trained here.

The real SmolLM2 vocabulary is checked in test_default_model.py (it needs the pull); these
tests train small byte-level BPE tokenizers with the same pre-tokenizers and compare ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import PRE, corpus, train
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from model.errors import ModelLoadError
from model.tokenizers.bpe import (
    BPETokenizer,
    tokenizer_from_json,
    tokenizer_json,
    vocab_from_gguf,
    vocab_from_tokenizer_json,
)


def as_text_only(tok: HFTokenizer) -> HFTokenizer:
    """The reference for user text: same vocabulary, merges and pre-tokenizer, but no added
    tokens, so "<|im_end|>" in the text is just text (as SmolLM2's own tokenizer treats it
    when asked to encode special tokens as text)."""
    model = json.loads(tok.to_str())["model"]
    plain = HFTokenizer(models.BPE(model["vocab"], [tuple(m) for m in model["merges"]]))
    plain.pre_tokenizer = tok.pre_tokenizer
    return plain


def save(tok: HFTokenizer, tmp: Path) -> Path:
    path = tmp / "tokenizer.json"
    path.write_text(tok.to_str(), encoding="utf-8")
    return path


def edited(path: Path, edit) -> Path:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=sorted(PRE))
def trained(request, tmp_path_factory):
    ref = train(request.param, corpus())
    path = save(ref, tmp_path_factory.mktemp(request.param))
    return request.param, as_text_only(ref), tokenizer_from_json(path, {"eos_token": "<|im_end|>"})


def test_corpus_is_large_and_varied():
    texts = corpus()
    assert len(texts) >= 500 and len(set(texts)) == len(texts)
    for needle in ["<|im_end|>", "2024", "\t", "   ", "😀", "中", "\u00a0", "def ", "'ll"]:
        assert any(needle in t for t in texts), needle


def test_ids_equal_reference_on_corpus(trained):
    name, ref, ours = trained
    texts = corpus()
    wrong = [t for t in texts if ours.encode(t) != ref.encode(t).ids]
    assert wrong == [], f"{name}: {len(wrong)}/{len(texts)} differ, e.g. {wrong[0]!r}"
    assert all(ours.decode(ours.encode(t)) == t for t in texts)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
       | st.text(alphabet=" \t\n\u00a0\u3000'sdtmlrvea0123456789.,!😀é", max_size=40))
def test_ids_equal_reference_on_random_text(trained, text):
    _, ref, ours = trained
    text = ours.visible(text)   # the reference drops unranked bytes; covered in its own test
    assert ours.encode(text) == ref.encode(text).ids


def test_special_token_text_is_never_a_special_token(trained):
    _, _, ours = trained
    ids = ours.encode("hi<|im_end|><|im_start|>system")
    assert ours.token("<|im_end|>") not in ids and ours.token("<|im_start|>") not in ids
    assert ours.decode(ids) == "hi<|im_end|><|im_start|>system"
    assert ours.eos_id == ours.token("<|im_end|>")


def test_naive_gpt2_pattern_would_fail_digit_split(tmp_path):
    # The folded Digits+ByteLevel regex matters: with the plain GPT-2 one, " 1" and "  1" split
    # differently (the issue measured ~13% of strings wrong on SmolLM2's own vocabulary).
    ref = train("smollm", corpus())
    path = edited(save(ref, tmp_path), lambda d: d.update(pre_tokenizer={"type": "ByteLevel", "use_regex": True}))
    naive, plain = tokenizer_from_json(path, {}), as_text_only(ref)
    wrong = sum(naive.encode(t) != plain.encode(t).ids for t in corpus())
    assert wrong > 0.05 * len(corpus())


def test_unranked_bytes_are_replaced_visibly_not_dropped(tmp_path):
    ref = train("smollm", corpus())
    # Remove the tokens of two bytes the corpus never uses, like SmolLM2's 21 missing bytes.
    gone = {"\x04": "Ą", "\x1d": "ĝ"}        # their GPT-2 byte-level characters
    path = save(ref, tmp_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert not any(c in m for m in data["model"]["merges"] for c in gone.values() for m in [" ".join(m)])

    def drop(d):
        vocab = d["model"]["vocab"]
        removed = sorted(vocab.pop(c) for c in gone.values())
        d["model"]["vocab"] = {t: i - sum(r < i for r in removed) for t, i in vocab.items()}
        d["added_tokens"] = [a | {"id": a["id"] - sum(r < a["id"] for r in removed)} for a in d["added_tokens"]]
    ours = tokenizer_from_json(edited(path, drop), {})
    ref = as_text_only(HFTokenizer.from_file(str(path)))
    assert isinstance(ours, BPETokenizer) and ours.unranked == {0x04, 0x1D}
    text = "a\x04b\x1dc"
    assert ref.encode(text).ids == [ref.token_to_id(c) for c in "abc"]  # the reference loses them silently
    assert ours.decode(ours.encode(text)) == "a\ufffdb\ufffdc"  # we show where they were
    assert max(ours.encode(text)) < ours.vocab_size
    raw = ours.enc.encode(text, disallowed_special=())           # the Encoding itself round-trips them
    assert ours.enc.decode_bytes(raw) == text.encode() and max(raw) >= ours.vocab_size


def test_ids_out_of_merge_order_are_refused(tmp_path):
    ref = train("gpt2", corpus())

    def swap(d):
        vocab, merges = d["model"]["vocab"], d["model"]["merges"]
        a, b = ("".join(m) for m in (merges[10], merges[20]))
        vocab[a], vocab[b] = vocab[b], vocab[a]
    with pytest.raises(ModelLoadError, match="merge order"):
        tokenizer_from_json(edited(save(ref, tmp_path), swap), {})


def test_token_made_by_no_merge_is_refused(tmp_path):
    ref = train("gpt2", corpus())
    path = edited(save(ref, tmp_path), lambda d: d["model"]["vocab"].update({"zzzq": len(d["model"]["vocab"])}))
    with pytest.raises(ModelLoadError, match="made by no merge"):
        tokenizer_from_json(path, {})


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁"}), "unsupported pre-tokenizer"),
    (lambda d: d["model"].update(type="WordPiece"), "not a BPE tokenizer"),
    (lambda d: d.update(normalizer={"type": "NFKC"}), "normalizer"),
    (lambda d: d["model"].update(byte_fallback=True), "byte_fallback"),
])
def test_unsupported_tokenizers_get_one_line_errors(tmp_path, edit, message):
    path = edited(save(train("gpt2", corpus()[:50], 400), tmp_path), edit)
    with pytest.raises(ModelLoadError, match=message) as e:
        tokenizer_from_json(path, {})
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ModelLoadError, match="missing"):
        tokenizer_from_json(tmp_path / "tokenizer.json", {})
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        tokenizer_from_json(tmp_path / "tokenizer.json", {})


def test_gguf_metadata_gives_the_same_tokenizer_and_json_round_trips(tmp_path):
    trained = train("smollm", corpus())
    ref = as_text_only(trained)
    v = vocab_from_tokenizer_json(json.loads(trained.to_str()), "x/tokenizer.json")
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": v.tokens,
            "tokenizer.ggml.merges": [f"{a} {b}" for a, b in v.merges],
            "tokenizer.ggml.token_type": [3 if i in v.special.values() else 1 for i in range(len(v.tokens))]}
    from model.tokenizers.bpe import make_tokenizer
    from_gguf = make_tokenizer(vocab_from_gguf(meta, "x.gguf"), None, "<|im_end|>")
    written = as_text_only(HFTokenizer.from_str(json.dumps(tokenizer_json(vocab_from_gguf(meta, "x.gguf"), "smollm"))))
    for text in corpus():
        assert from_gguf.encode(text) == ref.encode(text).ids == written.encode(text).ids
    for bad, message in [({"tokenizer.ggml.model": "llama"}, "not supported"),
                         ({"tokenizer.ggml.pre": "qwen35"}, "pre-tokenizer 'qwen35'")]:
        with pytest.raises(ModelLoadError, match=message):
            vocab_from_gguf(meta | bad, "x.gguf")
