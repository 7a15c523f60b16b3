"""Load a nanochat checkpoint directory (model_NNNNNN.pt + meta_NNNNNN.json), any generation.

`nanochat:sft|rl|base|mid` (+ --model-tag) follow nanochat's layout under its base dir:
$NANOCHAT_BASE_DIR (default ~/.cache/nanochat)/chatsft_checkpoints/d20/model_000700.pt,
with the tokenizer in <base>/tokenizer/tokenizer.pkl. The generation is told from the
weights' keys and shapes; `nanochat_config.json` in the checkpoint dir overrides it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from kvcache import Attention
from model.chat_formats.templates import NanochatFormat
from model.errors import ModelLoadError
from model.families.nanochat import Nanochat
from model.files import read_bytes, regular_file
from model.loading.nanochat_detect import config_from_checkpoint
from model.loading.options import LoadedModel, LoadOptions
from model.tokenizers.safe_pickle import load_encoding
from model.tokenizers.tokenizer import Tokenizer

SOURCES = {"base": "base_checkpoints", "mid": "mid_checkpoints", "sft": "chatsft_checkpoints",
           "rl": "chatrl_checkpoints"}
OVERRIDE_FILE = "nanochat_config.json"
SPECIAL_TOKENS = ["<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
                  "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>"]


def base_dir() -> Path:
    env = os.environ.get("NANOCHAT_BASE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "nanochat"


def pick_model_tag(checkpoints: Path) -> str:
    """Like nanochat: the deepest d<N> tag, else the most recently modified directory."""
    tags = [p for p in checkpoints.iterdir() if p.is_dir()] if checkpoints.is_dir() else []
    if not tags:
        raise ModelLoadError(f"no nanochat checkpoints in {checkpoints}")
    depths = [(int(m.group(1)), p.name) for p in tags if (m := re.match(r"d(\d+)", p.name))]
    if depths:
        return max(depths)[1]
    return max(tags, key=lambda p: p.stat().st_mtime).name


def checkpoint_dir(spec: str, opts: LoadOptions) -> Path:
    if not spec.startswith("nanochat:"):
        return Path(spec).expanduser()
    source = spec.removeprefix("nanochat:")
    if source not in SOURCES:
        raise ModelLoadError(f"unknown nanochat source {source!r}; use nanochat:{'|'.join(SOURCES)}")
    checkpoints = base_dir() / SOURCES[source]
    tag = opts.model_tag or pick_model_tag(checkpoints)
    path = checkpoints / tag
    if not path.is_dir():
        raise ModelLoadError(f"no model tag {tag!r} in {checkpoints}")
    return path


def pick_step(ckpt: Path, step: int | None) -> int:
    steps = sorted(int(m.group(1)) for p in ckpt.glob("model_*.pt")
                   if (m := re.fullmatch(r"model_(\d+)\.pt", p.name)))
    if not steps:
        raise ModelLoadError(f"no model_NNNNNN.pt checkpoint in {ckpt}")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ModelLoadError(f"no step {step} in {ckpt} (steps: {', '.join(map(str, steps))})")
    return step


def read_json(path: Path, what: str) -> dict:
    if not path.exists():
        raise ModelLoadError(f"{path}: missing ({what})")
    try:
        data = json.loads(read_bytes(path, what).decode("utf-8"))  # a regular file, size-capped
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    except (RecursionError, ValueError):  # nested past Python's limit; a number of 4,300+ digits
        raise ModelLoadError(f"{path}: JSON too deeply nested or with too large a number ({what})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object ({what})")
    return data


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Tensors only (weights_only=True): a checkpoint can't run code while we read it."""
    regular_file(path, "checkpoint")  # a FIFO would block torch.load forever
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # torch raises many kinds for a truncated or foreign file
        raise ModelLoadError(f"{path}: not a readable PyTorch checkpoint ({str(e).splitlines()[0][:200]})") from None
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise ModelLoadError(f"{path}: expected a dict of tensors (a model state_dict)")
    # torch.compile'd models save their keys under _orig_mod.
    return {k.removeprefix("_orig_mod."): v for k, v in data.items()}


def find_tokenizer(ckpt: Path, opts: LoadOptions) -> Path:
    if opts.tokenizer:
        path = Path(opts.tokenizer).expanduser()
        return path / "tokenizer.pkl" if path.is_dir() else path
    if os.environ.get("NANOCHAT_BASE_DIR"):
        return base_dir() / "tokenizer" / "tokenizer.pkl"
    # nanochat's layout: <base>/chatsft_checkpoints/d20 sits two levels below <base>/tokenizer.
    sibling = ckpt.resolve().parent.parent / "tokenizer" / "tokenizer.pkl"
    return sibling if sibling.exists() else base_dir() / "tokenizer" / "tokenizer.pkl"


def mismatch(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> str:
    """'' when the weights fit the model exactly, else a short account of how they don't."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    shapes = [k for k in want if k in state and tuple(state[k].shape) != want[k]]
    parts = []
    if missing:
        parts.append(f"{len(missing)} weights missing, e.g. {missing[0]}")
    if extra:
        parts.append(f"{len(extra)} unexpected weights, e.g. {extra[0]}")
    if shapes:
        k = shapes[0]
        parts.append(f"{k} is {tuple(state[k].shape)}, expected {want[k]}")
    return "; ".join(parts)


def build_model(ckpt: Path, step: int, opts: LoadOptions) -> Nanochat:
    model_path, meta_path = ckpt / f"model_{step:06d}.pt", ckpt / f"meta_{step:06d}.json"
    meta = read_json(meta_path, "nanochat's checkpoint metadata")
    override_path = ckpt / OVERRIDE_FILE
    overrides = read_json(override_path, "overrides") if override_path.exists() else {}
    state = read_weights(model_path)
    config = config_from_checkpoint(meta, state, overrides, model_path, meta_path, override_path)
    with torch.device("meta"):
        model = Nanochat(config, Attention(opts.attn))
    problem = mismatch(model, state)
    if problem:
        raise ModelLoadError(f"{model_path}: does not fit the {config.generation} nanochat model that "
                             f"{meta_path.name} describes ({problem})")
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device=opts.device, dtype=opts.dtype).eval().requires_grad_(False)


def load_nanochat(spec: str, opts: LoadOptions) -> LoadedModel:
    ckpt = checkpoint_dir(spec, opts)
    if not ckpt.is_dir():
        raise ModelLoadError(f"nanochat checkpoint directory not found: {ckpt}")
    step = pick_step(ckpt, opts.step)
    model = build_model(ckpt, step, opts)
    tok_path = find_tokenizer(ckpt, opts)
    if not tok_path.exists():
        raise ModelLoadError(f"tokenizer not found: {tok_path} (set NANOCHAT_BASE_DIR or pass --tokenizer)")
    enc = load_encoding(tok_path)
    if enc.n_vocab != model.config.vocab_size:
        raise ModelLoadError(f"{tok_path}: {enc.n_vocab} tokens, but the checkpoint in {ckpt} "
                             f"was trained with {model.config.vocab_size}")
    missing = [s for s in SPECIAL_TOKENS if s not in enc.special_tokens_set]
    if missing:
        raise ModelLoadError(f"{tok_path}: not a nanochat tokenizer (no {', '.join(missing)})")
    tokenizer = Tokenizer(enc, bos="<|bos|>")
    template = NanochatFormat(tokenizer)
    name = f"nanochat {ckpt.name} step {step} ({model.config.generation})"
    return LoadedModel(model, tokenizer, template, name, model.config.sequence_len)
