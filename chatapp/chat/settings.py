"""The chat's settings: one dataclass, one validator for both the flags and `/set`.

Imports no torch, so the command line can read the defaults before the model loads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from model.errors import UserError


@dataclass
class Settings:
    temperature: float = 0.2
    top_k: int = 0
    top_p: float = 0.9
    seed: int | None = None
    min_p: float = 0.0               # 0 = off (model/decode/sampling.py)
    repetition_penalty: float = 1.0  # 1 = off; the penalties count the reply's last repeat_last_n tokens
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    max_new_tokens: int | None = None  # None: no cap; a reply ends at its end token, the full context or Esc
    low_water: float = 0.5           # a full context is trimmed down to this share of it (chat/trim.py)
    system: str | None = None        # None: the model's default system prompt
    model: str | None = None         # the model's spec as chatapp/pull/resolve.py records it: the chat reopens on it

    def sampling_values(self) -> dict:
        """Every setting `/set` can change, by name (the system prompt has its own command)."""
        return {k: getattr(self, k) for k in SETTINGS}

    def sampler_values(self) -> dict:
        """The keyword arguments of model.decode.sampling.SamplingConfig (kept torch-free here)."""
        return {k: getattr(self, k) for k in SAMPLER}


# name -> (type, check, description of valid values)
SETTINGS = {
    "temperature": (float, lambda v: 0 <= v <= 5, "a number from 0 to 5"),
    "top_k": (int, lambda v: v >= 0, "an integer >= 0 (0 = off)"),
    "top_p": (float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "seed": (int, lambda v: 0 <= v < 2**64, "an integer from 0 to 2**64 - 1"),
    "min_p": (float, lambda v: 0 <= v <= 1, "a number from 0 to 1 (0 = off)"),
    "repetition_penalty": (float, lambda v: 0.5 <= v <= 3, "a number from 0.5 to 3 (1 = off)"),
    "presence_penalty": (float, lambda v: -2 <= v <= 2, "a number from -2 to 2 (0 = off)"),
    "frequency_penalty": (float, lambda v: -2 <= v <= 2, "a number from -2 to 2 (0 = off)"),
    "repeat_last_n": (int, lambda v: 1 <= v <= 1024, "an integer from 1 to 1024"),
    "max_new_tokens": (int, lambda v: v >= 1, "an integer >= 1"),  # or none: no cap
    "low_water": (float, lambda v: 0 < v <= 1, "a number in (0, 1] (1 = drop just enough for the turn)"),
}
SAMPLER = ("temperature", "top_k", "top_p", "seed", "min_p", "repetition_penalty", "presence_penalty",
           "frequency_penalty", "repeat_last_n")
DEFAULTS = {f.name: f.default for f in dataclasses.fields(Settings) if f.name in SETTINGS}


NO_VALUE = ("none", "off")  # what unsets a setting whose default is None (seed, max_new_tokens)


def setting_pairs(arg: str) -> list[tuple[str, str | None]]:
    """`temperature=0.7 top_k 50` -> [("temperature", "0.7"), ("top_k", "50")]: each setting as
    NAME=VALUE or NAME VALUE (the form people type first). None: a name with no value after it."""
    words, pairs = arg.replace("=", " ").split(), []  # no value holds "=": both forms are NAME VALUE
    while words:
        key = words.pop(0)
        pairs.append((key, words.pop(0) if words and words[0] not in SETTINGS else None))
    return pairs


def parse_settings(arg: str) -> dict:
    """`temperature=0.7 top_k 50` -> {"temperature": 0.7, "top_k": 50}, or a UserError."""
    out = {}
    for key, raw in setting_pairs(arg):
        if key not in SETTINGS:
            raise UserError(f"unknown setting {key!r}; settings: {', '.join(SETTINGS)}")
        typ, ok, valid = SETTINGS[key]
        if DEFAULTS[key] is None:  # /set alone can say none; serve's JSON null means "not said"
            valid += " or none"
        if raw is None:
            raise UserError(f"{key} needs a value ({valid}): /set {key} VALUE")
        if DEFAULTS[key] is None and raw.lower() in NO_VALUE:
            out[key] = None
            continue
        try:
            value = typ(raw)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise UserError(f"{key} must be {valid}, got {raw!r}")
        out[key] = value
    return out


def settings_text(values: dict) -> str:
    return " ".join(f"{k}={'none' if v is None else v}" for k, v in values.items())


def set_command(settings: Settings, arg: str) -> tuple[str, dict]:
    """`/set NAME=VALUE ...` (or `NAME VALUE`) applied to `settings` (`/set` alone: every setting), as the info
    line and its data; UserError, nothing changed, on a bad value. Local and --backend chats
    both serve /set with it."""
    values = parse_settings(arg)
    if not values:
        values = settings.sampling_values()
    else:
        for k, v in values.items():
            setattr(settings, k, v)
    return "settings: " + settings_text(values), values
