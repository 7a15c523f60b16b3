"""Shared fixtures: tiny real models, built once per test session."""

import pytest

from model.loading import load_model


@pytest.fixture(scope="session")
def tiny():
    """random:tiny in fp32: a real 2-layer Llama with a byte-level tokenizer."""
    return load_model("random:tiny")
