"""SentencePiece-style BPE with byte fallback (Llama 2 / TinyLlama / Mistral, Gemma 3), run by
the `tokenizers` library.

Byte-level BPE (model/tokenizers/bpe.py) maps bytes to printable characters and merges by rank; this is
the other kind: spaces become U+2581 ("▁"), pieces merge by score, and a character no piece
covers is spelled as <0xNN> byte tokens. tiktoken cannot express byte fallback, so
`tokenizers` runs it: the same library, model and settings transformers' tokenizers use, hence
exact parity (tests/test_gemma_real.py on Gemma's real vocabulary, tests/test_llama_vocab.py on
llama.cpp's own cases for Llama 2's). Llama-family vocabularies put a "▁" before the text (the
dummy prefix); decoding takes that one space off again, as the reference's decoder does.

A GGUF carries the pieces, their scores and types but no merges: model/tokenizers/spm_gguf.py rebuilds
them once, at conversion, and the canonical model directory stores an ordinary tokenizer.json.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from model.errors import ModelLoadError
from model.tokenizers.tokenizer import StreamDecoder, Tokenizer

SPACE = "\u2581"
BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# The pre-tokenizer our GGUF conversion gives Llama-family vocabularies (model/tokenizers/spm_gguf.py).
LLAMA_SPLIT = {"type": "Split", "pattern": {"Regex": f"{SPACE}*[^{SPACE}]+|{SPACE}+"}, "behavior": "Isolated",
               "invert": False}


class SPMTokenizer(Tokenizer):
    """The app's Tokenizer interface over a `tokenizers.Tokenizer` of SentencePiece BPE.

    User text (`encode`) never reaches a special token: `encode_special_tokens` is on, so a
    typed "<end_of_turn>" is characters. Non-special added tokens ("\\n", "<table>", ...) are
    matched, as in the reference. Template output (`encode_rendered`) has its special tokens'
    strings split out first and the text between them encoded the same way, which is what
    the reference does with specials allowed (added tokens split the text before the model
    sees it)."""

    def __init__(self, hf, bos: str | None = None, eos: str | None = None, name: str = "spm",
                 prefix_space: bool = False):
        self.hf, self.enc, self.name, self.prefix_space = hf, None, name, prefix_space
        self._unprefixed = None
        self.fast = None   # set by spm_from_json for Llama 2's shape
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
        if self.fast is not None:   # the same ids on tiktoken (model/tokenizers/spm_fast.py)
            return self.fast.encode(text)
        return self.hf.encode(text, add_special_tokens=False).ids if text else []

    def encode_rendered(self, text: str, continuing: bool = False) -> list[int]:
        if continuing and self.prefix_space and text:
            # After a reply the model wrote, text up to the next special token goes on where the
            # reply stopped: no dummy prefix there (llama.cpp puts one only after special tokens).
            m = self._split.search(text) if self._split else None
            head, rest = (text[:m.start()], text[m.start():]) if m else (text, "")
            ids = self.hf_unprefixed().encode(head, add_special_tokens=False).ids if head else []
            return ids + self.encode_rendered(rest)
        if self._split is None or not text:
            return self.encode(text)
        # One call with special tokens matched: the library then applies a dummy prefix
        # exactly where the reference does ("first" only at the start, "always" after each).
        self.hf.encode_special_tokens = False
        try:
            return self.hf.encode(text, add_special_tokens=False).ids
        finally:
            self.hf.encode_special_tokens = True

    def hf_unprefixed(self):
        """The same tokenizer without the dummy prefix, built on first use."""
        if self._unprefixed is None:
            from tokenizers import Tokenizer as HFTokenizer  # lazy, as in spm_from_json
            data = json.loads(self.hf.to_str())
            if data.get("normalizer") == LLAMA_NORMALIZER:
                data["normalizer"] = GEMMA_NORMALIZER
            elif (data.get("pre_tokenizer") or {}).get("type") == "Metaspace":
                data["pre_tokenizer"]["prepend_scheme"] = "never"
            self._unprefixed = HFTokenizer.from_str(json.dumps(data))
            self._unprefixed.encode_special_tokens = True
        return self._unprefixed

    def decode(self, ids: list[int]) -> str:
        text = b"".join(self._bytes[i] for i in ids).decode("utf-8", errors="replace")
        return text[1:] if self.prefix_space and text.startswith(" ") else text

    def token_bytes(self, token: int) -> bytes:
        return self._bytes[token]

    def stream_decoder(self) -> StreamDecoder:
        return PrefixStreamDecoder(self) if self.prefix_space else StreamDecoder(self)

    def fingerprint(self) -> str:
        """Stored token ids are reusable by another model iff this matches (chatapp/store/identity.py)."""
        h = hashlib.sha256(b"spm|")
        h.update("\x00".join(self.pieces).encode("utf-8", "surrogatepass"))
        h.update(json.dumps(sorted(self.special.items())).encode())
        return h.hexdigest()


class PrefixStreamDecoder(StreamDecoder):
    """A reply's text as `decode` gives it, a token at a time: the dummy prefix's space in
    front of its first word is not part of the text."""

    def __init__(self, tokenizer: Tokenizer):
        super().__init__(tokenizer)
        self.started = False

    def push(self, token: int) -> str:
        text = super().push(token)
        if not self.started and text:
            self.started = True
            return text[1:] if text.startswith(" ") else text
        return text


def piece_bytes(piece: str) -> bytes:
    """What a piece stands for in the text: a byte token its byte, "▁" a space."""
    m = BYTE.fullmatch(piece)
    return bytes([int(m.group(1), 16)]) if m else piece.replace(SPACE, " ").encode("utf-8", "surrogatepass")


def is_spm_json(data: dict) -> bool:
    """A tokenizer.json of SentencePiece BPE (byte fallback): Gemma's shape, not byte-level."""
    model = data.get("model") or {}
    return model.get("type") == "BPE" and bool(model.get("byte_fallback"))


GEMMA_NORMALIZER = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
LLAMA_NORMALIZER = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, GEMMA_NORMALIZER]}


def check_spm_shape(data: dict, where: str) -> bool:
    """Refuse a byte-fallback tokenizer.json whose text handling is none of the shapes the
    SentencePiece families ship (the ones checked against their references): Gemma's (spaces
    to ▁), Llama 2's legacy one (a ▁ in front, then spaces to ▁), or the Metaspace
    pre-tokenizer of newer Llama-family files. Returns whether it adds the dummy prefix."""
    norm, pre = data.get("normalizer"), data.get("pre_tokenizer")
    gemma_pre = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
    if norm == GEMMA_NORMALIZER and pre in (None, gemma_pre):
        return False
    if norm == LLAMA_NORMALIZER and pre in (None, LLAMA_SPLIT):
        return True
    if norm is None and isinstance(pre, dict) and pre.get("type") == "Metaspace":
        scheme = pre.get("prepend_scheme", "always" if pre.get("add_prefix_space", True) else "never")
        if pre.get("replacement") == SPACE and scheme in ("first", "always", "never") and not pre.get("split"):
            return scheme != "never"
    raise ModelLoadError(f"{where}: byte_fallback (SentencePiece) tokenizer with normalizer "
                         f"{json.dumps(norm)[:60]} and pre_tokenizer {json.dumps(pre)[:60]} is not supported "
                         "(Gemma's, Llama 2's and Metaspace's are)")


def spm_from_json(path: Path, text: str, data: dict, tokenizer_config: dict) -> SPMTokenizer:
    """From a tokenizer.json already read (`text`) and parsed (`data`): bpe.tokenizer_from_json
    parses it once to tell the two kinds apart."""
    # Lazy: only SentencePiece vocabularies need the tokenizers library.
    from tokenizers import Tokenizer as HFTokenizer

    prefix = check_spm_shape(data, str(path))
    empty = next((a.get("id") for a in data.get("added_tokens") or [] if isinstance(a, dict) and not a.get("content")),
                 None)
    if empty is not None:   # what made tiktoken loop; no tokenizer has a use for one
        raise ModelLoadError(f"{path}: added token {empty} is an empty string")
    try:
        hf = HFTokenizer.from_str(text)
    except Exception as e:   # tokenizers raises plain Exception subclasses for a malformed file
        raise ModelLoadError(f"{path}: cannot build the tokenizer ({str(e).splitlines()[0][:160]})") from None
    hf.post_processor = None   # BOS comes from the chat format, never from encode()

    def name(v):
        return v.get("content") if isinstance(v, dict) else v

    tokenizer = SPMTokenizer(hf, name(tokenizer_config.get("bos_token")), name(tokenizer_config.get("eos_token")),
                       Path(path).parent.name or "spm", prefix)
    tokenizer.fast = fast_path(data)
    return tokenizer


def fast_path(data: dict):
    """tiktoken for Llama 2's shape (model/tokenizers/spm_fast.py says when that is exact), else None."""
    from model.tokenizers.spm_fast import build_fast_spm  # lazy: tiktoken's Encoding is built only here

    model, added = data["model"], data.get("added_tokens") or []
    if (data.get("normalizer") != LLAMA_NORMALIZER or data.get("pre_tokenizer") not in (None, LLAMA_SPLIT)
            or any(not a.get("special") for a in added) or model.get("ignore_merges") or model.get("dropout")):
        return None
    vocab = model["vocab"]
    if data.get("pre_tokenizer") is None and any(SPACE in p.lstrip(SPACE) for p in vocab):
        return None   # a piece runs across the start of a run of spaces: the cut would not be exact
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return build_fast_spm(vocab, merges, True, {a["content"] for a in added})
