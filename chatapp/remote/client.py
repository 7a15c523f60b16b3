"""A streaming client for any OpenAI-compatible chat server (ours, llama.cpp's, vLLM, SGLang,
Ollama): one request, its text as it comes, and the figures the server reports.

Servers report their cache differently; `figures` reads all the shapes we know:
OpenAI's and vLLM's `usage.prompt_tokens_details.cached_tokens`, llama.cpp's `timings`
(`cache_n`, `prompt_n`, `predicted_n`) and its older `tokens_cached`. Time to first token and
tokens/s are measured here, as the user waits for them. Every failure is one `RemoteError`
line; the caller keeps whatever text came before it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx


class RemoteError(Exception):
    """One line for the user: the server could not be reached, refused, or went away."""


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


@dataclass
class ServerInfo:
    model: str
    context: int = 0   # 0: the server did not say


class OpenAIClient:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0):
        self.base = url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # connect fast or say so; a read may wait for a long prefill or a busy queue
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))
        self.timeout = timeout

    def close(self) -> None:
        self.http.close()

    def info(self) -> ServerInfo:
        """The served model (the first /v1/models lists) and its context if the server says."""
        data = self._call(lambda: self.http.get(self.base + "/models"))
        models = data.get("data") if isinstance(data, dict) else None
        if not models or not isinstance(models[0], dict) or not isinstance(models[0].get("id"), str):
            raise RemoteError(f"{self.base}/models lists no model")
        m = models[0]
        ctx = m.get("max_model_len") or (m.get("meta") or {}).get("n_ctx_train") or 0  # vLLM's, llama.cpp's
        return ServerInfo(m["id"], ctx if isinstance(ctx, int) else 0)

    def _call(self, send) -> dict:
        try:
            r = send()
        except httpx.HTTPError as e:
            raise RemoteError(describe(e, self.base, self.timeout)) from None
        if r.status_code != 200:
            raise RemoteError(refusal(r.status_code, r.text))
        try:
            return r.json()
        except ValueError:
            raise RemoteError(f"{self.base} answered with something that is not JSON") from None

    def chat(self, body: dict, figures: Figures) -> Iterator[Delta]:
        """Stream one completion: its deltas, filling `figures` as they come (so a stream that
        breaks off still leaves what was counted). RemoteError on any failure."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        t0, t_first, t_last, pieces = time.perf_counter(), None, None, 0
        try:
            with self.http.stream("POST", self.base + "/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise RemoteError(refusal(r.status_code, r.read().decode("utf-8", "replace")))
                for obj in events(r.iter_lines()):
                    read_figures(obj, figures)
                    for d in deltas(obj):
                        t_last = time.perf_counter()
                        t_first = t_first or t_last
                        pieces += 1
                        yield d
        except httpx.HTTPError as e:
            raise RemoteError(describe(e, self.base, self.timeout, midway=t_first is not None)) from None
        finally:
            figures.completion_tokens = figures.completion_tokens or pieces
            if t_first is not None:
                figures.ttft_ms = (t_first - t0) * 1000
                n = figures.completion_tokens
                span = (t_last or t_first) - t_first
                figures.tokens_per_s = (n - 1) / span if n > 1 and span > 0 else 0.0
            # text arrives in bursts (a proxy's buffer, bytes held for a whole character): the
            # server's decode timing is the truer speed when it gives one
            figures.tokens_per_s = figures.server_tokens_per_s or figures.tokens_per_s
        if not figures.finish:
            raise RemoteError("the server ended the reply without finishing it (stream cut short)")


def events(lines: Iterator[str]) -> Iterator[dict]:
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            obj = json.loads(data)
        except ValueError:
            raise RemoteError(f"the server sent a stream line that is not JSON: {data[:80]!r}") from None
        if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
            raise RemoteError(f"the server failed mid-reply: {obj['error'].get('message', obj['error'])}")
        if isinstance(obj, dict):
            yield obj


def deltas(obj: dict) -> Iterator[Delta]:
    for choice in obj.get("choices") or []:
        d = choice.get("delta") or {}
        if isinstance(d.get("reasoning_content"), str) and d["reasoning_content"]:
            yield Delta(d["reasoning_content"], thinking=True)
        if isinstance(d.get("content"), str) and d["content"]:
            yield Delta(d["content"])


def read_figures(obj: dict, f: Figures) -> None:
    for choice in obj.get("choices") or []:
        if choice.get("finish_reason"):
            f.finish = choice["finish_reason"]
    use = obj.get("usage")
    if isinstance(use, dict):
        f.prompt_tokens = use.get("prompt_tokens") or f.prompt_tokens
        f.completion_tokens = use.get("completion_tokens") or f.completion_tokens
        cached = (use.get("prompt_tokens_details") or {}).get("cached_tokens")
        f.cached_tokens = cached if isinstance(cached, int) else f.cached_tokens
    t = obj.get("timings")
    if isinstance(t, dict) and isinstance(t.get("cache_n"), int):  # llama.cpp: cache_n reused + prompt_n new
        if f.cached_tokens is None:
            f.cached_tokens = t["cache_n"]
        f.prompt_tokens = f.prompt_tokens or t["cache_n"] + int(t.get("prompt_n") or 0)
        f.completion_tokens = f.completion_tokens or int(t.get("predicted_n") or 0)
        if isinstance(t.get("predicted_per_second"), int | float):
            f.server_tokens_per_s = float(t["predicted_per_second"])
    if isinstance(obj.get("tokens_cached"), int) and f.cached_tokens is None:  # llama.cpp's older field
        f.cached_tokens = obj["tokens_cached"]


def refusal(status: int, text: str) -> str:
    try:
        err = json.loads(text).get("error")
        message = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        message = None
    message = " ".join(str(message or text or "no reason given").split())[:300]
    return f"the server refused ({status}): {message}"


def describe(e: httpx.HTTPError, base: str, timeout: float, midway: bool = False) -> str:
    if isinstance(e, httpx.ConnectError | httpx.ConnectTimeout):
        return f"cannot reach the server at {base} ({type(e).__name__}); is it running?"
    if isinstance(e, httpx.TimeoutException):
        return f"the server at {base} did not answer within {timeout:g} s"
    if midway:
        return f"the server at {base} went away mid-reply ({type(e).__name__}); the partial reply is kept"
    return f"the request to {base} failed ({type(e).__name__}: {e})"
