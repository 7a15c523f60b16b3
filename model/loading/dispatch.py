"""The model spec dispatcher: which loader a spec is for."""

from __future__ import annotations

from pathlib import Path

from model.errors import ModelLoadError
from model.loading.gguf_open import load_gguf
from model.loading.hf import load_hf_dir
from model.loading.nanochat import load_nanochat
from model.loading.options import LoadedModel, LoadOptions
from model.loading.random import load_random


def load_model(spec: str, opts: LoadOptions | None = None) -> LoadedModel:
    """`random:NAME`, `nanochat:sft|rl|base`, a `.gguf` file, a nanochat checkpoint dir, or a
    model directory (canonical or Hugging Face Llama-family)."""
    opts = opts or LoadOptions()
    if spec.startswith("nanochat:"):
        return load_nanochat(spec, opts)
    path = Path(spec).expanduser()
    if path.is_dir() and any(path.glob("model_*.pt")):
        return load_nanochat(str(path), opts)
    if not spec.startswith("random:") and not path.exists():
        raise ModelLoadError(f"model not found: {spec} (expected a directory, a .gguf file, "
                             "random:tiny, or nanochat:sft)")
    flags = [f for f, v in (("--step", opts.step), ("--tokenizer", opts.tokenizer), ("--model-tag", opts.model_tag))
             if v is not None]
    if flags:
        raise ModelLoadError(f"{', '.join(flags)}: only for nanochat checkpoints, and {spec} is not one")
    if spec.startswith("random:"):
        return load_random(spec.removeprefix("random:"), opts)
    if path.suffix == ".gguf":
        return load_gguf(path, opts)
    if path.is_dir() and (path / "config.json").exists():
        return load_hf_dir(path, opts)
    raise ModelLoadError(f"{spec}: not a model (no config.json, model_*.pt, or .gguf suffix)")
