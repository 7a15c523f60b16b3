"""A GGUF's SentencePiece vocabulary (`tokenizer.ggml.model = llama`) as the tokenizer.json and
tokenizer_config.json of the canonical model directory: Llama-family (Llama 2, TinyLlama,
Mistral) and Gemma's. Byte-level BPE ones are model/loading/gguf_meta.py's."""

from __future__ import annotations

from model.errors import ModelLoadError
from model.tokenizers.spm_gguf import tokenizer_json_from_gguf

# Ids a GGUF may name as the end of a turn besides EOS (llama.cpp's llama_vocab::token_is_eog).
END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def token_name(g, key: str) -> str | None:
    tokens = g.meta["tokenizer.ggml.tokens"]
    i = g.get(key)
    return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None


def end_tokens(g) -> list[str]:
    """The strings of every end-of-turn token the file names (EOS, EOT, EOM), once each."""
    names = [token_name(g, k) for k in END_KEYS]
    return list(dict.fromkeys(n for n in names if n))


def chat_template(g) -> str:
    template = g.get("tokenizer.chat_template", "")
    if not isinstance(template, str):
        raise ModelLoadError(f"{g.path}: tokenizer.chat_template should be text, not {template!r}")
    return template


def spm_tokenizer_files(g, flavor: str, tokenizer_class: str, context: int) -> tuple[dict, dict]:
    """tokenizer.json and tokenizer_config.json for a SentencePiece vocabulary; `flavor` is
    "llama" (merges by score, dummy prefix) or "gemma" (model/tokenizers/spm_gguf.py)."""
    meta = {k: v for k, v in g.meta.items() if k.startswith("tokenizer.ggml.")}
    if "tokenizer.ggml.tokens" not in meta:
        raise ModelLoadError(f"{g.path}: the GGUF has no tokenizer")
    if meta.get("tokenizer.ggml.model") != "llama":
        raise ModelLoadError(f"{g.path}: tokenizer model {meta.get('tokenizer.ggml.model')!r} is not supported "
                             f"for {g.arch} (SentencePiece 'llama' only)")
    template = chat_template(g)
    config = {
        "bos_token": token_name(g, "tokenizer.ggml.bos_token_id"),
        "eos_token": token_name(g, "tokenizer.ggml.eos_token_id"),
        "unk_token": token_name(g, "tokenizer.ggml.unknown_token_id"),
        "pad_token": token_name(g, "tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(g.get("tokenizer.ggml.add_bos_token", True)),
        "add_eos_token": bool(g.get("tokenizer.ggml.add_eos_token", False)),
        "model_max_length": g.get(f"{g.arch}.context_length", context),
        "chat_template": template or None, "tokenizer_class": tokenizer_class,
        "nanochat_tui_end_tokens": end_tokens(g),
    }
    return tokenizer_json_from_gguf(meta, str(g.path), flavor), config
