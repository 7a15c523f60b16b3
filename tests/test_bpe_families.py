"""Tokenizer parity per family: Qwen2/2.5/3 and Llama 3.x byte-level BPE, loaded from a
tokenizer.json and from a GGUF, id for id against the `tokenizers` library.

The real vocabularies are not here offline, so each family gets a small vocabulary trained
here and then given its published tokenizer.json shapes (pre-tokenizer, normalizer, decoder,
added tokens, ignore_merges). The reference encodes with `encode_special_tokens` (special
tokens as text, as we encode user text) and no post-processor, so its ids are what ours must be.
SmolLM2 and GPT-2 stay in tests/test_bpe.py.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import pytest
from gguf import GGUFWriter
from helpers import LLAMA3_SPLIT, corpus
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from model.errors import ModelLoadError
from model.loading.gguf_meta import open_gguf, tokenizer_files
from model.tokenizers.bpe import (
    BPETokenizer,
    make_tokenizer,
    tokenizer_from_json,
    vocab_from_gguf,
    vocab_from_tokenizer_json,
)
from model.tokenizers.pretokenizers import SMOLLM_PATTERN
from model.tokenizers.tokenizer import GPT2_PATTERN

# Verbatim from Qwen2.5's / Qwen3's tokenizer.json (Llama 3's is in test_bpe.py).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Family:
    split: str
    trim_offsets: bool                 # ByteLevel's, as the file has it (it changes no ids)
    nfc: bool
    special: tuple[str, ...]           # added tokens with special: true
    in_text: tuple[str, ...] = ()      # added tokens with special: false (matched in plain text)
    ignore_merges: bool = False
    gguf_pre: str = ""


FAMILIES = {
    "qwen3": Family(QWEN2_SPLIT, False, True, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                    ("<tool_call>", "</tool_call>", "<think>", "</think>"), gguf_pre="qwen2"),
    "llama3": Family(LLAMA3_SPLIT, True, False, ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                                 "<|end_header_id|>", "<|eot_id|>"),
                     ignore_merges=True, gguf_pre="llama-bpe"),
}


def byte_level(f: Family) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": f.trim_offsets, "use_regex": False}


def published_shapes(data: dict, f: Family) -> None:
    """Give a trained tokenizer.json the pre_tokenizer, normalizer, decoder and BPE options
    that the family's real tokenizer.json has."""
    data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": f.split}, "behavior": "Isolated", "invert": False}, byte_level(f)]}
    data["normalizer"] = {"type": "NFC"} if f.nfc else None
    data["decoder"] = byte_level(f)
    data["post_processor"] = None
    data["model"].update(ignore_merges=f.ignore_merges, continuing_subword_prefix="", end_of_word_suffix="")


@cache
def reference_json(name: str) -> str:
    """The family's tokenizer.json: ~2000 merges trained on the corpus (about a second)."""
    f = FAMILIES[name]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC() if f.nfc else None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(f.split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=2300, special_tokens=list(f.special), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus() * 2, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in f.in_text])
    data = json.loads(tok.to_str())
    published_shapes(data, f)
    return json.dumps(data)


def reference(name: str) -> Tokenizer:
    ref = Tokenizer.from_str(reference_json(name))
    ref.encode_special_tokens = True
    return ref


@cache
def ours_from_json(name: str) -> BPETokenizer:
    return make_tokenizer(vocab_from_tokenizer_json(json.loads(reference_json(name)), "t/tokenizer.json"), None, None)


def ref_ids(ref: Tokenizer, text: str) -> list[int]:
    return ref.encode(text, add_special_tokens=False).ids


def write_gguf(path: Path, data: dict, pre: str) -> None:
    """Tokenizer metadata as llama.cpp's converter writes it: added tokens by their content,
    CONTROL when special or shaped <|...|>, USER_DEFINED otherwise."""
    added = {a["id"]: a for a in data["added_tokens"]}
    by_id = {i: t for t, i in data["model"]["vocab"].items()} | {i: a["content"] for i, a in added.items()}
    tokens = [by_id[i] for i in range(len(by_id))]

    def kind(i: int) -> int:
        if i not in added:
            return 1
        looks_special = tokens[i].startswith("<|") and tokens[i].endswith("|>")
        return 3 if added[i]["special"] or looks_special else 4
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([kind(i) for i in range(len(tokens))])
    w.add_token_merges([" ".join(m) for m in data["model"]["merges"]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load_via_gguf(name: str, d: Path) -> tuple[BPETokenizer, dict, BPETokenizer]:
    """Ours from a GGUF, the way the app loads one (metadata -> tokenizer.json -> tokenizer),
    the tokenizer.json written, and ours straight from the metadata."""
    write_gguf(d / f"{name}.gguf", json.loads(reference_json(name)), FAMILIES[name].gguf_pre)
    g = open_gguf(d / f"{name}.gguf")
    written, config = tokenizer_files(g)
    (d / "tokenizer.json").write_text(json.dumps(written), encoding="utf-8")
    direct = make_tokenizer(vocab_from_gguf({k: v for k, v in g.meta.items() if k.startswith("tokenizer.")}, "x.gguf"),
                            None, None)
    return tokenizer_from_json(d / "tokenizer.json", config), written, direct


@pytest.fixture(scope="module", params=[(n, s) for n in sorted(FAMILIES) for s in ("json", "gguf", "gguf-meta")],
                ids=lambda p: "-".join(p))
def loaded(request, tmp_path_factory):
    name, source = request.param
    d = tmp_path_factory.mktemp(f"{name}-{source}")
    if source != "json":
        via_json, _, direct = load_via_gguf(name, d)
        return name, via_json if source == "gguf" else direct
    (d / "tokenizer.json").write_text(reference_json(name), encoding="utf-8")
    return name, tokenizer_from_json(d / "tokenizer.json", {})


def test_ids_equal_tokenizers_on_corpus(loaded):
    name, ours = loaded
    ref, texts = reference(name), corpus()
    wrong = [t for t in texts if ours.encode(t) != ref_ids(ref, t)]
    assert wrong == [], f"{name}: {len(wrong)}/{len(texts)} differ, e.g. {wrong[0]!r}"
    nfc = (lambda t: unicodedata.normalize("NFC", t)) if FAMILIES[name].nfc else (lambda t: t)
    for t in texts:
        ids = ours.encode(t)
        # NFC runs between added tokens, not across them (as in `tokenizers`): compare in NFC.
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=False)
        assert nfc(ours.decode(ids)) == nfc(t)


@pytest.mark.parametrize("name", sorted(FAMILIES))
@settings(max_examples=120, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
       | st.lists(st.sampled_from(["<think>", "</think>", "<|im_end|>", "<|eot_id|>", "<th", ">", "\u0338", " ",
                                   "\r\n", "DON'T", "'S", "1234", "e\u0301", "\u0323", "x", "\t", "中"]),
                  max_size=8).map("".join))
def test_ids_equal_tokenizers_on_random_text(name, text):
    ours = ours_from_json(name)
    text = ours.visible(text)
    assert ours.encode(text) == ref_ids(reference(name), text)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_written_tokenizer_json_means_the_same(name, tmp_path):
    _, written, _ = load_via_gguf(name, tmp_path)
    again = Tokenizer.from_str(json.dumps(written))
    again.encode_special_tokens = True
    ref = reference(name)
    assert all(ref_ids(again, t) == ref_ids(ref, t) for t in corpus())
    assert written["pre_tokenizer"] == json.loads(reference_json(name))["pre_tokenizer"]


def mismatches(name: str, edit) -> int:
    v = vocab_from_tokenizer_json(json.loads(reference_json(name)), "t/tokenizer.json")
    edit(v)
    ours, ref = make_tokenizer(v, None, None), reference(name)
    return sum(ours.encode(t) != ref_ids(ref, t) for t in corpus())


@pytest.mark.parametrize("name, pattern", [("qwen3", SMOLLM_PATTERN), ("qwen3", GPT2_PATTERN),
                                           ("llama3", GPT2_PATTERN),
                                           ("llama3", QWEN2_SPLIT)])
def test_the_parity_test_fails_with_another_familys_regex(name, pattern):
    # (Llama 3's regex on the Qwen vocabulary would pass: trained on single digits, it has no
    # multi-digit token for Llama 3's longer digit pieces to reach.)
    assert mismatches(name, lambda v: setattr(v, "pattern", pattern)) >= 10


def test_the_parity_test_fails_without_nfc_or_added_tokens_in_text():
    assert mismatches("qwen3", lambda v: setattr(v, "normalizer", None)) >= 5
    as_special = lambda v: setattr(v, "added", [replace(a, special=True) for a in v.added])  # noqa: E731
    assert mismatches("qwen3", as_special) >= 10


def test_special_and_plain_added_tokens(tmp_path):
    (tmp_path / "tokenizer.json").write_text(reference_json("qwen3"), encoding="utf-8")
    ours = tokenizer_from_json(tmp_path / "tokenizer.json", {"eos_token": "<|im_end|>"})
    think, end = ours.token("<think>"), ours.token("<|im_end|>")
    assert ours.encode("<think>\nhi</think>")[0] == think      # Qwen3's <think> is not special: matched
    assert end not in ours.encode("hi<|im_end|>") and ours.eos_id == end   # <|im_end|> is: text
    assert ours.encode("<think>\u0338")[0] == think   # NFC would make ">\u0338" "≯": <think> matches the raw text


def edited_reference(tmp_path: Path, edit) -> Path:
    data = json.loads(reference_json("qwen3"))
    edit(data)
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    return tmp_path / "tokenizer.json"


def split_regex(d: dict, regex: str) -> None:
    d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = regex


@pytest.mark.parametrize("edit, message", [
    (lambda d: split_regex(d, r"\p{L}+|\s+|."), "unsupported pre-tokenizer"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed"), "unsupported pre-tokenizer"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][1].update(use_regex=True), "unsupported pre-tokenizer"),
    (lambda d: d.update(normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}),
     "normalizer"),
    (lambda d: d.update(decoder={"type": "Metaspace"}), "decoder 'Metaspace'"),
    (lambda d: d["added_tokens"][-1].update(lstrip=True), "lstrip"),
], ids=["other-regex", "removed", "byte-level-regex", "lowercase", "metaspace", "lstrip"])
def test_what_we_cannot_reproduce_is_a_one_line_error(tmp_path, edit, message):
    path = edited_reference(tmp_path, edit)
    with pytest.raises(ModelLoadError, match=message) as e:
        tokenizer_from_json(path, {})
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_unknown_gguf_pre_is_a_one_line_error(tmp_path):
    write_gguf(tmp_path / "x.gguf", json.loads(reference_json("qwen3")), "qwen35")
    with pytest.raises(ModelLoadError, match="pre-tokenizer 'qwen35' is not supported") as e:
        tokenizer_files(open_gguf(tmp_path / "x.gguf"))
    assert "\n" not in str(e.value) and "x.gguf" in str(e.value)


def test_a_special_token_hides_the_added_tokens_it_overlaps():
    # tokenizers finds added tokens leftmost-longest among all of them, then leaves special
    # ones as text: in "<|a|>x" the special token hides "a|>x", in "<|a|>a|>x" it does not.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    ref = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ref.add_special_tokens([AddedToken("<|a|>", special=True, normalized=False)])
    ref.add_tokens([AddedToken("a|>x", special=False, normalized=False)])
    ref.encode_special_tokens = True
    v = vocab_from_tokenizer_json(json.loads(ref.to_str()), "t/tokenizer.json")
    ours = make_tokenizer(v, None, None)
    for text in ["<|a|>x", "<|ax", "a|>x<|a|>", "<|a|>a|>x"]:
        assert ours.encode(text) == ref_ids(ref, text), text
    assert ours.token("a|>x") in ours.encode("<|a|>a|>x") and ours.token("a|>x") not in ours.encode("<|a|>x")
