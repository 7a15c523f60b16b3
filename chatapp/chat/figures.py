"""Figures as a person reads them, one way for the panel, `/stats` and the notices: bytes in
KiB/MiB/GiB, durations in ms below a second and in seconds (then minutes) above, and the
weights' format named apart from the cache's dtype. Imports no torch (the panel's first frame).
"""

from __future__ import annotations

import weakref

from chatapp.chat.settings import SETTINGS

BLOCK_NAMES = {"q4": "4-bit", "q8": "8-bit"}   # model/cpu's two layouts
_formats: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_ms(ms: float) -> str:
    """568.1 ms, 62.9 s, 2 min 05 s."""
    if ms < 1000:
        return f"{ms:.1f} ms"
    s = ms / 1000
    if s < 120:
        return f"{s:.1f} s"
    return f"{int(s // 60)} min {int(s % 60):02d} s"


def counted(n: int, noun: str) -> str:
    """1 exchange, 2 exchanges: what "exported 1 exchanges" got wrong."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def human_rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s:.1f} tok/s"


def weights_format(model) -> str:
    """How the weights are held: the quantized layouts in use, else the parameters' dtype
    (computed once per model: the panel asks four times a second)."""
    try:
        return _formats[model]
    except (KeyError, TypeError):
        pass
    kinds = sorted({BLOCK_NAMES.get(getattr(m, "kind", ""), "") for m in model.modules()} - {""})
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    # "4-bit+8-bit blocks" fits the panel's value column (19 characters)
    text = ("+".join(kinds) + " blocks") if kinds else ("+".join(dtypes) or "?")
    try:
        _formats[model] = text
    except TypeError:
        pass
    return text


def stats_text(d: dict) -> str:
    """`/stats` for a person: the JSON's keys as aligned rows in three sections (the cache and the
    model, the settings, the last turn), values with units, and why tokens and cache_seqlens may
    differ. One dense key=value line was hard to read (issue 44)."""
    sections: dict[str, list[tuple[str, str]]] = {"cache": [], "settings": [], "last turn": []}
    for k, v in d.items():
        section = "last turn" if k.startswith("last_") else "settings" if k in SETTINGS else "cache"
        sections[section].append(stat_row(k.removeprefix("last_"), v, d))
    rows = [r for section in sections.values() for r in section]
    width = max((len(name) for name, _ in rows), default=0) + 2
    return "\n".join(f"{title}\n" + "\n".join(f"  {name:<{width}}{value}" for name, value in section)
                     for title, section in sections.items() if section)


def stat_row(k: str, v, d: dict) -> tuple[str, str]:
    """One `/stats` row: its name (the JSON key, unit suffixes dropped) and its value in units."""
    if k.endswith(("_bytes_used", "_bytes_allocated")):
        return k.replace("_bytes_", "_"), human_bytes(v)
    if k.endswith("_bytes"):
        return k.removesuffix("_bytes"), human_bytes(v)
    if k.endswith("_ms"):
        return k.removesuffix("_ms"), human_ms(v)
    if k == "tokens_per_s":
        return "speed", human_rate(v)
    if k == "tokens" and d.get("cache_seqlens") is not None and v != d["cache_seqlens"]:
        return k, f"{v} ({v - d['cache_seqlens']} pending: in the chat, prefilled with the next turn)"
    return k, "none" if v is None else str(v)
