"""What an OpenAI-compatible server sends, read as if it were hostile (issue 45): lines of
bounded length, a deadline that trickled bytes do not reset, and every field checked for its
type and range before use, so a wrong one is a one-line `RemoteError`, never a traceback.

Servers report their cache differently; `read_figures` reads all the shapes we know:
OpenAI's and vLLM's `usage.prompt_tokens_details.cached_tokens`, llama.cpp's `timings`
(`cache_n`, `prompt_n`, `predicted_n`) and its older `tokens_cached`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

from model.escapes import escape_controls

MAX_LINE = 1 << 20     # bytes in one SSE line (a chunk is a few hundred; httpx's iter_lines had no cap)
MAX_BODY = 4 << 20     # a whole JSON answer (/v1/models) or a refusal's body
MAX_COUNT = 1 << 40    # a token count past this is not a count
MAX_RATE = 1e9         # tokens/s: no server decodes a billion a second
MAX_ID = 256           # characters in a model id


class RemoteError(Exception):
    """One line for the user: the server could not be reached, refused, went away or sent
    something malformed. Its text is escaped: it may quote the server."""

    def __init__(self, message: str):
        super().__init__(escape_controls(message))


@dataclass
class Delta:
    text: str
    thinking: bool = False


@dataclass
class Figures:
    prompt_tokens: int = 0
    cached_tokens: int | None = None   # None: the server did not say
    completion_tokens: int = 0
    finish: str = ""                   # the server's finish_reason ("" when the stream broke off)
    ttft_ms: float = 0.0
    tokens_per_s: float = 0.0
    server_tokens_per_s: float = 0.0   # the server's own decode speed (llama.cpp's timings), when it says


class Deadline:
    """`--timeout` for each piece of a reply: the next one must come within it, however the
    bytes trickle in. httpx's timeout is per read, so a byte every 5 s never tripped it."""

    def __init__(self, seconds: float, what: str):
        self.seconds, self.what = seconds, what
        self.reset()

    def reset(self) -> None:
        self.at = time.monotonic() + self.seconds

    def check(self) -> None:
        if time.monotonic() > self.at:
            raise RemoteError(f"{self.what} sent no whole piece of the reply within {self.seconds:g} s "
                              "(bytes trickled in, or nothing came)")


def lines(chunks: Iterator[bytes], deadline: Deadline) -> Iterator[str]:
    """The lines of a byte stream, each at most MAX_LINE bytes (one 400 MB line took httpx's
    line reader to 1.27 GB). Lines end in \\n or \\r\\n, as every server we know sends them."""
    buf = b""
    for chunk in chunks:
        deadline.check()
        buf += chunk
        *whole, buf = buf.split(b"\n")
        for line in whole:
            if len(line) > MAX_LINE:
                raise too_long()
            yield line.removesuffix(b"\r").decode("utf-8", "replace")
        if len(buf) > MAX_LINE:
            raise too_long()
    if buf:
        yield buf.decode("utf-8", "replace")


def too_long() -> RemoteError:
    return RemoteError(f"the server sent a stream line longer than {MAX_LINE >> 20} MiB; the reply was cut there")


def read_body(chunks: Iterator[bytes], deadline: Deadline, cap: int = MAX_BODY) -> bytes:
    parts, n = [], 0
    for chunk in chunks:
        deadline.check()
        n += len(chunk)
        if n > cap:
            raise RemoteError(f"the server's answer is over {cap >> 20} MiB")
        parts.append(chunk)
    return b"".join(parts)


def parse_json(text: str | bytes, what: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
        raise RemoteError(f"the server sent {what} that is not JSON: {str(text[:80])!r}") from None


def events(stream: Iterator[str]) -> Iterator[dict]:
    """The JSON objects of an SSE stream, up to `[DONE]`; an `error` object is a RemoteError."""
    for line in stream:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        obj = parse_json(data, "a stream line")
        if not isinstance(obj, dict):
            continue
        if isinstance(err := obj.get("error"), dict | str):
            message = err.get("message", err) if isinstance(err, dict) else err
            raise RemoteError(f"the server failed mid-reply: {clip(message)}")
        yield obj


def clip(v: object, n: int = 300) -> str:
    return " ".join(str(v)[:4 * n].split())[:n]


# --- fields, checked -------------------------------------------------------------------
def get(obj: dict, name: str, typ: type | tuple[type, ...], where: str) -> object:
    """obj[name] when it is a `typ` (absent or null: None); a RemoteError naming it otherwise."""
    v = obj.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, typ):
        raise RemoteError(f"the server sent a malformed reply: {where}{name} is {kind(v)}")
    return v


def count(obj: dict, name: str, where: str) -> int | None:
    v = get(obj, name, int, where)
    if v is not None and not 0 <= v <= MAX_COUNT:
        raise RemoteError(f"the server sent a malformed reply: {where}{name} is {clip(v, 40)}, not a token count")
    return v


def rate(obj: dict, name: str, where: str) -> float | None:
    v = get(obj, name, int | float, where)
    if v is not None and not 0 <= v <= MAX_RATE:  # False for NaN and inf; no float() of a 400-digit int
        raise RemoteError(f"the server sent a malformed reply: {where}{name} is {clip(v, 40)}, not a speed")
    return None if v is None else float(v)


def kind(v: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number"}
    return names.get(type(v), type(v).__name__)


def choices(obj: dict) -> list[dict]:
    cs = get(obj, "choices", list, "") or []
    for i, c in enumerate(cs):
        if not isinstance(c, dict):
            raise RemoteError(f"the server sent a malformed reply: choices[{i}] is {kind(c)}")
    return cs


def deltas(obj: dict) -> Iterator[Delta]:
    for i, choice in enumerate(choices(obj)):
        d = get(choice, "delta", dict, f"choices[{i}].") or {}
        if thinking := get(d, "reasoning_content", str, f"choices[{i}].delta."):
            yield Delta(thinking, thinking=True)
        if text := get(d, "content", str, f"choices[{i}].delta."):
            yield Delta(text)


def read_figures(obj: dict, f: Figures) -> None:
    for i, choice in enumerate(choices(obj)):
        if finish := get(choice, "finish_reason", str, f"choices[{i}]."):
            f.finish = clip(finish, 40)
    if use := get(obj, "usage", dict, ""):
        f.prompt_tokens = count(use, "prompt_tokens", "usage.") or f.prompt_tokens
        f.completion_tokens = count(use, "completion_tokens", "usage.") or f.completion_tokens
        details = get(use, "prompt_tokens_details", dict, "usage.") or {}
        if (cached := count(details, "cached_tokens", "usage.prompt_tokens_details.")) is not None:
            f.cached_tokens = cached
    t = get(obj, "timings", dict, "") or {}
    if (cache_n := count(t, "cache_n", "timings.")) is not None:  # llama.cpp: cache_n reused + prompt_n new
        if f.cached_tokens is None:
            f.cached_tokens = cache_n
        f.prompt_tokens = f.prompt_tokens or cache_n + (count(t, "prompt_n", "timings.") or 0)
        f.completion_tokens = f.completion_tokens or count(t, "predicted_n", "timings.") or 0
        if (speed := rate(t, "predicted_per_second", "timings.")) is not None:
            f.server_tokens_per_s = speed
    if (old := count(obj, "tokens_cached", "")) is not None and f.cached_tokens is None:  # llama.cpp's older field
        f.cached_tokens = old
