"""Which steps serve a model: its plain decode step, and the fast paths some families have.

The registry (model/families/registry.py) says what a family is; this says how it decodes,
keyed by family name, so that neither the kernels nor the families import each other. A
family with no entry here still decodes, eagerly and through the plain capturable step; the
fused Triton step, the captured prefill and the CPU's C step are extras for the shapes they serve.
"""

from __future__ import annotations

from typing import Protocol

import torch

from kvcache import KVCache
from model.cpu.step import CpuStep, build_cpu_step
from model.decode import triton_available
from model.decode.graph_config import GraphConfig
from model.decode.prefill_step import GemmaPrefillStep, LlamaPrefillStep, PrefillStep
from model.decode.torch_step import TorchStep
from model.families.registry import family_of


class DecodeStep(Protocol):
    """One token at `cache_seqlens`, capturable in a CUDA graph (see graphs.py)."""

    token: torch.Tensor        # (1,) int64: the token to feed
    logits: torch.Tensor     # (vocab,) fp32, written by each call
    attn_name: str           # the attention backend it runs

    def __call__(self) -> torch.Tensor: ...


def llama_step(model: torch.nn.Module, cache: KVCache, cfg: GraphConfig) -> DecodeStep:
    """The fused step where the kernels serve the shape, else the family's forward."""
    c = model.config
    # The fused kernels serve q/k/v biases (Qwen2) or per-head q/k norms (Qwen3), not both at once.
    if cfg.fused and triton_available() and not (c.attention_bias and c.qk_norm):
        # Lazy: the fused step imports triton, which CPU-only runs never need to load.
        from model.decode.llama_fused import LlamaFusedStep
        return LlamaFusedStep(model, cache, cfg.attn, cfg.splits, cfg.num_splits, cfg.pdl)
    return TorchStep(model, cache, cfg.num_splits)


def gemma_step(model: torch.nn.Module, cache: KVCache, cfg: GraphConfig) -> DecodeStep:
    """The fused step on CUDA, else the family's forward."""
    if cfg.fused and triton_available() and cache.device.type == "cuda":
        # Lazy: the fused step imports triton, which CPU-only runs never need to load.
        from model.decode.gemma_fused import GemmaFusedStep
        return GemmaFusedStep(model, cache, cfg.attn, cfg.splits, cfg.num_splits, cfg.pdl)
    return TorchStep(model, cache, cfg.num_splits)


# family name -> its fused step, where it has one (else its own forward: TorchStep). family_of()
# names the module's first family, so Qwen2 and Qwen3 (the Llama module with a flag each) come as "llama".
FUSED_STEPS = {"llama": llama_step, "gemma3": gemma_step}
PREFILL_STEPS: dict[str, type[PrefillStep]] = {"llama": LlamaPrefillStep, "gemma3": GemmaPrefillStep}
CPU_STEPS = {"llama", "gemma3"}   # the layer shapes qdecode.c runs


def family_name(model: torch.nn.Module) -> str | None:
    """The registry's name for the model's family (Qwen2 and Qwen3 are "llama"), or None."""
    family = family_of(model)
    return family.name if family else None


def build_step(model: torch.nn.Module, cache: KVCache, cfg: GraphConfig) -> DecodeStep | None:
    """The capturable decode step of this model's family, or None (then decode stays eager)."""
    family = family_of(model)
    if family is None:
        return None
    fused = FUSED_STEPS.get(family.name)
    return fused(model, cache, cfg) if fused else TorchStep(model, cache, cfg.num_splits)


def prefill_step_for(model: torch.nn.Module) -> type[PrefillStep] | None:
    """The capturable prefill of B tokens (model/decode/prefill_step.py); None: prefill stays eager."""
    family = family_of(model)
    return PREFILL_STEPS.get(family.name) if family else None


def cpu_step(model: torch.nn.Module, cache: KVCache) -> CpuStep | None:
    """The C step (model/cpu/step.py) for a family whose layers qdecode.c runs, else None."""
    family = family_of(model)
    return build_cpu_step(model, cache) if family and family.name in CPU_STEPS else None
