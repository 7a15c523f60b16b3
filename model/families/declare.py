"""What a family's file declares beside its module, for the loaders (model/loading/) to read: how
its GGUF files map onto its names and config.json (`GGUFLayout`), its `random:` presets
(`RandomWeights`), and the field checks its config dataclass runs. The loaders do the reading and
the checking every family shares; a family's file says only what is its own, so a new family
touches no loader.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from model.limits import Rules

LLAMA_SPM = ("llama", "LlamaTokenizer", 2048)   # Llama 2's kind: also any vocabulary-only file's

# llama.cpp's names of the Llama-shaped parts of a layer (blk.N.<part>), and Hugging Face's.
LLAMA_PARTS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


@dataclass(frozen=True)
class GGUFLayout:
    """A family's GGUF files (model/loading/gguf.py and gguf_meta.py read it).

    `config(g, shared)` gets the file (`g.get`, `g.need`, `g.f32`, `g.arch`) and the config.json
    keys every family reads the same way (sizes, heads, eps, rope_theta, context), already checked,
    and returns the whole config.json; a ValueError from it is the file's one-line error.
    """
    what: str                                   # in "unexpected tensor ... (supported: {what} tensors)"
    layer_names: dict[str, str]                 # llama.cpp's blk.N.<part> -> model.layers.N.<name>
    config: Callable[[Any, dict], dict]
    rules: Callable[[str], Rules] = lambda arch: []   # metadata keys refused, under the arch's prefix
    biased: tuple[str, ...] = ()                # parts that may carry a .bias
    fix_tensor: Callable[[str, np.ndarray], np.ndarray] | None = None   # undo a converter's change
    # A SentencePiece vocabulary (tokenizer.ggml.model "llama"): (flavor, tokenizer_class, context),
    # model/loading/gguf_vocab.py; `sentencepiece_only`: the family has no other kind.
    sentencepiece: tuple[str, str, int] = LLAMA_SPM
    sentencepiece_only: bool = False
    rope_theta: float = 10000.0                 # when the file has no <arch>.rope.freq_base
    context: int = 2048                         # when the file has no <arch>.context_length


@dataclass(frozen=True)
class RandomWeights:
    """`random:NAME` presets (model/loading/random.py): config fields a name, and how to fill the
    parameters (called under a fixed seed, so one name is one model everywhere)."""
    presets: dict[str, dict] = field(default_factory=dict)
    init: Callable[[torch.nn.Module], None] = lambda model: None


def check_fields(cfg, whole: Sequence[str] = (), positive: Sequence[str] = (), flags: Sequence[str] = ()) -> None:
    """ValueError naming the first field of a config no model can be built from: a hand-edited
    config.json or GGUF metadata must fail here, not as a ZeroDivisionError or NaN later."""
    for name in whole:
        if type(v := getattr(cfg, name)) is not int or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
    for name in positive:
        if type(v := getattr(cfg, name)) not in (int, float) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name} must be a positive number, not {v!r}")
    for name in flags:
        if type(v := getattr(cfg, name)) is not bool:
            raise ValueError(f"{name} must be true or false, not {v!r}")


def check_heads(cfg) -> None:
    """Query heads that share the KV heads evenly, and a head size rotary can halve."""
    if cfg.num_attention_heads % cfg.num_key_value_heads or cfg.head_dim % 2:
        raise ValueError(f"num_attention_heads {cfg.num_attention_heads}, num_key_value_heads "
                         f"{cfg.num_key_value_heads}, head_dim {cfg.head_dim}: heads must group evenly "
                         "and the head size must be even")
