"""How large a template operation's result would be, worked out from its arguments before it runs
(chat_formats/bounded.py refuses it past the budget): `%` formatting, `str.format`, the filters
and string methods whose result can dwarf their input, and the text of any value. Estimates err
high: a result is never larger than its estimate."""

from __future__ import annotations

import re
from collections.abc import Mapping

WALK = 1 << 20   # items one call sizes one by one (mixed or nested containers); more is refused as too large


def text_size(x, limit: int, walked: list[int] | None = None) -> int:
    """About how many characters str(x) has (never fewer), counted without making it; stops once
    past `limit`. Lists of strings or of ints are counted at C speed; others item by item, each
    distinct item once, at most WALK items in all."""
    walked = [0] if walked is None else walked
    if isinstance(x, str):
        return len(x)
    if isinstance(x, bool) or x is None:
        return 5
    if isinstance(x, int):
        return x.bit_length() // 3 + 2
    if isinstance(x, float):
        return 24
    if isinstance(x, bytes):
        return 4 * len(x) + 3
    if isinstance(x, Mapping):
        x = [v for kv in x.items() for v in kv]
    if not isinstance(x, list | tuple | set | frozenset):
        return 64   # Undefined, a loop or a namespace object: short reprs
    n = len(x)
    if 3 * n > limit:   # every item prints as a character and a separator at least
        return 3 * n
    kinds = set(map(type, x))
    if kinds <= {str}:   # quotes and ", " each
        return 2 + sum(map(len, x)) + 4 * n
    if kinds <= {int}:   # a sign, the digits and ", " each
        return 2 + sum(map(int.bit_length, x)) // 3 + 4 * n
    total, seen = 2, {}
    for item in x:
        walked[0] += 1
        if walked[0] > WALK:
            return limit + 1
        if id(item) not in seen:
            seen[id(item)] = text_size(item, limit, walked)
        total += seen[id(item)] + 2
        if total > limit:
            break
    return total


PRINTF_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?[a-zA-Z%]")


def printf_size(fmt: str, args, limit: int) -> int:
    """The most characters `fmt % args` makes: its text, every field's width and precision,
    the values themselves, and the `*` widths taken from them."""
    n = len(fmt) + text_size(args, limit)
    for width, precision in PRINTF_FIELD.findall(fmt):
        n += sum(int(d) for d in (width, precision) if d.isdigit())
        if "*" in (width, precision):
            values = args if isinstance(args, tuple) else (args,)
            n += sum(abs(v) for v in values if type(v) is int)
    return n


FORMAT_FIELD = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")


def format_size(fmt: str, args: tuple, kwargs: dict, limit: int) -> int:
    """The most characters `fmt.format(*args, **kwargs)` makes (str.format's widths and precisions)."""
    n = len(fmt) + text_size(args, limit) + text_size(kwargs, limit)
    for field in FORMAT_FIELD.findall(fmt):
        spec = field[1:-1].partition(":")[2]
        n += sum(int(d) for d in re.findall(r"\d+", spec))
        if "{" in spec:   # a width taken from the arguments
            n += sum(abs(v) for v in (*args, *kwargs.values()) if type(v) is int)
    return n


def filter_size(name: str, a: dict, limit: int) -> int | None:
    """The most characters filter `name` makes from its bound arguments `a`; None when its
    result is no larger than its input (it is size-checked after it runs)."""
    value = a.get("value", a.get("s"))
    text = value if isinstance(value, str) else None
    if name == "join":
        items = list(value) if isinstance(value, list | tuple) else []
        return sum(text_size(x, limit) for x in items) + len(str(a.get("d", ""))) * max(len(items) - 1, 0)
    if name == "format" and text is not None:
        return printf_size(text, a.get("kwargs") or a.get("args", ()), limit)
    if text is None:
        return None
    if name == "indent":
        width = a.get("width", 4)
        step = len(width) if isinstance(width, str) else abs(int(width)) if isinstance(width, int | float) else 0
        return len(text) + (text.count("\n") + 1) * step
    if name == "replace":
        old, new, count = str(a.get("old", "")), str(a.get("new", "")), a.get("count")
        times = (text.count(old) if old else len(text) + 1)
        times = min(times, count) if type(count) is int and count >= 0 else times
        return len(text) + times * max(len(new) - len(old), 0)
    if name == "wordwrap":
        width = a.get("width", 79)
        width = int(width) if isinstance(width, int | float) and width >= 1 else 1
        lines = 2 * len(text) // width + text.count("\n") + 1
        return len(text) + lines * len(str(a.get("wrapstring") or "\n"))
    if name == "truncate":
        return len(text) + len(str(a.get("end", "...")))
    if name == "center":
        width = a.get("width", 80)
        return max(len(text), int(width) if isinstance(width, int | float) else 0)
    return None



def str_method_size(text: str, name: str, args: tuple, kwargs: dict, limit: int) -> int | None:
    """The most characters `text.name(*args, **kwargs)` makes, for the str methods whose result
    can dwarf the string; None for the rest (their result is size-checked after they run)."""
    if name == "join" and args and isinstance(args[0], list | tuple):
        return sum(text_size(x, limit) for x in args[0]) + len(text) * max(len(args[0]) - 1, 0)
    if name == "replace" and len(args) >= 2:
        return filter_size("replace", {"s": text, "old": args[0], "new": args[1],
                                       "count": args[2] if len(args) > 2 else None}, limit)
    if name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        return len(text) + text.count("\t") * max(size if type(size) is int else 8, 0)
    if name == "translate" and args and isinstance(args[0], Mapping):
        return len(text) * max(max((text_size(v, limit) for v in args[0].values()), default=1), 1)
    return None
