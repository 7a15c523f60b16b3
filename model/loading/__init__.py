"""Turn a model spec (a path, `random:NAME`, ...) into a ready model, tokenizer and template."""

from model.loading.base import LoadedModel, load_model

__all__ = ["LoadedModel", "load_model"]
