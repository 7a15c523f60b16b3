"""Sane maxima for what a model's files may claim, and the checks that apply them.

Everything here runs before anything is allocated: a header or config.json that claims 2**31
layers, a vocabulary of 10**7 entries or an embedding of 2**40 floats is refused in one line in
milliseconds (issue 27). The maxima are far above any model this app can run on one machine
(the largest real values are noted), so no real model is refused by them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from model.errors import ModelLoadError

MAX_KEY = 1 << 16           # a metadata key or tensor name, bytes
MAX_STRING = 1 << 26        # one metadata string (a chat template is ~10 KB), bytes
MAX_ARRAY = 1 << 22         # entries of one metadata array (Gemma 3's vocabulary: 262,144)
MAX_TENSORS = 1 << 16       # tensors or metadata keys (a 70B Llama: 723 tensors)
MAX_VOCAB = 1 << 20         # tokens (Gemma 3: 262,144)

# config.json key -> (largest accepted value, the largest real one we know of)
CONFIG_MAXIMA = {
    "hidden_size": (1 << 16, "16,384 in Llama 3.1 405B"),
    "intermediate_size": (1 << 19, "53,248 in Llama 3.1 405B"),
    "num_hidden_layers": (1024, "126 in Llama 3.1 405B"),
    "num_attention_heads": (1024, "128 in Llama 3.1 405B"),
    "num_key_value_heads": (1024, "16 in Llama 3.1 405B"),
    "head_dim": (1024, "256 in Gemma 3"),
    "vocab_size": (MAX_VOCAB, "262,208 in Gemma 3"),
    "max_position_embeddings": ((1 << 31) - 1, "a cache is sized to what fits; see fitting_context"),
    "sliding_window": ((1 << 31) - 1, ""),
}


def check_config(config: dict, where: str) -> None:
    """No size in config.json above its maximum (the family's config checks the rest: types,
    values below 1, heads that do not group)."""
    for key, (most, largest) in CONFIG_MAXIMA.items():
        v = config.get(key)
        if type(v) is int and v > most:
            note = f"; the largest real one is {largest}" if largest else ""
            raise ModelLoadError(f"{where}: {key} {v:,} is more than the {most:,} accepted{note}")
        if type(v) is float and v > most:  # 1e12: a float the family would refuse less clearly
            raise ModelLoadError(f"{where}: {key} {v:g} is not a whole number of at most {most:,}")


def cache_room(device: str) -> int:
    """Bytes a KV cache may take on `device`: half of what is free there now."""
    if device.startswith("cuda"):
        import torch  # lazy: this module is read before torch loads

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return free // 2
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024 // 2
    except (OSError, KeyError, ValueError):
        return 8 << 30  # not Linux: assume a modest machine


def fitting_context(claimed: int, bytes_per_token: int, room: int) -> int:
    """The longest cache, in tokens, that fits in `room` bytes, at most `claimed`, in whole
    multiples of 256 tokens (and never under 256)."""
    fits = room // max(bytes_per_token, 1)
    return claimed if fits >= claimed else max(256, fits // 256 * 256)


def check_vocab(tokens: list, where: str) -> None:
    """A vocabulary of 1..MAX_VOCAB strings (a GGUF's may hold integers, or nothing)."""
    if not 0 < len(tokens) <= MAX_VOCAB:
        raise ModelLoadError(f"{where}: a vocabulary of {len(tokens):,} tokens (expected 1..{MAX_VOCAB:,})")
    if not all(type(t) is str for t in tokens):
        raise ModelLoadError(f"{where}: the vocabulary holds entries that are not strings")


def check_token_strings(tokens: list[str], where: str, holes: bool = False) -> None:
    """Every token a distinct, non-empty string (`holes`: "" marks an id no token has). An empty
    token made tiktoken's encode loop for ever, deaf to Ctrl-C; a duplicate makes one id
    unreachable (issue 45)."""
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if not t:
            if holes:
                continue
            raise ModelLoadError(f"{where}: token {i} is an empty string")
        if (j := seen.setdefault(t, i)) != i:
            raise ModelLoadError(f"{where}: tokens {j} and {i} are the same string {t[:40]!r}")


def check_ids(ids, where: str) -> None:
    """Token ids as tokenizer.json gives them: whole numbers in 0..MAX_VOCAB-1."""
    bad = next((i for i in ids if type(i) is not int or not 0 <= i < MAX_VOCAB), None)
    if bad is not None:
        raise ModelLoadError(f"{where}: token id {str(bad)[:30]} is outside 0..{MAX_VOCAB - 1:,}")


Rules = list[tuple[str, Callable[[object], bool], str]]   # (key, is its value one we cannot run, why)


def refuse_unsupported(values: Mapping, rules: Rules) -> None:
    """ValueError naming the first key (of a config.json or GGUF metadata) whose value the module
    would run wrongly: `{key} {value!r}: {why}`."""
    for key, bad, why in rules:
        if values.get(key) is not None and bad(values[key]):
            raise ValueError(f"{key} {values[key]!r}: {why}")
