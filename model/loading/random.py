"""`random:NAME`: random-weight models with a byte-level tokenizer, for tests and speed work.

The presets are the families' own (`Family.random`, declared in each family's file); the weights
come from a fixed seed, so the same spec is the same model everywhere.
"""

from __future__ import annotations

import torch

from kvcache import Attention
from model.chat_formats.templates import ChatML
from model.errors import ModelLoadError
from model.families.registry import FAMILIES, random_preset
from model.loading.options import LoadedModel, LoadOptions
from model.tokenizers.tokenizer import Tokenizer, byte_level_encoding

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def random_model(cfg, opts: LoadOptions, seed: int = 0) -> torch.nn.Module:
    """The module of the family whose config `cfg` is, its weights filled by that family's
    `random.init` under `seed`."""
    family = next(f for f in FAMILIES.values() if isinstance(cfg, f.config))
    torch.manual_seed(seed)
    model = family.model(cfg, Attention(opts.attn))
    with torch.no_grad():
        family.random.init(model)
    return model.to(device=opts.device, dtype=opts.dtype).eval()


def load_random(name: str, opts: LoadOptions) -> LoadedModel:
    found = random_preset(name)
    if found is None:
        names = [n for f in FAMILIES.values() for n in f.random.presets]
        raise ModelLoadError(f"unknown random preset {name!r}; choose one of {', '.join(names)}")
    family, preset = found
    cfg = family.config(**preset)
    tokenizer = Tokenizer(byte_level_encoding(f"bytes-{name}", CHATML_SPECIALS), eos="<|endoftext|>")
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ModelLoadError(f"preset {name}: tokenizer needs {tokenizer.vocab_size} ids, model has {cfg.vocab_size}")
    template = ChatML(tokenizer, default_system="You are a helpful assistant.")
    model = random_model(cfg, opts)
    return LoadedModel(model, tokenizer, template, f"random:{name}", model.max_seq_len)
