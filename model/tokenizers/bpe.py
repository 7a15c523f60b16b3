"""Byte-level BPE vocabularies as tiktoken Encodings: from a Hugging Face `tokenizer.json`
or from a GGUF file's `tokenizer.ggml.*` metadata.

tiktoken merges the adjacent pair whose *concatenation* has the lowest rank; Hugging Face
BPE applies the merge list in order. The two agree when every merged token's id follows
merge order, so ids can serve as ranks. We check that, and refuse vocabularies that don't.

tiktoken also needs every single byte ranked, but some vocabularies lack a few (SmolLM2
has no token for 21 byte values). Those bytes get ranks past the model's vocabulary so the
Encoding itself round-trips them; `BPETokenizer.encode` then replaces any character that
would need one with U+FFFD, visibly, because the model has no embedding for those ids.
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import tiktoken

from model.errors import ModelLoadError
from model.files import read_bytes
from model.limits import check_ids, check_token_strings, check_vocab
from model.tokenizers.pretokenizers import (
    NORMALIZERS,
    PRE_TOKENIZERS,
    Added,
    AddedMatcher,
    added_from_json,
    check_decoder,
    normalizer_from_json,
    pattern_from_pre_tokenizer,
)
from model.tokenizers.spm import is_spm_json, spm_from_json
from model.tokenizers.tokenizer import Tokenizer, new_encoding


@dataclass
class BPEVocab:
    """A byte-level BPE vocabulary. `tokens[i]` is id i in GPT-2's byte-to-unicode alphabet
    (added tokens as plain text); `added` lists the added tokens, `normalizer` is None or "NFC"."""

    tokens: list[str]
    merges: list[tuple[str, str]]
    added: list[Added]
    pattern: str
    name: str = "bpe"
    normalizer: str | None = None
    special: dict[str, int] = field(init=False)  # every added token's text -> id (tiktoken's specials)

    def __post_init__(self):
        check_token_strings(self.tokens, self.name, holes=True)
        check_token_strings(added_strings(self.added, self.name), self.name, holes=True)
        self.special = {a.content: a.id for a in self.added}


def added_strings(added: list[Added], where: str) -> list[str]:
    """The added tokens' strings by id ("" where none is), for check_token_strings; an added
    token that is an empty string is refused here (tiktoken's specials cannot be one)."""
    if empty := next((a for a in added if not a.content), None):
        raise ModelLoadError(f"{where}: added token {empty.id} is an empty string")
    out = [""] * (max((a.id for a in added), default=-1) + 1)
    for a in added:
        if out[a.id] not in ("", a.content):
            raise ModelLoadError(f"{where}: added token {a.id} is given twice, as {out[a.id][:40]!r} and "
                                 f"{a.content[:40]!r}")
        out[a.id] = a.content
    return out


@cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + i) for i, b in enumerate(extra)})
    return table


@cache
def unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_unicode().items()}


def token_bytes(token: str, where: str) -> bytes:
    u2b = unicode_to_byte()
    try:
        return bytes([u2b[c] for c in token])
    except KeyError as e:
        raise ModelLoadError(f"{where}: token {token!r} has character {e.args[0]!r} outside the "
                             "byte-level alphabet (not a byte-level BPE vocabulary)") from None


def check_merge_order(ids: dict[str, int], merges: list[tuple[str, str]], where: str) -> set[str]:
    """Raise unless the tokens the merges make never go down in id along the merge list; return
    the merged tokens. Several merges may make one token (Meta's Llama 3 list has `Ġ ĠĠĠ`,
    `ĠĠ ĠĠ` and `ĠĠĠ Ġ` for id 257): they share its rank, as in Meta's own tiktoken file,
    whose ranks are these ids (docs/tokenizers.md: why that still gives the merge list's ids)."""
    prev, made = -1, set()
    for i, (a, b) in enumerate(merges):
        tid = ids.get(a + b)
        if tid is None or a not in ids or b not in ids:
            raise ModelLoadError(f"{where}: merge {i} ({a!r} + {b!r}) uses or makes a token "
                                 "missing from the vocabulary")
        if tid < prev:
            raise ModelLoadError(f"{where}: token ids do not follow merge order (merge {i} makes id "
                                 f"{tid} after id {prev}), so they cannot serve as tiktoken ranks")
        prev = tid
        made.add(a + b)
    return made


def build_encoding(v: BPEVocab) -> tuple[tiktoken.Encoding, set[int]]:
    """The tiktoken Encoding of `v`, and the byte values that have no token of their own."""
    specials = set(v.special.values())
    ids = {t: i for i, t in enumerate(v.tokens) if t and i not in specials}
    made = check_merge_order(ids, v.merges, v.name)
    ranks: dict[bytes, int] = {}
    for piece, i in ids.items():
        if len(piece) > 1 and piece not in made:
            # tiktoken would reach it by any split; HF BPE never would.
            raise ModelLoadError(f"{v.name}: token {piece!r} (id {i}) is made by no merge")
        ranks[token_bytes(piece, v.name)] = i
    unranked = {b for b in range(256) if bytes([b]) not in ranks}
    top = max([*ranks.values(), *v.special.values()]) + 1
    for k, b in enumerate(sorted(unranked)):
        ranks[bytes([b])] = top + k
    try:
        enc = new_encoding(v.name, v.pattern, ranks, v.special)
    except ValueError as e:
        raise ModelLoadError(f"{v.name}: cannot build the tokenizer ({e})") from None
    return enc, unranked


class BPETokenizer(Tokenizer):
    """A Tokenizer that encodes as `tokenizers` does with `encode_special_tokens`: added
    tokens that are not special are found in the raw text (or, per token, in the normalized
    text), the rest is normalized and pre-tokenized piece by piece. And user text never
    reaches an id the model lacks: characters that need an unranked byte become U+FFFD
    (visibly) instead of vanishing, as they do in HF and llama.cpp."""

    def __init__(self, enc: tiktoken.Encoding, unranked: set[int], n_model_vocab: int,
                 bos: str | None = None, eos: str | None = None, added: Sequence[Added] = (),
                 nfc: bool = False):
        super().__init__(enc, bos, eos)
        self.nfc = nfc
        self.raw_added = AddedMatcher([a for a in added if not a.normalized], nfc)
        self.normalized_added = AddedMatcher([a for a in added if a.normalized], nfc)
        self.n_model_vocab = n_model_vocab
        self.unranked = frozenset(unranked)
        self._ranked = bytes(b for b in range(256) if b not in unranked)
        self.replacement = "\ufffd" if not set("\ufffd".encode()) & self.unranked else "?"

    @property
    def vocab_size(self) -> int:
        return self.n_model_vocab

    def visible(self, text: str) -> str:
        """`text` with every character that needs an unranked byte replaced."""
        if not self.unranked:
            return text
        data = text.encode("utf-8", "surrogatepass")
        if not data.translate(None, self._ranked):  # fast path: every byte has a token
            return text
        return "".join(self.replacement if set(c.encode("utf-8", "surrogatepass")) & self.unranked else c
                       for c in text)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for raw in self.raw_added.split(text):
            if isinstance(raw, int):
                ids.append(raw)
                continue
            for piece in self.normalized_added.split(unicodedata.normalize("NFC", raw) if self.nfc else raw):
                if isinstance(piece, int):
                    ids.append(piece)
                else:
                    ids += super().encode(self.visible(piece))
        return ids


def make_tokenizer(v: BPEVocab, bos: str | None, eos: str | None) -> BPETokenizer:
    enc, unranked = build_encoding(v)
    for name in (bos, eos):
        if name and name not in v.special:
            raise ModelLoadError(f"{v.name}: {name!r} is not one of the special tokens")
    return BPETokenizer(enc, unranked, len(v.tokens), bos, eos, v.added, v.normalizer == "NFC")


# --- tokenizer.json ------------------------------------------------------------------------

def vocab_from_tokenizer_json(data: dict, where: str) -> BPEVocab:
    model = data.get("model") or {}
    if model.get("type", "BPE") != "BPE" or "merges" not in model:
        raise ModelLoadError(f"{where}: not a BPE tokenizer (model type {model.get('type')!r})")
    if model.get("byte_fallback") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise ModelLoadError(f"{where}: byte_fallback / subword affixes are not supported (not byte-level BPE)")
    normalizer = normalizer_from_json(data.get("normalizer"), where)
    check_decoder(data.get("decoder"), where)
    added = [added_from_json(t, where) for t in data.get("added_tokens", [])]
    vocab: dict[str, int] = dict(model["vocab"])
    check_ids([*vocab.values(), *(a.id for a in added)], where)  # before a list as long as the largest id is made
    added_strings(added, where)
    for a in added:   # an added token is the vocabulary's own string at the same id, or a new one
        if vocab.get(a.content, a.id) != a.id:
            raise ModelLoadError(f"{where}: tokens {vocab[a.content]} and {a.id} are the same string "
                                 f"{a.content[:40]!r}")
    vocab.update({a.content: a.id for a in added})
    if len(set(vocab.values())) < len(vocab):
        twice = next(i for i, n in Counter(vocab.values()).items() if n > 1)
        raise ModelLoadError(f"{where}: token id {twice} is given to two strings")
    tokens = [""] * (max(vocab.values(), default=-1) + 1)
    check_vocab(tokens, where)
    for piece, i in vocab.items():
        tokens[i] = piece
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if any(len(m) != 2 for m in merges):
        raise ModelLoadError(f"{where}: malformed merges")
    pattern = pattern_from_pre_tokenizer(data.get("pre_tokenizer"), where)
    return BPEVocab(tokens, merges, added, pattern, Path(where).parent.name or "bpe", normalizer)


def _token_name(value) -> str | None:
    # tokenizer_config.json holds either "<s>" or {"content": "<s>", ...}
    return value.get("content") if isinstance(value, dict) else value


def tokenizer_from_json(path: Path, tokenizer_config: dict) -> Tokenizer:
    """The tokenizer of a Hugging Face `tokenizer.json`: byte-level BPE, or SentencePiece BPE."""
    if not Path(path).exists():
        raise ModelLoadError(f"{path}: missing")
    try:
        text = read_bytes(Path(path), "tokenizer").decode("utf-8")  # a regular file, size-capped
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    except (RecursionError, ValueError):  # nested past Python's limit; a number of 4,300+ digits
        raise ModelLoadError(f"{path}: JSON too deeply nested or with too large a number") from None
    if is_spm_json(data):   # SentencePiece BPE with byte fallback (Gemma): model/tokenizers/spm.py
        return spm_from_json(path, text, data, tokenizer_config)
    v = vocab_from_tokenizer_json(data, str(path))
    return make_tokenizer(v, _token_name(tokenizer_config.get("bos_token")),
                          _token_name(tokenizer_config.get("eos_token")))


# --- GGUF metadata ---------------------------------------------------------------------------

# llama.cpp token types: control and unused tokens are special; user-defined ones are what
# its converter makes of a non-special added token, matched in text by llama.cpp as by HF.
GGUF_SPECIAL, GGUF_USER_DEFINED = (3, 5), 4


def gguf_added(tokens: list[str], types: list[int]) -> list[Added]:
    # The converter writes an added token's content as it is, not in the byte-level alphabet.
    return [Added(t, i, ty in GGUF_SPECIAL) for i, (t, ty) in enumerate(zip(tokens, types, strict=True))
            if ty in GGUF_SPECIAL or ty == GGUF_USER_DEFINED]


def vocab_from_gguf(meta: dict, where: str) -> BPEVocab:
    """`meta`: the GGUF's `tokenizer.ggml.*` values as plain Python objects."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(f"{where}: tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' only)")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise ModelLoadError(f"{where}: pre-tokenizer {pre!r} is not supported ({', '.join(PRE_TOKENIZERS)})")
    tokens = list(meta["tokenizer.ggml.tokens"])
    check_vocab(tokens, where)
    check_token_strings(tokens, where)   # a GGUF names every id: none may be empty
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if len(types) != len(tokens):
        raise ModelLoadError(f"{where}: {len(tokens)} tokens but {len(types)} token types")
    merges = [tuple(m.split(" ")) for m in meta.get("tokenizer.ggml.merges", [])]
    if any(len(m) != 2 for m in merges):
        raise ModelLoadError(f"{where}: malformed tokenizer.ggml.merges")
    style = PRE_TOKENIZERS[pre]
    return BPEVocab(tokens, merges, gguf_added(tokens, types), style.pattern, Path(where).stem, style.normalizer)


def tokenizer_json(v: BPEVocab, pre: str) -> dict:
    """A Hugging Face tokenizer.json for `v`: what the canonical model directory stores."""
    vocab = {t: i for i, t in enumerate(v.tokens)}
    added = [{"id": a.id, "content": a.content, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": a.normalized, "special": a.special} for a in sorted(v.added, key=lambda a: a.id)]
    style = PRE_TOKENIZERS[pre]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": NORMALIZERS.get(v.normalizer), "pre_tokenizer": style.pre_tokenizer, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": style.ignore_merges, "vocab": vocab, "merges": [list(m) for m in v.merges]}}
