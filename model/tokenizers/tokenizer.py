"""A tiktoken `Encoding` plus the special tokens a chat template needs.

User text is always encoded with no special tokens allowed: a message containing
"<|im_end|>" becomes the characters, never the control token (a prompt-injection boundary).
"""

from __future__ import annotations

import codecs

import tiktoken

from model.errors import ModelLoadError, UserError

# GPT-2's pre-tokenizer pattern (what byte-level BPE tokenizers split on before merging).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class Tokenizer:
    def __init__(self, enc: tiktoken.Encoding, bos: str | None = None, eos: str | None = None):
        self.enc = enc
        self.special = dict(enc._special_tokens)
        self.bos_id = self.special[bos] if bos else None
        self.eos_id = self.special[eos] if eos else None

    @property
    def vocab_size(self) -> int:
        return self.enc.n_vocab

    def encode(self, text: str) -> list[int]:
        """Plain text: special-token strings are encoded as ordinary text."""
        return split_or_refuse(self.enc.encode, text, allowed_special=set(), disallowed_special=())

    def encode_rendered(self, text: str, continuing: bool = False) -> list[int]:
        """Text a chat template rendered: special-token strings become the tokens. Never for
        user text. `continuing`: the text goes on after tokens already there (a reply the model
        wrote), so it opens no new text (byte-level BPE has nothing to do for that)."""
        return split_or_refuse(self.enc.encode, text, allowed_special="all")

    def token(self, name: str) -> int:
        """The id of a special token, by its string."""
        try:
            return self.special[name]
        except KeyError:
            raise KeyError(f"tokenizer has no special token {name!r}") from None

    def decode(self, ids: list[int]) -> str:
        return self.enc.decode(ids, errors="replace")

    def token_bytes(self, token: int) -> bytes:
        return self.enc.decode_single_token_bytes(token)

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self)


def split_or_refuse(encode, text: str, **kwargs) -> list[int]:
    """tiktoken's encode; a split pattern that gives up on this text (past the probes of
    check_split_pattern) refuses the message in one line instead of failing the turn."""
    try:
        return encode(text, **kwargs)
    except ValueError as e:
        raise UserError(f"the tokenizer cannot split this text ({str(e).splitlines()[0][:120]})") from None


class StreamDecoder:
    """Turns a stream of token ids into text, holding back split UTF-8 sequences."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self.utf8.decode(self.tokenizer.token_bytes(token))

    def push_many(self, ids: list[int]) -> str:
        return "".join(self.push(t) for t in ids)

    def flush(self) -> str:
        return self.utf8.decode(b"", final=True)


def new_encoding(name: str, pattern: str, ranks: dict[bytes, int], special: dict[str, int]) -> tiktoken.Encoding:
    """A tiktoken Encoding, only of a vocabulary it can encode with: tiktoken's encode loops for
    ever, in native code deaf to Ctrl-C, on an empty token string (issue 45)."""
    empty = next((i for s, i in special.items() if not s), ranks.get(b""))
    if empty is not None:
        raise ModelLoadError(f"{name}: token {empty} is an empty string")
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)


# Text a split pattern meets every day, in long runs: a pattern that gives up on one of these
# ("Max limit for backtracking count exceeded") would fail a chat mid-way (issue 45).
PROBES = [run * (4000 // len(run)) + end for run in ("a", "A", "1", " ", "\n", "!", "é", "\u4e00", "a ", "a1",
                                                       "hello world ", "Hello, World! ")
          for end in ("", "!", "x", "1", " ", "\n")]


def check_split_pattern(enc: tiktoken.Encoding, where: str) -> None:
    """Refuse a split pattern (a nanochat pickle's own) that backtracks past tiktoken's limit on
    ordinary text. Each probe stops at that limit, in milliseconds."""
    for text in PROBES:
        try:
            enc.encode(text, disallowed_special=())   # encode_ordinary panics instead (a BaseException)
        except ValueError as e:
            raise ModelLoadError(f"{where}: its split pattern gives up on ordinary text ({text[:12]!r}...: "
                                 f"{str(e).splitlines()[0][:100]})") from None


def byte_level_encoding(name: str, specials: list[str]) -> tiktoken.Encoding:
    """256 byte tokens plus specials: the tokenizer of the `random:` models."""
    ranks = {bytes([i]): i for i in range(256)}
    special = {s: 256 + i for i, s in enumerate(specials)}
    return new_encoding(name, GPT2_PATTERN, ranks, special)
