"""The model families: the registry (registry.py), what they share (layers.py), one file per family."""
