"""A GGUF's SentencePiece vocabulary (`tokenizer.ggml.model = llama`) as a tokenizer.json that
`tokenizers` runs with llama.cpp's ids (model/tokenizers/spm.py runs it; docs/tokenizers.md).

A GGUF carries the pieces, their scores and types, but no merges. llama.cpp's SentencePiece
tokenizer starts from characters and repeatedly joins the adjacent pair whose concatenation is
the piece with the highest score; a character no piece covers becomes its <0xXX> byte tokens
(else the unknown token). A BPE merge list sorted by the merged piece's score does the same.
Two flavors:

- **llama** (Llama 2, TinyLlama, Mistral, Vicuna, ...): merges by score, and with
  `add_space_prefix` (llama.cpp's default for these) a "▁" before the text and after every
  added token, which is what a `Prepend` normalizer does to each piece of text between added
  tokens. Llama 2's scores are not in id order ("▁▁", id 259, scores -1e9: it joins last).
- **gemma**: merges in the pieces' order (Gemma's scores follow it), no prefix space, text
  split after spaces (tests/test_gemma_real.py checks it on the real vocabulary).

Control, unknown and unused pieces are special added tokens: never formed from user text (the
prompt-injection boundary; llama.cpp would join "</" and "s>" into "</s>" if both were pieces).
User-defined pieces are added tokens matched in the text, as llama.cpp matches them.
"""

from __future__ import annotations

from model.errors import ModelLoadError
from model.limits import check_token_strings
from model.tokenizers.spm import LLAMA_SPLIT, SPACE

# llama.cpp token types (gguf.TokenType): 1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_TYPES = (UNKNOWN, CONTROL, UNUSED)


def merges_from_vocab(pieces: list[str], keep: list[int], order: list[float] | None = None) -> list[tuple[str, str]]:
    """Every (left, right) whose concatenation is a kept piece, both parts kept pieces: best
    first by `order` (higher first; default the piece's place in the vocabulary), then the
    longer left part first (transformers' tie-break, so the two pick the same merge)."""
    ids = {pieces[i]: i for i in keep}
    rank = (lambda i: (-order[i], i)) if order is not None else (lambda i: (i, 0))
    merges = []
    for i in sorted(keep, key=rank):
        piece = pieces[i]
        merges += [(piece[:k], piece[k:]) for k in range(len(piece) - 1, 0, -1)
                   if piece[:k] in ids and piece[k:] in ids]
    return merges


def _types(meta: dict, pieces: list[str], where: str) -> list[int]:
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(pieces))
    if len(types) != len(pieces):
        raise ModelLoadError(f"{where}: {len(pieces)} tokens but {len(types)} token types")
    return types


def tokenizer_json_from_gguf(meta: dict, where: str, flavor: str = "gemma") -> dict:
    """A tokenizer.json for a GGUF's `tokenizer.ggml.model = llama` vocabulary."""
    pieces = list(meta["tokenizer.ggml.tokens"])
    types = _types(meta, pieces, where)
    # llama.cpp's converter stores pieces of two or more spaces as spaces; the model looks them up as ▁▁.
    vocab_pieces = [SPACE * len(p) if " " in p and not p.strip() else p for p in pieces]
    check_token_strings(vocab_pieces, where)
    special = {i for i, t in enumerate(types) if t in SPECIAL_TYPES}
    added = [{"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": i in special}
             for i, (p, t) in enumerate(zip(pieces, types, strict=True))
             if i in special or (t == USER_DEFINED and p == vocab_pieces[i])]
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = pieces[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(pieces) else "<unk>"
    if flavor == "llama":
        scores = list(meta.get("tokenizer.ggml.scores") or [])
        if len(scores) != len(pieces):
            raise ModelLoadError(f"{where}: {len(pieces)} tokens but {len(scores)} scores")
        keep = [i for i, t in enumerate(types) if t == NORMAL]
        merges = merges_from_vocab(vocab_pieces, keep, scores)
        prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
        normalizer = ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, replace]}
                      if prefix else replace)
        # With no piece holding "▁" after another character, no merge crosses the start of a
        # run of spaces: cutting the text there first is exact, and lets the word cache work.
        inner = any(SPACE in p.lstrip(SPACE) for p in vocab_pieces)
        pre = None if inner else LLAMA_SPLIT
        strip = [{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else []
    else:
        merges = merges_from_vocab(vocab_pieces, [i for i in range(len(pieces))])
        normalizer = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
        pre = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
        strip = []
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, *strip]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {p: i for i, p in enumerate(vocab_pieces)},
                  "merges": [list(m) for m in merges]},
    }
