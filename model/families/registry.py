"""The model families, one entry each: the one table that loading, chat templates, the
decode steps (model/decode/steps.py, by family name) and the model identity read.

A family is one file (its config dataclass and its forward, built from model/families/layers.py) plus
one entry in FAMILIES; docs/families.md says how to add one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from model.chat_formats.recognize import gemma_template_for, template_for
from model.chat_formats.templates import ChatTemplate, NanochatFormat
from model.families import gemma, llama, nanochat
from model.families.declare import GGUFLayout, RandomWeights
from model.families.gemma import Gemma, GemmaConfig
from model.families.llama import Llama, LlamaConfig
from model.families.nanochat import Nanochat
from model.families.nanochat_config import NanochatConfig
from model.tokenizers.tokenizer import Tokenizer


def attention_backend(model: torch.nn.Module) -> str:
    """'<device type>/<flash backend, or sdpa>': which kernels a model's numbers come from."""
    p = next(model.parameters())
    flash = getattr(getattr(model, "attn", None), "flash", None)
    return f"{p.device.type}/{flash.name if flash is not None else 'sdpa'}"


@dataclass(frozen=True)
class Family:
    name: str
    model: type[torch.nn.Module]   # model(config, attn); forward(idx, cache, last, step) -> fp32 logits
    config: type                   # its config dataclass
    template: Callable[[Tokenizer, str | None, str], ChatTemplate]  # (tokenizer, chat template source, system)
    hf_architectures: frozenset[str] = frozenset()  # config.json "architectures" that load as this family
    # Config fields an architecture implies whatever its config.json says (Qwen2's q/k/v biases).
    fixed_config: dict[str, object] = field(default_factory=dict)
    backend_family: Callable[[torch.nn.Module], str] = attention_backend
    # GGUF files whose general.architecture is this family's name load through it (declare.py).
    gguf: GGUFLayout | None = None
    random: RandomWeights = RandomWeights()   # its `random:NAME` presets


def nanochat_template(tokenizer: Tokenizer, chat_template: str | None = None, default_system: str = "") -> ChatTemplate:
    return NanochatFormat(tokenizer, default_system=default_system)  # one format: nothing to pick


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", Llama, LlamaConfig, template_for, gguf=llama.GGUF, random=llama.RANDOM,
           hf_architectures=frozenset({"LlamaForCausalLM", "MistralForCausalLM"})),
    # Qwen2 and Qwen3 are the Llama module with a flag each (model/families/llama.py); family_of() finds
    # "llama" for all three, whose step and identity suit them all.
    Family("qwen2", Llama, LlamaConfig, template_for,
           hf_architectures=frozenset({"Qwen2ForCausalLM"}), fixed_config={"attention_bias": True}, gguf=llama.GGUF),
    Family("qwen3", Llama, LlamaConfig, template_for,
           hf_architectures=frozenset({"Qwen3ForCausalLM"}), fixed_config={"qk_norm": True}, gguf=llama.GGUF),
    Family("nanochat", Nanochat, NanochatConfig, nanochat_template, random=nanochat.RANDOM),
    Family("gemma3", Gemma, GemmaConfig, gemma_template_for, gguf=gemma.GGUF, random=gemma.RANDOM,
           hf_architectures=frozenset({"Gemma3ForCausalLM"})),
)}


def gguf_families() -> dict[str, Family]:
    """general.architecture -> the family that loads it, in the table's order."""
    return {f.name: f for f in FAMILIES.values() if f.gguf is not None}


def random_preset(name: str) -> tuple[Family, dict] | None:
    """The family whose `random:` presets hold `name`, and the preset's config fields."""
    return next(((f, f.random.presets[name]) for f in FAMILIES.values() if name in f.random.presets), None)


def family_of(model: torch.nn.Module) -> Family | None:
    return next((f for f in FAMILIES.values() if isinstance(model, f.model)), None)


def for_architectures(architectures: set[str]) -> Family | None:
    """The family a Hugging Face config.json's "architectures" name, if any."""
    return next((f for f in FAMILIES.values() if f.hf_architectures & architectures), None)


def backend_family(model: torch.nn.Module) -> str:
    """Part of a model's identity: stored KV snapshots are keyed by it, so its strings must
    not change. A model of no registered family gets the common answer."""
    family = family_of(model)
    return (family.backend_family if family else attention_backend)(model)
