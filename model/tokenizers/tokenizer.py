"""A tiktoken `Encoding` plus the special tokens a chat template needs.

User text is always encoded with no special tokens allowed: a message containing
"<|im_end|>" becomes the characters, never the control token (a prompt-injection boundary).
"""

from __future__ import annotations

import codecs

import tiktoken

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
        return self.enc.encode(text, allowed_special=set(), disallowed_special=())

    def encode_rendered(self, text: str, continuing: bool = False) -> list[int]:
        """Text a chat template rendered: special-token strings become the tokens. Never for
        user text. `continuing`: the text goes on after tokens already there (a reply the model
        wrote), so it opens no new text (byte-level BPE has nothing to do for that)."""
        return self.enc.encode(text, allowed_special="all")

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


def byte_level_encoding(name: str, specials: list[str]) -> tiktoken.Encoding:
    """256 byte tokens plus specials: the tokenizer of the `random:` models."""
    ranks = {bytes([i]): i for i in range(256)}
    special = {s: 256 + i for i, s in enumerate(specials)}
    return tiktoken.Encoding(name=name, pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=special)
