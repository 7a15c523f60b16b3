"""Architectures, weight loading, tokenizers and chat templates, and generation."""
