"""llama.cpp's own tokenizer test files (models/ggml-vocab-*.gguf with .inp/.out cases), taken
from the llama-cpp-python sdist on the package index: fetched once with pip, checked against its
pinned sha256, and the few files the tests read kept in ~/.cache/nanochat-tui-tests (`$NANOCHAT_LLAMA_VOCAB` names
a folder that already holds them). Offline, the tests that need them skip, saying why."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MEMBERS = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
NAMES = ("llama-bpe", "qwen2", "llama-spm", "gpt-2")
SEP = "\n__ggml_vocab_test__\n"


def _files(folder: Path) -> bool:
    return all((folder / f"ggml-vocab-{n}.gguf{ext}").is_file() for n in NAMES for ext in ("", ".inp", ".out"))


def vocab_dir() -> Path:
    """The folder holding ggml-vocab-{NAMES}.gguf and their cases; skips the test when the sdist
    cannot be fetched."""
    local = os.environ.get("NANOCHAT_LLAMA_VOCAB")
    if local:
        return Path(local)
    # Not under $NANOCHAT_TUI_HOME: tests point that at temp dirs, and the files should stay.
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    dest = base / "nanochat-tui-tests" / "llama-vocab-0.3.36"
    if _files(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--progress-bar", "off", "--dest", tmp, SDIST]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        sdist = Path(tmp) / SDIST_FILE
        if proc.returncode != 0 or not sdist.is_file():
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            pytest.skip(f"cannot fetch {SDIST} through the package index (offline?): {last[0][:160]}")
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        assert digest == SDIST_SHA256, f"{SDIST_FILE} has sha256 {digest}, expected {SDIST_SHA256}"
        out = Path(tmp) / "vocab"
        out.mkdir()
        with tarfile.open(sdist) as tar:
            for n in NAMES:
                for ext in ("", ".inp", ".out"):
                    member = tar.getmember(f"{MEMBERS}ggml-vocab-{n}.gguf{ext}")
                    with tar.extractfile(member) as src, open(out / Path(member.name).name, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        if not _files(dest):
            shutil.rmtree(dest, ignore_errors=True)
            out.rename(dest)
    return dest


def cases(folder: Path, name: str) -> list[tuple[str, list[int]]]:
    """(text, llama.cpp's ids) pairs, read as llama.cpp's test-tokenizer-0 reads them."""
    raw = (folder / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8")
    texts = raw.split(SEP)
    if texts and texts[-1] == "":   # the file ends with a separator
        texts.pop()
    ids = [[int(x) for x in line.split()] for line in
           (folder / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").splitlines()]
    assert len(texts) == len(ids), f"{name}: {len(texts)} inputs, {len(ids)} outputs"
    return list(zip(texts, ids, strict=True))
