"""SentencePiece-style BPE with byte fallback (Gemma 3), run by the `tokenizers` library.

Byte-level BPE (model/bpe.py) maps bytes to printable characters and merges by rank; this is
the other kind: spaces become U+2581 ("▁"), the whole text between added tokens is one word,
pieces merge in the vocabulary's order, and a character no piece covers is spelled as
<0xNN> byte tokens. tiktoken cannot express byte fallback, so `tokenizers` runs it: the same
library, model and settings transformers' Gemma tokenizer uses, hence exact parity
(tests/test_gemma_real.py checks it on the real vocabulary).

A GGUF carries the pieces, their scores and types but no merges; `tokenizer_json_from_gguf`
rebuilds the merges from the vocabulary in the order transformers does (by the merged
piece's place in the file, then the longer left part first) once, at conversion, and the
canonical model directory stores the result as an ordinary tokenizer.json.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from model.errors import ModelLoadError
from model.tokenizer import StreamDecoder, Tokenizer

SPACE = "\u2581"
BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# llama.cpp token types (gguf.TokenType): 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE.
CONTROL, USER_DEFINED, UNUSED = 3, 4, 5


class SPMTokenizer(Tokenizer):
    """The app's Tokenizer interface over a `tokenizers.Tokenizer` of SentencePiece BPE.

    User text (`encode`) never reaches a special token: `encode_special_tokens` is on, so a
    typed "<end_of_turn>" is characters. Non-special added tokens ("\\n", "<table>", ...) are
    matched, as in the reference. Template output (`encode_rendered`) has its special tokens'
    strings split out first and the text between them encoded the same way, which is what
    the reference does with specials allowed (added tokens split the text before the model
    sees it)."""

    def __init__(self, hf, bos: str | None = None, eos: str | None = None, name: str = "spm"):
        self.hf, self.enc, self.name = hf, None, name
        self.hf.encode_special_tokens = True
        self.special = {t.content: i for i, t in hf.get_added_tokens_decoder().items() if t.special}
        for s in (bos, eos):
            if s and s not in self.special:
                raise ModelLoadError(f"{name}: {s!r} is not one of the special tokens")
        self.bos_id = self.special[bos] if bos else None
        self.eos_id = self.special[eos] if eos else None
        pieces = [""] * hf.get_vocab_size(with_added_tokens=True)
        for piece, i in hf.get_vocab(with_added_tokens=True).items():
            pieces[i] = piece
        self.pieces = pieces
        self._bytes = [piece_bytes(p) for p in pieces]
        by_length = sorted(self.special, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, by_length)) + ")") if by_length else None

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids if text else []

    def encode_rendered(self, text: str) -> list[int]:
        if self._split is None:
            return self.encode(text)
        ids: list[int] = []
        for i, part in enumerate(self._split.split(text)):
            ids += [self.special[part]] if i % 2 else self.encode(part)
        return ids

    def decode(self, ids: list[int]) -> str:
        return b"".join(self._bytes[i] for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, tok: int) -> bytes:
        return self._bytes[tok]

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self)

    def fingerprint(self) -> str:
        """Stored token ids are reusable by another model iff this matches (chatapp/store/identity.py)."""
        h = hashlib.sha256(b"spm|")
        h.update("\x00".join(self.pieces).encode("utf-8", "surrogatepass"))
        h.update(json.dumps(sorted(self.special.items())).encode())
        return h.hexdigest()


def piece_bytes(piece: str) -> bytes:
    """What a piece stands for in the text: a byte token its byte, "▁" a space."""
    m = BYTE.fullmatch(piece)
    return bytes([int(m.group(1), 16)]) if m else piece.replace(SPACE, " ").encode("utf-8", "surrogatepass")


def is_spm_json(data: dict) -> bool:
    """A tokenizer.json of SentencePiece BPE (byte fallback): Gemma's shape, not byte-level."""
    model = data.get("model") or {}
    return model.get("type") == "BPE" and bool(model.get("byte_fallback"))


def check_spm_shape(data: dict, where: str) -> None:
    """Refuse a byte-fallback tokenizer.json whose text handling is not Gemma's (the one we
    have checked against the reference): a prefix space, a pre-tokenizer or another normalizer
    would encode differently from what the model was trained on."""
    norm = data.get("normalizer")
    if norm != {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}:
        raise ModelLoadError(f"{where}: byte_fallback (SentencePiece) tokenizer with normalizer "
                             f"{json.dumps(norm)[:80]} is not supported (only Gemma's: spaces to \u2581, "
                             "no prefix space)")
    pre = data.get("pre_tokenizer")
    if pre not in (None, {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False}):
        raise ModelLoadError(f"{where}: byte_fallback (SentencePiece) tokenizer with pre_tokenizer "
                             f"{json.dumps(pre)[:80]} is not supported")


def spm_from_json(path: Path, text: str, data: dict, tokenizer_config: dict) -> SPMTokenizer:
    """From a tokenizer.json already read (`text`) and parsed (`data`): bpe.tokenizer_from_json
    parses it once to tell the two kinds apart."""
    # Lazy: only SentencePiece vocabularies need the tokenizers library.
    from tokenizers import Tokenizer as HFTokenizer

    check_spm_shape(data, str(path))
    try:
        hf = HFTokenizer.from_str(text)
    except Exception as e:   # tokenizers raises plain Exception subclasses for a malformed file
        raise ModelLoadError(f"{path}: cannot build the tokenizer ({str(e).splitlines()[0][:160]})") from None
    hf.post_processor = None   # BOS comes from the chat format, never from encode()

    def name(v):
        return v.get("content") if isinstance(v, dict) else v

    return SPMTokenizer(hf, name(tokenizer_config.get("bos_token")), name(tokenizer_config.get("eos_token")),
                        Path(path).parent.name or "spm")


# --- GGUF ------------------------------------------------------------------------------------

def merges_from_vocab(pieces: list[str], skip: set[int]) -> list[tuple[str, str]]:
    """Every (left, right) whose concatenation is a piece, both parts pieces themselves: best
    first by the merged piece's place in the vocabulary (Gemma's order), then the longer
    left part first (transformers' tie-break, so the two pick the same merge)."""
    ids = {p: i for i, p in enumerate(pieces) if i not in skip}
    merges = []
    for i, piece in enumerate(pieces):
        if i in skip:
            continue
        splits = [(piece[:k], piece[k:]) for k in range(len(piece) - 1, 0, -1)
                  if piece[:k] in ids and piece[k:] in ids]
        merges += splits
    return merges


def tokenizer_json_from_gguf(meta: dict, where: str) -> dict:
    """A tokenizer.json for a GGUF's `tokenizer.ggml.model = llama` vocabulary (Gemma's)."""
    pieces = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(pieces))
    if len(types) != len(pieces):
        raise ModelLoadError(f"{where}: {len(pieces)} tokens but {len(types)} token types")
    # llama.cpp's converter stores pieces of two or more spaces as spaces; the model looks them up as ▁▁.
    vocab_pieces = [SPACE * len(p) if " " in p and not p.strip() else p for p in pieces]
    if len(set(vocab_pieces)) != len(vocab_pieces):
        raise ModelLoadError(f"{where}: the vocabulary has duplicate pieces")
    special = {i for i, t in enumerate(types) if t in (CONTROL, UNUSED)}
    added = [{"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": i in special}
             for i, (p, t) in enumerate(zip(pieces, types, strict=True))
             if i in special or (t == USER_DEFINED and p == vocab_pieces[i])]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {p: i for i, p in enumerate(vocab_pieces)},
                  "merges": [list(m) for m in merges_from_vocab(vocab_pieces, set())]},
    }
