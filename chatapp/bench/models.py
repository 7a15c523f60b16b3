"""The models the benchmark runs: the real default model when it is on disk, random shapes otherwise."""

from __future__ import annotations

from pathlib import Path

from chatapp.pull.fetch import default_model_dir, is_installed
from model.loading import LoadedModel, LoadOptions, load_model


def random_nanochat(shape: str, opts: LoadOptions) -> LoadedModel:
    """nanochat's own module at its d20 or d32 shape, random weights (the family's `nanochat-` presets)."""
    lm = load_model(f"random:nanochat-{shape}", opts)
    lm.name = f"random-nanochat:{shape}"
    return lm


def default_model_path() -> Path | None:
    """The converted default model if `nanochat-tui pull` already ran; the bench never downloads."""
    path = default_model_dir()
    return path if is_installed(path) else None


def resolve(spec: str, opts: LoadOptions, gguf: str | None) -> tuple[LoadedModel, str]:
    """(model, note). `default` is SmolLM2-135M-Instruct from --gguf or the pulled copy; if neither
    exists it falls back to random weights of the same shape and says so."""
    if spec.startswith("random-nanochat:"):
        return random_nanochat(spec.split(":", 1)[1], opts), ""
    if spec == "default":
        path = gguf or default_model_path()
        if path is None:
            return load_model("random:smollm2-135m", opts), "real SmolLM2 not on disk: random weights, same shape"
        lm = load_model(str(path), opts)
        lm.name = "SmolLM2-135M-Instruct"
        return lm, ""
    return load_model(spec, opts), ""
