"""What every loader is given (LoadOptions) and returns (LoadedModel)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from model.chat_formats.templates import ChatTemplate
from model.tokenizers.tokenizer import Tokenizer


@dataclass
class LoadOptions:
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    attn: str = "auto"
    # Keep a GGUF's block-quantized weights as they are and decode with the CPU kernels
    # (the CPU default); False dequantizes them exactly to `dtype` on load.
    quantized: bool = False
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
    notes: list[str] = field(default_factory=list)   # one line each, shown once at start
