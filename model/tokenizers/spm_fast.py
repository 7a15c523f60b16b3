"""SentencePiece BPE (Llama 2's shape) on tiktoken: the same ids as `tokenizers`, 3-5x faster.

SentencePiece starts from characters, joins the adjacent pair whose concatenation is the
best-ranked piece, and spells a character no piece covers as its <0xXX> byte tokens. tiktoken
starts from bytes. Ranking first, in this order, (1) every single byte, (2) the partial and
whole UTF-8 sequences of every character that is a piece, then (3) the multi-character pieces
in merge order, makes tiktoken form every known character before any merge, join pieces in the
merge list's order, and leave an unknown character as single bytes (or a partial sequence,
which is never part of a valid piece). Ranks then map back to ids: a single byte to its
one-character piece if it is ASCII and one, else to its byte token; a partial sequence to its
bytes' byte tokens.

Used only for the shape it was checked on (model/tokenizers/spm.py decides): Llama 2's normalizer (a "▁"
in front, spaces to "▁"), the cut before runs of spaces, byte fallback, no non-special added
tokens, and every multi-character piece made by some merge (else tiktoken could reach a piece
the reference never makes). tests/test_llama_vocab.py checks llama.cpp's cases, the corpus and
random text against `tokenizers`.
"""

from __future__ import annotations

import numpy as np
import tiktoken

from model.tokenizers.tokenizer import new_encoding

SPACE = "\u2581"
PATTERN = f"{SPACE}*[^{SPACE}]+|{SPACE}+"


class FastSPM:
    def __init__(self, enc: tiktoken.Encoding, rank_ids: list[list[int]], prefix: bool):
        self.enc, self.prefix = enc, prefix
        self.simple = np.array([ids[0] if len(ids) == 1 else -1 for ids in rank_ids], dtype=np.int64)
        self.multi = {r: ids for r, ids in enumerate(rank_ids) if len(ids) != 1}

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        text = (SPACE if self.prefix else "") + text.replace(" ", SPACE)
        ranks = self.enc.encode_ordinary(text)
        ids = self.simple[ranks]
        if not self.multi or (ids >= 0).all():
            return ids.tolist()
        out: list[int] = []
        for r, i in zip(ranks, ids.tolist(), strict=True):
            out += [i] if i >= 0 else self.multi[r]
        return out


def build_fast_spm(vocab: dict[str, int], merges: list[tuple[str, str]], prefix: bool,
                   special: set[str]) -> FastSPM | None:
    """The tiktoken form of a byte-fallback BPE vocabulary (`special`: the special added tokens,
    never made from text), or None where it would not be exact."""
    vocab = {p: i for p, i in vocab.items() if p not in special}
    byte_ids = {}
    for b in range(256):
        i = vocab.get(f"<0x{b:02X}>")
        if i is None:
            return None   # no byte fallback for this byte: leave the vocabulary to the library
        byte_ids[b] = i
    made = {a + b for a, b in merges}
    chars = [p for p in vocab if len(p) == 1]
    if any(len(p) > 1 and p not in made and not p.startswith("<0x") for p in vocab if p not in chars):
        return None
    ranks: dict[bytes, int] = {}
    rank_ids: list[list[int]] = []

    def add(key: bytes, ids: list[int]) -> None:
        if key not in ranks:
            ranks[key] = len(rank_ids)
            rank_ids.append(ids)

    for b in range(256):
        c = chr(b) if b < 0x80 else None
        add(bytes([b]), [vocab[c]] if c is not None and c in vocab else [byte_ids[b]])
    for c in chars:
        data = c.encode("utf-8")
        for k in range(2, len(data)):
            add(data[:k], [byte_ids[x] for x in data[:k]])
        if len(data) > 1:
            add(data, [vocab[c]])
    for a, b in merges:
        piece = a + b
        if len(piece) > 1:
            add(piece.encode("utf-8"), [vocab[piece]])
    if len(ranks) != len(rank_ids):
        return None
    enc = new_encoding("spm", PATTERN, ranks, {})
    return FastSPM(enc, rank_ids, prefix)
