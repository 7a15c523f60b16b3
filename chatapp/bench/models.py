"""The models the benchmark runs: the real default model when it is on disk, random shapes otherwise."""

from __future__ import annotations

from pathlib import Path

import torch

from chatapp.pull.fetch import default_model_dir, is_installed
from kvcache import Attention
from model.families.nanochat import Nanochat
from model.families.nanochat_config import LATEST, NanochatConfig
from model.loading import LoadedModel, LoadOptions, load_model

# nanochat's d20 shape, random weights, the newest generation's architecture.
NANOCHAT_SHAPES = {"d20": dict(n_layer=20, n_head=10, n_kv_head=10, n_embd=1280),
                   "d32": dict(n_layer=32, n_head=16, n_kv_head=16, n_embd=2048)}


def random_nanochat(shape: str, opts: LoadOptions) -> LoadedModel:
    cfg = NanochatConfig.for_generation(LATEST, sequence_len=8192, vocab_size=32768, **NANOCHAT_SHAPES[shape])
    torch.manual_seed(0)
    model = Nanochat(cfg, _attention(opts))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lambda" not in name:
                p.normal_(0.0, 0.02 if p.dim() == 2 and p.shape[0] >= cfg.vocab_size else 0.04)
    model = model.to(device=opts.device, dtype=opts.dtype).eval()
    byte_lm = load_model("random:tiny")  # a byte tokenizer and a ChatML template are all the bench needs
    return LoadedModel(model, byte_lm.tokenizer, byte_lm.template, f"random-nanochat:{shape}", 8192)


def _attention(opts: LoadOptions):
    return Attention(opts.attn)


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
