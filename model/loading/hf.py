"""Model directories: our canonical one and Hugging Face Llama-family ones are the same shape.

`config.json` + `*.safetensors` + `tokenizer.json` (+ `tokenizer_config.json`). Weights are
memory-mapped, so a warm load costs little more than reading the headers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from kvcache import Attention
from model.chat_formats.completion import CompletionFormat
from model.cpu.hugepages import into_arena, model_linears, own_the_rest
from model.errors import ModelLoadError
from model.families.registry import FAMILIES, Family, for_architectures
from model.files import read_bytes, regular_file
from model.limits import check_config
from model.loading.options import LoadedModel, LoadOptions
from model.loading.quantized import dequantized, install, take_packed
from model.tokenizers.bpe import tokenizer_from_json


def read_json(path: Path) -> dict:
    if not path.exists():
        raise ModelLoadError(f"{path}: missing")
    try:
        obj = json.loads(read_bytes(path, "config").decode("utf-8"))  # a regular file, size-capped
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, found {type(obj).__name__}")
    return obj


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        regular_file(f, "safetensors file")  # a FIFO would block safe_open forever
        try:
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():
                    weights[key] = sf.get_tensor(key)
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"{f}: unreadable safetensors ({e})") from None
    return weights


def build_model(family: Family, cfg, weights: dict[str, torch.Tensor], opts: LoadOptions,
                where: str, placed: bool) -> torch.nn.Module:
    """The family's model with Hugging Face-named weights (Llama-shaped names and tying).
    Block-quantized weights (a GGUF's) stay quantized when `opts.quantized`, else they are
    dequantized exactly (loading/quantized.py). Quantized weights not yet `placed` where the
    step reads them (a safetensors file's mapping) move into the huge-page arena."""
    with torch.device("meta"):
        model = family.model(cfg, Attention(opts.attn))
    packed = take_packed(weights, where)
    if not opts.quantized:
        weights.update(dequantized(packed))
        packed = {}
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    present = set(weights) | set(packed)
    missing = sorted(set(expected) - present)
    if missing:
        raise ModelLoadError(f"{where}: missing weights, e.g. {missing[0]} ({len(missing)} missing)")
    # Weights the config has no place for mean the config is wrong (say, too few layers): refuse
    # rather than chat with part of a model. Old checkpoints store rotary tables: those we rebuild.
    unused = sorted(k for k in present - set(expected) if not k.endswith("rotary_emb.inv_freq"))
    if unused:
        raise ModelLoadError(f"{where}: weights the config does not use, e.g. {unused[0]} ({len(unused)} "
                             f"unused; is config.json's num_hidden_layers right?)")
    for k, shape in expected.items():
        got = tuple(weights[k].shape) if k in weights else (packed[k].out_features, packed[k].in_features)
        if got != tuple(shape):
            raise ModelLoadError(f"{where}: {k} has shape {got}, config says {tuple(shape)}")
    state = {k: weights[k].to(device=opts.device, dtype=opts.dtype) for k in expected if k in weights}
    model.load_state_dict(state, strict=False, assign=True)
    if opts.quantized:
        install(model, packed, weights)
        if not placed and into_arena(model_linears(model)):   # 2 MB pages for the weights a token streams
            own_the_rest(model)
    elif cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def load_hf_dir(path: Path, opts: LoadOptions, weights: dict[str, torch.Tensor] | None = None) -> LoadedModel:
    """A model directory; `weights`, when given, are its tensors already where they stay (a GGUF
    opened in place: model/loading/gguf.py), and the directory holds only the small files."""
    config = read_json(path / "config.json")
    archs = config.get("architectures") or ["LlamaForCausalLM"]
    archs = {archs} if isinstance(archs, str) else set(map(str, archs)) if isinstance(archs, list) else {str(archs)}
    check_config(config, str(path / "config.json"))  # sizes sane before anything is allocated
    family = for_architectures(archs)
    if family is None:
        raise ModelLoadError(f"{path}: unsupported architecture {sorted(archs)[0]} (supported: "
                             f"{', '.join(sorted(a for f in FAMILIES.values() for a in f.hf_architectures))})")
    try:
        cfg = family.config.from_dict(config, **family.fixed_config)
    except ValueError as e:
        raise ModelLoadError(f"{path / 'config.json'}: {e}") from None
    placed = weights is not None
    model = build_model(family, cfg, weights if placed else read_safetensors(path), opts, str(path), placed)
    tokenizer_config = read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").exists() else {}
    try:
        tokenizer = tokenizer_from_json(path / "tokenizer.json", tokenizer_config)
    except (TypeError, KeyError, ValueError, AttributeError, IndexError) as e:  # valid JSON, wrong shape
        raise ModelLoadError(f"{path}: malformed tokenizer.json or tokenizer_config.json ({type(e).__name__}: "
                             f"{e})") from None
    if tokenizer.vocab_size > cfg.vocab_size:   # a token past the embedding failed every turn (IndexError)
        raise ModelLoadError(f"{path}: the vocabulary has {tokenizer.vocab_size:,} tokens but the embedding only "
                             f"{cfg.vocab_size:,} rows")
    system = tokenizer_config.get("nanochat_tui_default_system", "")
    template_src = tokenizer_config.get("chat_template")
    if not isinstance(system, str) or not isinstance(template_src, str | None):
        raise ModelLoadError(f"{path / 'tokenizer_config.json'}: chat_template and nanochat_tui_default_system "
                             "must be strings")
    ends = tokenizer_config.get("nanochat_tui_end_tokens") or []
    tokenizer.end_names = [n for n in ends if isinstance(n, str)]   # the GGUF's eos/eot/eom (gguf_vocab.py)
    try:
        if not template_src and config.get("nanochat_tui_tuning") == "base":
            template = CompletionFormat(tokenizer)   # a pretrained model continues a document (docs/chat-formats.md)
        else:
            template = family.template(tokenizer, template_src, system)
    except (ValueError, KeyError) as e:
        raise ModelLoadError(f"{path}: {e.args[0]}") from None
    special = tokenizer.special
    template.stop_ids |= {special[n] for n in tokenizer.end_names if n in special}   # stop on every end token
    name = config.get("nanochat_tui_name", path.name)
    return LoadedModel(model, tokenizer, template, name, cfg.max_position_embeddings,
                       notes=dequantized_note(config, name))


def dequantized_note(config: dict, name: str) -> list[str]:
    """The one-line note for a GGUF whose tensor types have no kernel (run as exact fp32)."""
    counts = config.get("nanochat_tui_dequantized_types")
    if not isinstance(counts, dict) or not counts:
        return []
    types = ", ".join(f"{k} ({v} tensor{'s' if v != 1 else ''})" for k, v in sorted(counts.items()))
    return [f"nanochat-tui: note: {name}: no kernel for {types}; dequantized exactly to fp32 (slower, more memory)"]
