"""Figures as a person reads them, one way for the panel, `/stats` and the notices: bytes in
KiB/MiB/GiB, durations in ms below a second and in seconds (then minutes) above, and the
weights' format named apart from the cache's dtype. Imports no torch (the panel's first frame).
"""

from __future__ import annotations

import weakref

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


def stats_line(d: dict) -> str:
    """`/stats` in words: the same keys as the JSON, with units, and why tokens and
    cache_seqlens may differ."""
    parts = []
    for k, v in d.items():
        if k.endswith("_bytes_used") or k.endswith("_bytes_allocated"):
            parts.append(f"{k.removesuffix('_bytes_used').removesuffix('_bytes_allocated')}_"
                         f"{'used' if k.endswith('used') else 'allocated'}={human_bytes(v)}")
        elif k.endswith("_ms"):
            parts.append(f"{k.removesuffix('_ms')}={human_ms(v)}")
        elif k.endswith("tokens_per_s"):
            parts.append(f"{k.removesuffix('_tokens_per_s')}_speed={human_rate(v)}")
        elif k == "tokens" and d.get("cache_seqlens") is not None and v != d["cache_seqlens"]:
            pending = v - d["cache_seqlens"]
            parts.append(f"tokens={v} ({pending} pending: in the chat, prefilled with the next turn)")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts)
