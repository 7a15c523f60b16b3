"""What byte-level BPE runs on the text before merging, per model family: the pre-tokenizer
regex (as tiktoken runs it), the normalizer, and the added tokens matched in the text.

Each family's regex is the one its own tokenizer.json carries, unchanged: tiktoken's engine
(fancy-regex) runs `(?i:...)`, `\\p{L}`/`\\p{N}` and `(?!\\S)` as the `tokenizers` library's
Oniguruma does, which tests/test_bpe_families.py checks id for id. A pre-tokenizer, normalizer
or decoder we cannot reproduce exactly is refused rather than approximated.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

from model.errors import ModelLoadError
from model.tokenizers.tokenizer import GPT2_PATTERN

# SmolLM2's pre-tokenizer: Digits(individual_digits) then ByteLevel's GPT-2 regex, folded into
# one regex. Digits become their own pieces, so the GPT-2 ` ?\p{N}+` branch can never match,
# and `\s+(?!\S)` must treat a digit as the end of a piece (it is one, after the digit split).
SMOLLM_PATTERN = (r"\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+"
                  r"|\s+(?![^\s\p{N}])|\s+")
# Llama 3.x's Split regex (from tiktoken's cl100k) and Qwen2/2.5/3's, which differs only in
# splitting numbers into single digits instead of runs of up to three.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")


def _byte_level(use_regex: bool, trim_offsets: bool = True) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim_offsets, "use_regex": use_regex}


def _split_then_bytes(pattern: str, trim_offsets: bool) -> dict:
    """The shape Llama 3's and Qwen2's tokenizer.json give their pre_tokenizer."""
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        _byte_level(False, trim_offsets)]}


@dataclass(frozen=True)
class PreTokenizer:
    pattern: str                 # the regex tiktoken runs
    pre_tokenizer: dict          # the tokenizer.json pre_tokenizer that means the same
    normalizer: str | None = None  # what the family's tokenizer.json normalizes with first
    # Llama 3's BPE takes a piece that is a whole token as is (tiktoken always does).
    ignore_merges: bool = False


_LLAMA3 = PreTokenizer(LLAMA3_PATTERN, _split_then_bytes(LLAMA3_PATTERN, True), ignore_merges=True)
# GGUF `tokenizer.ggml.pre` (as llama.cpp's converter names it) -> the family's pre-tokenizer.
# A GGUF carries no normalizer, so a name also stands for its family's: NFC for Qwen2.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "gpt-2": PreTokenizer(GPT2_PATTERN, _byte_level(True)),
    "smollm": PreTokenizer(SMOLLM_PATTERN, {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, _byte_level(True)]}),
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3,  # llama.cpp reads all three alike
    "qwen2": PreTokenizer(QWEN2_PATTERN, _split_then_bytes(QWEN2_PATTERN, False), "NFC"),
}
SPLIT_PATTERNS = (LLAMA3_PATTERN, QWEN2_PATTERN)
NORMALIZERS = {"NFC": {"type": "NFC"}}


def _split_pattern(split: dict) -> str | None:
    regex = (split.get("pattern") or {}).get("Regex")
    exact = split.get("behavior") == "Isolated" and not split.get("invert")
    return regex if exact and regex in SPLIT_PATTERNS else None


def pattern_from_pre_tokenizer(pre: dict | None, where: str) -> str:
    """The tiktoken regex equivalent to a tokenizer.json pre_tokenizer we understand."""
    pre = pre or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    last = steps[-1] if steps else {}
    if last.get("type") == "ByteLevel" and last.get("add_prefix_space"):
        raise ModelLoadError(f"{where}: ByteLevel add_prefix_space is not supported")
    byte_regex = last.get("use_regex", True)
    if kinds == ["ByteLevel"] and byte_regex:
        return GPT2_PATTERN
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and byte_regex:
        return SMOLLM_PATTERN
    if kinds == ["Split", "ByteLevel"] and not byte_regex and (pattern := _split_pattern(steps[0])):
        return pattern
    # Another Split regex may well run in tiktoken, but nothing here shows it splits as Oniguruma does.
    raise ModelLoadError(f"{where}: unsupported pre-tokenizer {json.dumps(pre)[:160]} (supported: ByteLevel, "
                         "Digits(individual)+ByteLevel, Split(the Llama 3 or Qwen2 regex)+ByteLevel)")


def normalizer_from_json(norm: dict | None, where: str) -> str | None:
    """None, or "NFC": the normalizers we apply exactly."""
    steps = norm.get("normalizers", []) if norm and norm.get("type") == "Sequence" else [norm] if norm else []
    kinds = [s.get("type") for s in steps]
    if not kinds:
        return None
    if kinds == ["NFC"]:
        return "NFC"
    raise ModelLoadError(f"{where}: normalizer {json.dumps(norm)[:120]} is not supported (none or NFC only)")


def check_decoder(decoder: dict | None, where: str) -> None:
    # Our decode maps ids to bytes, which is what ByteLevel's decoder does (its options
    # only matter for offsets); any other decoder would change the text.
    if decoder and decoder.get("type") != "ByteLevel":
        raise ModelLoadError(f"{where}: decoder {decoder.get('type')!r} is not supported (ByteLevel only)")


@dataclass(frozen=True)
class Added:
    """A tokenizer.json added token. `special` ones are never matched in user text (a
    prompt-injection boundary: "<|im_end|>" typed by the user is characters); the others
    (Qwen3's <think>, GGUF USER_DEFINED tokens) are, as `tokenizers` does."""

    content: str
    id: int
    special: bool = True
    normalized: bool = False   # matched in the normalized text, not the raw text


def added_from_json(t: dict, where: str) -> Added:
    special = bool(t.get("special"))
    if not special and (t.get("lstrip") or t.get("rstrip") or t.get("single_word")):
        # A special token is never matched in user text, so its matching options don't matter.
        raise ModelLoadError(f"{where}: added token {t['content']!r} with lstrip/rstrip/single_word "
                             "is not supported")
    # tokenizers' default: special tokens match the raw text, the others the normalized text.
    return Added(t["content"], t["id"], special, bool(t.get("normalized", not special)))


class AddedMatcher:
    """Finds one stage's added tokens in text as `tokenizers` does: leftmost-longest over all
    of them. A special token's match stays text (we encode special tokens as text) but still
    hides the tokens it overlaps, as `tokenizers` with `encode_special_tokens` does."""

    def __init__(self, added: list[Added], nfc: bool):
        # NFC is idempotent, so a normalized token's content is compared in normalized form.
        self.ids: dict[str, int] = {}
        self.text: set[str] = set()
        for a in added:
            content = unicodedata.normalize("NFC", a.content) if nfc and a.normalized else a.content
            self.ids[content] = a.id
            if a.special:
                self.text.add(content)
        longest_first = sorted(self.ids, key=len, reverse=True)
        any_matched = len(self.text) < len(self.ids)
        self.regex = re.compile("|".join(map(re.escape, longest_first))) if any_matched else None

    def split(self, text: str) -> Iterator[str | int]:
        """`text` as pieces of text (str) and added token ids (int), in order."""
        if self.regex is None:
            yield text
            return
        start = 0
        for m in self.regex.finditer(text):
            if m.group() in self.text:
                continue
            if m.start() > start:
                yield text[start:m.start()]
            yield self.ids[m.group()]
            start = m.end()
        if start < len(text):
            yield text[start:]
