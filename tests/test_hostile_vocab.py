"""Issue 45 finding 3: a vocabulary with an empty token string made tiktoken's encode loop at 100%
CPU, deaf to Ctrl-C (one ran 12 minutes); a duplicate one silently made an id unreachable; a
nanochat pickle's split pattern that backtracks failed mid-chat. Each is refused at load in one
line naming the token. The two that hung run in a subprocess, so old code fails on its timeout."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import tiktoken
from gguf import GGUFWriter
from helpers import add_bpe_vocab, add_hparams, add_random_llama, close_gguf, llama_hparams, trained_vocab

from model.errors import ModelLoadError
from model.loading import load_model
from model.tokenizers.bpe import tokenizer_from_json
from model.tokenizers.safe_pickle import load_encoding

IM_END = 2   # trained_vocab's specials come first: <|endoftext|>, <|im_start|>, <|im_end|>


def gguf_with(path: Path, rename: dict[int, str]) -> Path:
    """A tiny Llama GGUF (ChatML tokens, no template) with some token strings replaced."""
    model = json.loads(trained_vocab().to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    for i, text in rename.items():
        tokens[i] = text
    w = GGUFWriter(str(path), "llama")
    add_hparams(w, "llama", llama_hparams(1, 32, 64, 2, 2, 256))
    add_bpe_vocab(w, tokens, model["merges"], bos=0, eos=0)
    add_random_llama(w, len(tokens), 1, 32, 64)
    close_gguf(w)
    return path


def refused_in_a_subprocess(model: Path, home: Path) -> str:
    """The app's own start-up on `model`; its one error line (a hang fails on the timeout)."""
    cmd = [sys.executable, "-m", "chatapp.cli", "--headless", "--model", str(model)]
    p = subprocess.run(cmd, input=b"hello\n", capture_output=True, timeout=90,
                       env={**os.environ, "NANOCHAT_TUI_HOME": str(home), "PYTHONIOENCODING": "utf-8"})
    err = p.stderr.decode().strip()
    assert p.returncode != 0 and "Traceback" not in err and len(err.splitlines()) == 1, err[-600:]
    return err


def test_a_gguf_token_renamed_to_nothing_is_refused_at_load(tmp_path):
    err = refused_in_a_subprocess(gguf_with(tmp_path / "empty.gguf", {IM_END: ""}), tmp_path)
    assert f"token {IM_END} is an empty string" in err


def test_a_tokenizer_json_added_token_with_no_content_is_refused_at_load(tmp_path):
    """The tokenizer alone, built and used in a subprocess (no torch: a second, not ten)."""
    data = json.loads(trained_vocab().to_str())
    data["added_tokens"][IM_END]["content"] = ""
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    code = ("import sys\nfrom model.tokenizers.bpe import tokenizer_from_json\n"
            "tokenizer_from_json(sys.argv[1], {}).encode_rendered('hello')")
    p = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=60)
    assert p.returncode != 0 and f"{path}: added token {IM_END} is an empty string" in p.stderr.decode()


def test_a_duplicate_gguf_token_is_refused_naming_both_ids(tmp_path):
    with pytest.raises(ModelLoadError, match=r"tokens 1 and 2 are the same string '<\|im_start\|>'") as e:
        load_model(str(gguf_with(tmp_path / "dup.gguf", {IM_END: "<|im_start|>"})))
    assert "\n" not in str(e.value)


def test_an_added_token_repeating_another_is_refused_naming_both_ids(tmp_path):
    data = json.loads(trained_vocab().to_str())
    data["added_tokens"][IM_END]["content"] = "<|im_start|>"   # id 1's: one of the two was unreachable
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ModelLoadError, match=r"tokens 1 and 2 are the same string '<\|im_start\|>'"):
        tokenizer_from_json(path, {})


def test_a_nanochat_split_pattern_that_backtracks_is_refused_at_load(tmp_path):
    """`(\\w+\\s?)+(?=!)` backtracks past tiktoken's limit on plain prose: it loaded, then failed
    a message with "ValueError: ... backtracking"."""
    enc = tiktoken.Encoding(name="nanochat", pat_str=r"(\w+\s?)+(?=!)|\S+|\s+",
                            mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={"<|bos|>": 256})
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(pickle.dumps(enc))
    with pytest.raises(ModelLoadError, match="its split pattern gives up on ordinary text .*backtracking") as e:
        load_encoding(path)
    assert "\n" not in str(e.value)
