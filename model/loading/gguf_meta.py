"""A GGUF file's metadata: opened with clear errors, mapped to config.json and tokenizer files."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model.errors import ModelLoadError
from model.families.declare import LLAMA_SPM
from model.families.registry import gguf_families
from model.limits import Rules, check_config, refuse_unsupported
from model.loading.gguf_check import check_gguf
from model.loading.gguf_vocab import chat_template, end_tokens, spm_tokenizer_files
from model.tokenizers.bpe import make_tokenizer, tokenizer_json, vocab_from_gguf


def is_int(v) -> bool:
    return type(v) is int


def is_number(v) -> bool:
    return type(v) in (int, float)


def is_text(v) -> bool:
    return type(v) is str


def is_flag(v) -> bool:
    return type(v) in (bool, int)


def list_of(item):
    return lambda v: type(v) is list and all(map(item, v))


def int_or_ints(v) -> bool:   # per-layer counts are arrays: refused later, in words (hf_config)
    return is_int(v) or list_of(is_int)(v)


INT, NUMBER, TEXT, FLAG = (is_int, "a whole number"), (is_number, "a number"), (is_text, "text"), (is_flag, "a flag")
TOKEN_ID = INT
# Every metadata key this module, the vocabulary readers and the families read, with the type
# it must have: checked once, before any is used (issue 45: `general.architecture` as an array
# was `TypeError: unhashable type: 'list'`). `{a}` is the architecture's prefix.
META_TYPES = {
    "general.architecture": TEXT, "general.alignment": INT, "general.name": TEXT, "general.basename": TEXT,
    "general.finetune": TEXT, "general.type": TEXT, "general.tags": (list_of(is_text), "a list of text"),
    "tokenizer.chat_template": TEXT, "tokenizer.ggml.model": TEXT, "tokenizer.ggml.pre": TEXT,
    "tokenizer.ggml.tokens": (list_of(is_text), "a list of text"),
    "tokenizer.ggml.token_type": (list_of(is_int), "a list of whole numbers"),
    "tokenizer.ggml.merges": (list_of(is_text), "a list of text"),
    "tokenizer.ggml.scores": (list_of(is_number), "a list of numbers"),
    **{f"tokenizer.ggml.{name}_token_id": TOKEN_ID for name in ("bos", "eos", "eot", "eom", "unknown", "padding")},
    **{f"tokenizer.ggml.{name}": FLAG for name in ("add_bos_token", "add_eos_token", "add_space_prefix")},
    "{a}.context_length": INT, "{a}.embedding_length": INT, "{a}.block_count": INT,
    "{a}.feed_forward_length": (int_or_ints, "a whole number"),
    "{a}.attention.head_count": (int_or_ints, "a whole number"),
    "{a}.attention.head_count_kv": (int_or_ints, "a whole number"),
    "{a}.attention.key_length": INT, "{a}.attention.value_length": INT, "{a}.attention.sliding_window": INT,
    "{a}.attention.layer_norm_rms_epsilon": NUMBER, "{a}.rope.freq_base": NUMBER, "{a}.rope.dimension_count": INT,
    "{a}.rope.scaling.type": TEXT, "{a}.rope.scaling.factor": NUMBER, "{a}.final_logit_softcapping": NUMBER,
}


def check_meta_types(meta: dict, path: Path) -> None:
    """One line naming the first key whose value has the wrong type (the architecture first)."""
    arch = meta.get("general.architecture")
    for pattern, (ok, kind) in META_TYPES.items():
        key = pattern.format(a=arch) if is_text(arch) else pattern
        if key in meta and not ok(meta[key]):
            shown = type(meta[key]).__name__ if isinstance(meta[key], list | dict) else repr(meta[key])[:40]
            raise ModelLoadError(f"{path}: GGUF metadata {key!r} should be {kind}, not {shown}")


# The architectures we convert are the families with a GGUF layout (model/families/declare.py),
# named as general.architecture names them. Their metadata keys share one layout under the
# architecture's prefix (llama.cpp's convert_hf_to_gguf.py): what every family reads the same
# way is read here, the rest by the family's own `GGUFLayout.config`.


@dataclass
class GGUFFile:
    path: Path
    reader: object          # gguf.GGUFReader
    meta: dict              # key -> plain Python value, tensors excluded

    def get(self, key: str, default=None):
        return self.meta.get(key, default)

    @property
    def arch(self) -> str:
        return self.meta["general.architecture"]

    def need(self, key: str):
        if key not in self.meta:
            raise ModelLoadError(f"{self.path}: GGUF metadata {key!r} is missing")
        return self.meta[key]

    def f32(self, key: str, default: float | None = None) -> float:
        x = self.need(key) if default is None else self.get(key, default)
        if type(x) not in (int, float):
            raise ModelLoadError(f"{self.path}: {key} should be a number, not {x!r}")
        # GGUF stores floats as float32; its shortest repr (1e-05, not 9.99999974e-06) is the intended value.
        return float(str(np.float32(x)))

    def refuse(self, rules: Rules) -> None:
        """One-line errors naming the metadata key (and the file) for what the module cannot run."""
        try:
            refuse_unsupported(self.meta, rules)
        except ValueError as e:
            raise ModelLoadError(f"{self.path}: {e}") from None


def open_gguf(path: Path, vocabulary: bool = True) -> GGUFFile:
    """The checked file and its metadata; `vocabulary=False` skips the vocabulary's strings
    (gguf_fast.VOCABULARY), for a file whose tokenizer is already cached."""
    # Lazy: the gguf package costs ~30 ms to import (more on a cold disk), and only a .gguf needs it.
    from model.loading.gguf_fast import FastReader

    check_gguf(path)  # every count and tensor range checked before the reader trusts them
    try:
        reader = FastReader(path, "c", vocabulary)   # copy-on-write: arrays torch can wrap (nothing writes them)
        meta = {**{k: f.contents() for k, f in reader.fields.items() if k.startswith("GGUF.")}, **reader.values}
    except (ValueError, IndexError, KeyError, OSError, UnicodeDecodeError, OverflowError, struct.error,
            RecursionError) as e:
        raise ModelLoadError(f"{path}: not a readable GGUF file, truncated or corrupt ({e})") from None
    check_meta_types(meta, path)
    arch = meta.get("general.architecture")
    if arch not in (supported := gguf_families()):
        raise ModelLoadError(f"{path}: GGUF architecture {arch!r} is not supported (supported: "
                             f"{', '.join(supported)})")
    return GGUFFile(path, reader, meta)


def hf_config(g: GGUFFile, name: str) -> dict:
    """config.json (Hugging Face keys) from the `<arch>.*` metadata: the keys every family has,
    checked here, then the family's own (`GGUFLayout.config`)."""
    a, family = g.arch, gguf_families()[g.arch]
    g.refuse(family.gguf.rules(a))
    heads = g.need(f"{a}.attention.head_count")
    kv = g.get(f"{a}.attention.head_count_kv", heads)
    if not isinstance(heads, int) or not isinstance(kv, int):
        raise ModelLoadError(f"{g.path}: per-layer head counts are not supported")
    hidden = g.need(f"{a}.embedding_length")
    if type(hidden) is not int or heads < 1 or hidden < heads:
        raise ModelLoadError(f"{g.path}: {a}.embedding_length {hidden!r} and {a}.attention.head_count "
                             f"{heads} do not make a model")
    shared = {
        "hidden_size": hidden, "intermediate_size": g.need(f"{a}.feed_forward_length"),
        "num_hidden_layers": g.need(f"{a}.block_count"), "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": g.get(f"{a}.attention.key_length", hidden // heads),
        "rms_norm_eps": g.f32(f"{a}.attention.layer_norm_rms_epsilon"),
        "rope_theta": g.f32(f"{a}.rope.freq_base", family.gguf.rope_theta),
        "max_position_embeddings": g.get(f"{a}.context_length", family.gguf.context),
        "torch_dtype": "float32", "nanochat_tui_name": name,
    }
    check_config(shared, str(g.path))  # 2**31 layers: refused before anything loops over them
    try:
        config = family.gguf.config(g, shared)
        family.config.from_dict(config)  # fail on the .gguf's name, not on the converted copy's
    except (ValueError, TypeError) as e:
        raise ModelLoadError(f"{g.path}: {e}") from None
    return config


def default_system(chat_template: str) -> str:
    """The system prompt a ChatML template inserts when the chat has none (SmolLM2's does)."""
    m = re.search(r"<\|im_start\|>system(?:\n|\\n)([^'\"{}<]*)<\|im_end\|>", chat_template or "")
    return m.group(1) if m else ""


def tokenizer_files(g: GGUFFile) -> tuple[dict, dict]:
    """tokenizer.json and tokenizer_config.json contents for the GGUF's vocabulary."""
    family = gguf_families().get(g.arch)   # None: a vocabulary-only file (tests/test_llama_vocab.py)
    if (family and family.gguf.sentencepiece_only) or g.get("tokenizer.ggml.model") == "llama":
        # SentencePiece: Llama 2, TinyLlama, Mistral; Gemma
        return spm_tokenizer_files(g, *(family.gguf.sentencepiece if family else LLAMA_SPM))
    meta = {k: v for k, v in g.meta.items() if k.startswith("tokenizer.ggml.")}
    if "tokenizer.ggml.tokens" not in meta:
        raise ModelLoadError(f"{g.path}: the GGUF has no tokenizer")
    vocab = vocab_from_gguf(meta, str(g.path))
    tokens = vocab.tokens

    def token(key: str) -> str | None:
        i = g.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    if eos == "<|im_end|>" and "<|endoftext|>" in vocab.special:
        # ChatML stops on <|im_end|> anyway; naming the end-of-document token as EOS makes the
        # model's other way of ending (id 0 in SmolLM2) a stop too.
        eos = "<|endoftext|>"
    bos, eos = (t if t in vocab.special else None for t in (bos, eos))
    make_tokenizer(vocab, bos, eos)
    template = chat_template(g)
    config = {
        "bos_token": bos, "eos_token": eos, "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(g.get("tokenizer.ggml.add_bos_token", False)),
        "model_max_length": g.get(f"{g.arch}.context_length", 2048),
        "chat_template": template, "nanochat_tui_default_system": default_system(template),
        "tokenizer_class": "GPT2Tokenizer", "nanochat_tui_end_tokens": end_tokens(g),
    }
    return tokenizer_json(vocab, g.get("tokenizer.ggml.pre", "gpt-2")), config
