"""Model directories holding block-quantized weights (a converted GGUF): read and install them.

A weight `NAME` in a block format is stored as `NAME.q4` or `NAME.q8` (values), `NAME.scale`
and optionally `NAME.min` (model/cpu/blocks.py). On the CPU's default path each becomes a
`QLinear` that keeps them as they are; otherwise (`--dtype float32`, the GPU) they are
dequantized on load, exactly, and the model is the plain one.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from kvcache import Attention
from model.cpu import file_blocks
from model.cpu.blocks import Q4, Q8
from model.cpu.prefill_attn import CpuAttention
from model.cpu.prefill_ops import NativeNorm, native_norm
from model.cpu.qlinear import QEmbedding, QLinear
from model.errors import ModelLoadError

PAD = "nanochat.pad."
PARTS = (".q4", ".q8", ".scale", ".min", *(f".{k}" for k in file_blocks.KINDS))
VALUE_DTYPES = {Q4: torch.uint8, Q8: torch.int8}


def take_packed(weights: dict[str, torch.Tensor], where: str) -> dict[str, QLinear]:
    """Pop every block-quantized weight's parts from `weights`; return them as QLinears by
    weight name. ModelLoadError naming the file for parts that do not fit together."""
    for k in [k for k in weights if k.startswith(PAD)]:
        del weights[k]
    bases = {k.rsplit(".", 1)[0] for k in weights if k.endswith(PARTS)}
    out = {}
    for base in sorted(bases):
        parts = {p[1:]: weights.pop(base + p) for p in PARTS if base + p in weights}
        out[base] = _qlinear(base, parts, where)
    return out


def _file_qlinear(base: str, kind: str, parts: dict[str, torch.Tensor], where: str) -> QLinear:
    """A weight kept as the GGUF's bytes: one uint8 (rows, row bytes) tensor of whole blocks."""
    q, size = parts[kind], file_blocks.block(kind)[1]
    if len(parts) != 1 or q.dtype != torch.uint8 or q.dim() != 2 or q.shape[1] == 0 or q.shape[1] % size:
        have = ", ".join(f"{k} {p.dtype} {tuple(p.shape)}" for k, p in sorted(parts.items()))
        raise ModelLoadError(f"{where}: quantized weight {base} is corrupt ({have}; {kind} rows are whole "
                             f"{size}-byte blocks)")
    return QLinear(kind, q)


def _qlinear(base: str, parts: dict[str, torch.Tensor], where: str) -> QLinear:
    if file_kinds := [k for k in file_blocks.KINDS if k in parts]:
        return _file_qlinear(base, file_kinds[0], parts, where)
    kinds = [k for k in (Q4, Q8) if k in parts]
    if len(kinds) != 1 or "scale" not in parts:
        raise ModelLoadError(f"{where}: quantized weight {base} is incomplete (has {', '.join(sorted(parts))})")
    kind = kinds[0]
    q, scale, mn = parts[kind], parts["scale"], parts.get("min")
    bad = None
    if q.dtype != VALUE_DTYPES[kind] or q.dim() != 2:
        bad = f"values are {q.dtype} {tuple(q.shape)}"
    elif scale.dtype not in (torch.float16, torch.float32) or scale.dim() != 2 or scale.shape[0] != q.shape[0]:
        bad = f"scales are {scale.dtype} {tuple(scale.shape)} for {q.shape[0]} rows"
    elif mn is not None and (mn.dtype != scale.dtype or mn.shape != scale.shape):
        bad = f"mins are {mn.dtype} {tuple(mn.shape)}, scales {scale.dtype} {tuple(scale.shape)}"
    else:
        cols = q.shape[1] * (2 if kind == Q4 else 1)
        if cols % 32 or scale.shape[1] == 0 or cols % scale.shape[1] or cols // scale.shape[1] not in (16, 32):
            bad = f"{cols} columns with {scale.shape[1]} scales per row"
    if bad:
        raise ModelLoadError(f"{where}: quantized weight {base} is corrupt ({bad})")
    return QLinear(kind, q, scale, mn)


def dequantized(packed: dict[str, QLinear]) -> dict[str, torch.Tensor]:
    """Exact fp32 weights: the reference path (`--dtype float32`) and the GPU's."""
    return {base: ql.rows(None) for base, ql in packed.items()}


def install(model: nn.Module, packed: dict[str, QLinear], raw: dict[str, torch.Tensor]) -> None:
    """Swap every nn.Linear (and the embedding) of a loaded model for a QLinear: block weights
    as packed, dense ones in the file's own dtype (`raw`). Biases move over."""
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or name == "lm_head":
            continue
        key = f"{name}.weight"
        ql = packed.get(key) or QLinear.dense(raw[key])
        if mod.bias is not None:
            ql.set_bias(mod.bias)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, ql)
    embed_key = "model.embed_tokens.weight"
    table = packed.get(embed_key) or QLinear.dense(raw[embed_key])
    model.model.embed_tokens = QEmbedding(table)
    tied = model.config.tie_word_embeddings
    model.lm_head = table if tied else packed.get("lm_head.weight") or QLinear.dense(raw["lm_head.weight"])
    model.cache_dtype = torch.float16   # half the K/V bytes a token reads; the C step writes fp16 too
    for mod in model.modules():   # fp32 norms in one C pass (model/cpu/prefill_ops.py)
        if isinstance(getattr(type(mod), "one_plus_weight", None), bool) and not isinstance(mod, NativeNorm):
            mod.__class__ = native_norm(type(mod))
    if isinstance(getattr(model, "attn", None), Attention):   # a prefill's attention in C (model/cpu/prefill_attn.py)
        model.attn = CpuAttention.wrap(model.attn)
