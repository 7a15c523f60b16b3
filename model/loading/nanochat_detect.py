"""Which nanochat generation a checkpoint is, from its weights' keys and shapes and its meta.

The weights say what exists (value embeddings and their gate width, smear, backout,
lambdas, vocab padding); the generation supplies the constants the weights can't show
(RoPE base, q/k scale, gate scale, windows, softcap). Where two generations have identical
weights (2026-01 and 2026-03-02 differ only in softcap), nanochat_config.json decides.
"""

from __future__ import annotations

from pathlib import Path

import torch

from model.errors import ModelLoadError
from model.families.nanochat_config import GENERATIONS, NanochatConfig

SHAPE_FIELDS = {"sequence_len": int, "vocab_size": int, "n_layer": int, "n_head": int, "n_kv_head": int,
                "n_embd": int, "window_pattern": str}
REQUIRED = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
# Experiments that lived for hours or days on nanochat's master: their weights can't be run right.
EXPERIMENTS = {
    "value_embed_A.": "low-rank value embeddings (e3f58b8, 2026-01-16)",
    "value_embed.": "a single shared value embedding (0b58d70, 2026-01-16)",
    "v0_lambdas": "value embeddings on every layer (9a88194, 2026-01-16)",
    "bigram_embed.": "hashed bigram embeddings (59e36cc, 2026-01-25, reverted 2026-01-28)",
}
_DEFAULTS = NanochatConfig()


def detect_generation(state: dict[str, torch.Tensor]) -> str:
    for prefix, what in EXPERIMENTS.items():
        if any(k.startswith(prefix) for k in state):
            raise ValueError(f"comes from a short-lived nanochat experiment, {what}, which is not supported")
    gates = [v for k, v in sorted(state.items()) if k.endswith(".attn.ve_gate.weight")]
    if "smear_gate.weight" in state:
        return "2026-03-14"
    if gates:
        by_width = {32: "2026-01", 12: "2026-03-09"}
        width = gates[0].shape[-1]
        if width not in by_width:
            raise ValueError(f"has value-embedding gates {width} channels wide, which no known generation "
                             "has; name the generation in nanochat_config.json")
        return by_width[width]
    return "2026-01" if "resid_lambdas" in state else "2025-10"


def structure(state: dict[str, torch.Tensor]) -> dict:
    """What the weights themselves show, whatever the generation's constants."""
    wte = state.get("transformer.wte.weight")
    if wte is None or wte.ndim != 2:
        raise ValueError("has no transformer.wte.weight embedding")
    gates = [v for k, v in sorted(state.items()) if k.endswith(".attn.ve_gate.weight")]
    smear = state.get("smear_gate.weight")
    return dict(padded_vocab_size=wte.shape[0], lambdas="resid_lambdas" in state,
                ve_gate_channels=gates[0].shape[-1] if gates else 0,
                smear_channels=smear.shape[-1] if smear is not None else 0,
                backout="backout_lambda" in state)


def shapes(meta: dict) -> dict:
    cfg = meta.get("model_config")
    if not isinstance(cfg, dict):
        raise ValueError("has no model_config object")
    unknown = sorted(set(cfg) - set(SHAPE_FIELDS))
    if unknown:  # a newer nanochat: running it with our constants could be silently wrong
        raise ValueError(f"has model_config fields this app does not know: {', '.join(unknown)}")
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        raise ValueError(f"model_config lacks {', '.join(missing)}")
    for k, v in cfg.items():
        if type(v) is not SHAPE_FIELDS[k]:
            raise ValueError(f"model_config.{k} should be {SHAPE_FIELDS[k].__name__}, not {v!r}")
    return dict(cfg)


def check_overrides(overrides: dict) -> dict:
    for k, v in overrides.items():
        if not hasattr(_DEFAULTS, k):
            raise ValueError(f"unknown field {k!r} (known: {', '.join(vars(_DEFAULTS))})")
        want = type(getattr(_DEFAULTS, k))
        ok = isinstance(v, want) and not (want is int and isinstance(v, bool))
        if want is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not ok:
            raise ValueError(f"{k} should be {want.__name__}, not {v!r}")
    if overrides.get("generation", next(iter(GENERATIONS))) not in GENERATIONS:
        raise ValueError(f"unknown generation {overrides['generation']!r} (known: {', '.join(GENERATIONS)})")
    return overrides


def config_from_checkpoint(meta: dict, state: dict[str, torch.Tensor], overrides: dict,
                           model_path: Path, meta_path: Path, override_path: Path) -> NanochatConfig:
    """Generation constants <- what the weights show <- meta's shapes <- the override file."""
    try:
        overrides = check_overrides(overrides)
    except ValueError as e:
        raise ModelLoadError(f"{override_path}: {e}") from None
    try:
        generation = overrides.get("generation") or detect_generation(state)
        fields = {**GENERATIONS[generation], "generation": generation, **structure(state)}
    except ValueError as e:
        raise ModelLoadError(f"{model_path}: {e}") from None
    try:
        fields.update(shapes(meta))
    except ValueError as e:
        raise ModelLoadError(f"{meta_path}: {e}") from None
    config = NanochatConfig(**{**fields, **overrides})
    try:
        config.validate()
    except ValueError as e:
        where = f"{meta_path} with {override_path}" if overrides else str(meta_path)
        raise ModelLoadError(f"{where}: {e}") from None
    return config
