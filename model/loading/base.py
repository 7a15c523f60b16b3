"""The model spec dispatcher and what every loader returns."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from model.errors import ModelLoadError
from model.templates import ChatTemplate
from model.tokenizer import Tokenizer


@dataclass
class LoadOptions:
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    attn: str = "auto"
    step: int | None = None          # nanochat: checkpoint step (default: the last)
    tokenizer: str | None = None     # nanochat: path to tokenizer.pkl
    model_tag: str | None = None     # nanochat: e.g. d20


@dataclass
class LoadedModel:
    """A model ready to chat: `model(ids, cache) -> logits`, `model.new_cache(T)`."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    template: ChatTemplate
    name: str
    context_length: int


def load_model(spec: str, opts: LoadOptions | None = None) -> LoadedModel:
    """`random:NAME`, `nanochat:sft|rl|base`, a `.gguf` file, a nanochat checkpoint dir, or a
    model directory (canonical or Hugging Face Llama-family)."""
    opts = opts or LoadOptions()
    if spec.startswith("nanochat:"):
        from model.loading.nanochat import load_nanochat
        return load_nanochat(spec, opts)
    path = Path(spec).expanduser()
    if path.is_dir() and any(path.glob("model_*.pt")):
        from model.loading.nanochat import load_nanochat
        return load_nanochat(str(path), opts)
    if not spec.startswith("random:") and not path.exists():
        raise ModelLoadError(f"model not found: {spec} (expected a directory, a .gguf file, "
                             "random:tiny, or nanochat:sft)")
    flags = [f for f, v in (("--step", opts.step), ("--tokenizer", opts.tokenizer), ("--model-tag", opts.model_tag))
             if v is not None]
    if flags:
        raise ModelLoadError(f"{', '.join(flags)}: only for nanochat checkpoints, and {spec} is not one")
    if spec.startswith("random:"):
        from model.loading.random import load_random
        return load_random(spec.removeprefix("random:"), opts)
    if path.suffix == ".gguf":
        from model.loading.gguf import load_gguf
        return load_gguf(path, opts)
    if path.is_dir() and (path / "config.json").exists():
        from model.loading.hf import load_hf_dir
        return load_hf_dir(path, opts)
    raise ModelLoadError(f"{spec}: not a model (no config.json, model_*.pt, or .gguf suffix)")
