"""Shared fixtures: tiny real models, built once per test session."""

import pytest

from model.loading import load_model


@pytest.fixture(scope="session")
def tiny():
    """random:tiny in fp32: a real 2-layer Llama with a byte-level tokenizer."""
    return load_model("random:tiny")


@pytest.fixture(autouse=True)
def _chats_in_tmp(tmp_path_factory, monkeypatch):
    """Every test (and every headless subprocess it starts) keeps its chats in its own temp dir,
    never in the user's. Only the chats dir moves: NANOCHAT_TUI_HOME (the model cache) is left
    to the tests that pull the default model."""
    monkeypatch.setenv("NANOCHAT_TUI_CHATS", str(tmp_path_factory.mktemp("chats")))
