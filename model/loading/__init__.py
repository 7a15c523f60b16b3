"""Turn a model spec (a path, `random:NAME`, ...) into a ready model, tokenizer and template."""

from model.loading.dispatch import LoadedModel, LoadOptions, load_model

__all__ = ["LoadedModel", "LoadOptions", "load_model"]
