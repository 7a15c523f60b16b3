"""llama.cpp's own tokenizer tests (models/ggml-vocab-*.gguf with their .inp/.out cases, from the
llama-cpp-python 0.3.36 sdist through the package index: tests/llama_vocab.py): every case gives
llama.cpp's ids, through the tokenizer the app builds from a GGUF (the canonical directory's
tokenizer.json, as the conversion writes it)."""

from __future__ import annotations

import json
import os
import subprocess
import unicodedata
from pathlib import Path

import pytest
from llama_vocab import NAMES, cases, vocab_dir

from model.loading.gguf_fast import FastReader
from model.loading.gguf_meta import GGUFFile, tokenizer_files
from model.tokenizers.bpe import tokenizer_from_json

pytestmark = pytest.mark.slow   # a one-time 77 MB fetch, then about a second a vocabulary


@pytest.fixture(scope="module")
def folder():
    return vocab_dir()


def gguf_vocab(path) -> GGUFFile:
    """The vocab file opened as the loader opens a GGUF (its architecture, e.g. gpt2, is not ours:
    only the tokenizer is read)."""
    reader = FastReader(path)
    return GGUFFile(path, reader, reader.values)


_built: dict = {}
CORPUS = Path(__file__).parent / "data" / "tokenizer_corpus.jsonl"


def our_tokenizer(folder, name, tmp_path_factory):
    if name not in _built:
        tok_json, config = tokenizer_files(gguf_vocab(folder / f"ggml-vocab-{name}.gguf"))
        out = tmp_path_factory.mktemp(name)
        (out / "tokenizer.json").write_text(json.dumps(tok_json), encoding="utf-8")
        _built[name] = (tokenizer_from_json(out / "tokenizer.json", config), config)
    return _built[name]


@pytest.mark.parametrize("name", NAMES)
def test_every_llama_cpp_case_gives_llama_cpps_ids(folder, name, tmp_path_factory):
    tok, _ = our_tokenizer(folder, name, tmp_path_factory)
    got = cases(folder, name)
    assert len(got) == 46
    wrong = [(text, ids, tok.encode(text)) for text, ids in got if tok.encode(text) != ids]
    assert not wrong, f"{len(wrong)}/46 differ, first: {wrong[0]}"
    for text, ids in got:   # and the ids read back as the text, whole or streamed a token at a time
        if "\ufffd" in tok.decode(ids):
            continue   # a case that is not valid text on its own (llama.cpp's tests have a few)
        assert tok.decode(ids) == text, text
        stream = tok.stream_decoder()
        assert stream.push_many(ids) + stream.flush() == text, text


def test_sentencepiece_vocabulary_details(folder, tmp_path_factory):
    """Llama 2's vocabulary: <s>/</s> as BOS/EOS, <0xXX> byte fallback, the dummy prefix."""
    tok, config = our_tokenizer(folder, "llama-spm", tmp_path_factory)
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (1, 2, 32000)
    assert config["add_bos_token"] is True and config["nanochat_tui_end_tokens"] == ["</s>"]
    space = tok.pieces.index("\u2581")   # the dummy prefix, then the character's four byte tokens
    assert tok.encode("𒀀") == [space, 0xF0 + 3, 0x92 + 3, 0x80 + 3, 0x80 + 3]
    assert [tok.pieces[i] for i in tok.encode("Hello world")] == ["\u2581Hello", "\u2581world"]
    assert tok.encode("<s>") != [1] and 1 not in tok.encode("</s> <s>")   # typed control tokens are text
    assert tok.encode_rendered("<s>[INST] Hi [/INST]")[0] == 1
    assert tok.decode(tok.encode("  two spaces")) == "  two spaces"


LLAMA_TOKENIZE = os.environ.get("NANOCHAT_LLAMA_TOKENIZE", "")


@pytest.mark.skipif(not (LLAMA_TOKENIZE and Path(LLAMA_TOKENIZE).is_file()),
                    reason="set NANOCHAT_LLAMA_TOKENIZE to a llama-tokenize binary (llama.cpp's tools; "
                           "../shared/peers/llama-bench.sh builds it) to compare with llama.cpp itself")
@pytest.mark.parametrize("name", NAMES)
def test_the_corpus_gives_llama_tokenizes_ids(folder, name, tmp_path_factory, tmp_path):
    """The shared corpus (scripts, code, emoji, whitespace), a text per string and all of it as one,
    through llama.cpp's own llama-tokenize: user text, no BOS, special tokens not parsed. Qwen's
    tokenizer.json normalizes to NFC and so do we; llama.cpp does not, so it gets the NFC text
    (the one deliberate difference, docs/tokenizers.md)."""
    tok, _ = our_tokenizer(folder, name, tmp_path_factory)
    texts = [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    picked = texts[::13] + ["\n\n".join(texts)]
    for i, text in enumerate(picked):
        prompt = tmp_path / f"p{i}.txt"
        prompt.write_text(unicodedata.normalize("NFC", text) if name == "qwen2" else text, encoding="utf-8")
        out = subprocess.run([LLAMA_TOKENIZE, "-m", str(folder / f"ggml-vocab-{name}.gguf"), "-f", str(prompt),
                              "--ids", "--no-bos", "--no-parse-special", "--log-disable"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-300:]
        want = json.loads(out.stdout.strip().splitlines()[-1])
        assert tok.encode(text) == want, (name, text[:60])


def test_llama3_on_tiktoken_equals_tokenizers_on_its_merge_list(folder, tmp_path_factory):
    """Where several merges make one token, tiktoken's rank = id and the merge list could differ
    only on runs that overlap two of them: runs of spaces, tabs, newlines and punctuation, and
    strings of vocabulary tokens, against `tokenizers` on the same tokenizer.json."""
    import random

    from tokenizers import Tokenizer as HFTokenizer

    tok, _ = our_tokenizer(folder, "llama-bpe", tmp_path_factory)
    ref = HFTokenizer.from_file(str(next(tmp_path_factory.getbasetemp().glob("llama-bpe*")) / "tokenizer.json"))
    ref.encode_special_tokens = True
    rng = random.Random(0)
    alphabets = [" \t\n", " \n\t-=*#_.", "=-_*~ ", "0123456789 .,", " \u3000\u00a0\n", "!!!???...   ", "ab  \n\n\t"]
    words = [tok.decode([i]) for i in rng.sample(range(128000), 2000)]
    for _ in range(3000):
        if rng.random() < 0.3:
            text = "".join(rng.choice(words) for _ in range(rng.randint(1, 6)))
        else:
            a = rng.choice(alphabets)
            text = "".join(rng.choice(a) for _ in range(rng.randint(1, 40)))
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids, repr(text)


def test_llama2_on_tiktoken_equals_tokenizers(folder, tmp_path_factory):
    """Llama 2's SentencePiece vocabulary encodes on tiktoken (model/tokenizers/spm_fast.py): the corpus and
    random text with unknown characters, spaces and ▁ give `tokenizers`' ids for the same file."""
    import random

    tok, _ = our_tokenizer(folder, "llama-spm", tmp_path_factory)
    assert tok.fast is not None
    texts = [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    rng = random.Random(1)
    alphabet = " \t\nab\u2581ñ漢😀<>_.é𒀀"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(3000)]
    for text in texts:
        assert tok.encode(text) == tok.hf.encode(text, add_special_tokens=False).ids, repr(text)


def test_a_file_of_an_architecture_we_do_not_run_is_refused_in_one_line(folder):
    """llama.cpp's gpt-2 vocab file declares general.architecture gpt2: loading it names that."""
    from model.errors import ModelLoadError
    from model.loading import load_model

    with pytest.raises(ModelLoadError) as e:
        load_model(str(folder / "ggml-vocab-gpt-2.gguf"))
    msg = str(e.value)
    assert "GGUF architecture 'gpt2' is not supported (supported: llama, qwen2, qwen3, gemma3)" in msg
    assert "\n" not in msg
