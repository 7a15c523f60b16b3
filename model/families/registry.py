"""The model families, one entry each: the one table that loading, chat templates, the
CUDA-graph decode step and the model identity read.

A family is one file (its config dataclass and its forward, built from model/families/layers.py) plus
one entry in FAMILIES; docs/families.md says how to add one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from kvcache import KVCache
from model.chat_formats.recognize import gemma_template_for, template_for
from model.chat_formats.templates import ChatTemplate, NanochatFormat
from model.decode import triton_available
from model.decode.gemma_torch import GemmaTorchStep
from model.decode.graph_config import GraphConfig
from model.decode.llama_torch import LlamaTorchStep
from model.decode.nanochat_torch import NanochatTorchStep
from model.decode.prefill_step import GemmaPrefillStep, LlamaPrefillStep, PrefillStep
from model.families.gemma import Gemma, GemmaConfig
from model.families.llama import Llama, LlamaConfig
from model.families.nanochat import Nanochat
from model.families.nanochat_config import NanochatConfig
from model.tokenizers.tokenizer import Tokenizer


class DecodeStep(Protocol):
    """One token at `cache_seqlens`, capturable in a CUDA graph (see graphs.py)."""

    tok: torch.Tensor        # (1,) int64: the token to feed
    logits: torch.Tensor     # (vocab,) fp32, written by each call
    attn_name: str           # the attention backend it runs

    def __call__(self) -> torch.Tensor: ...


def attention_backend(model: torch.nn.Module) -> str:
    """'<device type>/<flash backend, or sdpa>': which kernels a model's numbers come from."""
    p = next(model.parameters())
    flash = getattr(getattr(model, "attn", None), "flash", None)
    return f"{p.device.type}/{flash.name if flash is not None else 'sdpa'}"


@dataclass(frozen=True)
class Family:
    name: str
    model: type[torch.nn.Module]   # model(config, attn); forward(idx, cache) -> fp32 logits
    config: type                   # its config dataclass
    build_step: Callable[[torch.nn.Module, KVCache, GraphConfig], DecodeStep]
    template: Callable[[Tokenizer, str | None, str], ChatTemplate]  # (tokenizer, chat template source, system)
    hf_architectures: frozenset[str] = frozenset()  # config.json "architectures" that load as this family
    # Config fields an architecture implies whatever its config.json says (Qwen2's q/k/v biases).
    fixed_config: dict[str, object] = field(default_factory=dict)
    backend_family: Callable[[torch.nn.Module], str] = attention_backend
    # The capturable prefill of B tokens (model/decode/prefill_step.py); None: prefill stays eager.
    build_prefill: type[PrefillStep] | None = None


def llama_step(model: Llama, cache: KVCache, cfg: GraphConfig) -> DecodeStep:
    c = model.config
    # The fused kernels serve q/k/v biases (Qwen2) or per-head q/k norms (Qwen3), not both at once.
    if cfg.fused and triton_available() and not (c.attention_bias and c.qk_norm):
        # Lazy: the fused step imports triton, which CPU-only runs never need to load.
        from model.decode.llama_fused import LlamaFusedStep
        return LlamaFusedStep(model, cache, cfg.attn, cfg.splits, cfg.num_splits, cfg.pdl)
    return LlamaTorchStep(model, cache, cfg.num_splits)


def nanochat_step(model: Nanochat, cache: KVCache, cfg: GraphConfig) -> DecodeStep:
    return NanochatTorchStep(model, cache, cfg.num_splits)


def gemma_step(model: Gemma, cache: KVCache, cfg: GraphConfig) -> DecodeStep:
    if cfg.fused and triton_available() and cache.device.type == "cuda":
        # Lazy: the fused step imports triton, which CPU-only runs never need to load.
        from model.decode.gemma_fused import GemmaFusedStep
        return GemmaFusedStep(model, cache, cfg.attn, cfg.splits, cfg.num_splits, cfg.pdl)
    return GemmaTorchStep(model, cache, cfg.num_splits)


def nanochat_template(tok: Tokenizer, chat_template: str | None = None, default_system: str = "") -> ChatTemplate:
    return NanochatFormat(tok, default_system=default_system)  # one format: nothing to pick


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", Llama, LlamaConfig, llama_step, template_for,
           hf_architectures=frozenset({"LlamaForCausalLM", "MistralForCausalLM"}), build_prefill=LlamaPrefillStep),
    # Qwen2 and Qwen3 are the Llama module with a flag each (model/families/llama.py); family_of() finds
    # "llama" for all three, whose step and identity suit them all.
    Family("qwen2", Llama, LlamaConfig, llama_step, template_for,
           hf_architectures=frozenset({"Qwen2ForCausalLM"}), fixed_config={"attention_bias": True},
           build_prefill=LlamaPrefillStep),
    Family("qwen3", Llama, LlamaConfig, llama_step, template_for,
           hf_architectures=frozenset({"Qwen3ForCausalLM"}), fixed_config={"qk_norm": True},
           build_prefill=LlamaPrefillStep),
    Family("nanochat", Nanochat, NanochatConfig, nanochat_step, nanochat_template),
    Family("gemma3", Gemma, GemmaConfig, gemma_step, gemma_template_for,
           hf_architectures=frozenset({"Gemma3ForCausalLM"}), build_prefill=GemmaPrefillStep),
)}


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
