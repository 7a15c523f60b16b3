"""A streaming client for any OpenAI-compatible chat server (ours, llama.cpp's, vLLM, SGLang,
Ollama): one request, its text as it comes, and the figures the server reports (read by
wire.py, which trusts nothing the server sends). Time to first token and tokens/s are measured
here, as the user waits for them. Every failure is one `RemoteError` line; the caller keeps
whatever text came before it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from chatapp.remote.wire import (
    MAX_ID,
    Deadline,
    Delta,
    Figures,
    RemoteError,
    clip,
    count,
    deltas,
    events,
    get,
    lines,
    parse_json,
    read_body,
    read_figures,
)

CHARS_PER_PIECE = 256  # a piece of text is one token or a few: no vocabulary has tokens near this long


@dataclass
class ServerInfo:
    model: str
    context: int = 0   # 0: the server did not say
    server: str = "server"  # what it calls itself (/v1/models' owned_by: llamacpp, vllm, nanochat-tui)


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
        data = self._get("/models")
        models = get(data, "data", list, "") if isinstance(data, dict) else None
        m = models[0] if models else None
        if not isinstance(m, dict) or not isinstance(m.get("id"), str) or not m["id"]:
            raise RemoteError(f"{self.base}/models lists no model")
        if len(m["id"]) > MAX_ID:
            raise RemoteError(f"{self.base}/models names a model of {len(m['id']):,} characters")
        meta = get(m, "meta", dict, "data[0].") or {}
        # vLLM's field, llama.cpp's
        ctx = count(m, "max_model_len", "data[0].") or count(meta, "n_ctx_train", "data[0].meta.")
        owner = m.get("owned_by")  # only a name for the panel: anything but a string is ignored, not refused
        server = owner.strip()[:MAX_ID] if isinstance(owner, str) and owner.strip() else "server"
        return ServerInfo(m["id"], ctx or 0, server)

    def _get(self, path: str) -> object:
        deadline = Deadline(self.timeout, f"the server at {self.base}")
        try:
            with self.http.stream("GET", self.base + path) as r:
                body = read_body(r.iter_bytes(), deadline)
        except httpx.HTTPError as e:
            raise RemoteError(describe(e, self.base, self.timeout)) from None
        if r.status_code != 200:
            raise RemoteError(refusal(r.status_code, body))
        return parse_json(body, f"{self.base}{path} an answer")

    def chat(self, body: dict, figures: Figures, most: int) -> Iterator[Delta]:
        """Stream one completion: its deltas, filling `figures` as they come (so a stream that
        breaks off still leaves what was counted). RemoteError on any failure, and when the
        server sends more than `most` pieces of text (the tokens asked for, or the context):
        each piece is at least one token, so only a server that ignores max_tokens gets there."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        t0, t_first, t_last, pieces, chars = time.perf_counter(), None, None, 0, 0
        deadline = Deadline(self.timeout, f"the server at {self.base}")
        try:
            with self.http.stream("POST", self.base + "/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise RemoteError(refusal(r.status_code, read_body(r.iter_bytes(), deadline)))
                for obj in events(lines(r.iter_bytes(), deadline)):
                    read_figures(obj, figures)
                    for d in deltas(obj):
                        t_last = time.perf_counter()
                        t_first = t_first or t_last
                        pieces, chars = pieces + 1, chars + len(d.text)
                        if pieces > most or chars > most * CHARS_PER_PIECE:
                            raise RemoteError(f"the server sent more than the {most:,} tokens asked for (max_tokens "
                                              "or the context); the reply was cut there")
                        yield d
                        deadline.reset()
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


def refusal(status: int, body: bytes) -> str:
    try:
        err = parse_json(body, "a refusal")
    except RemoteError:
        err = None
    err = err.get("error") if isinstance(err, dict) else None
    message = err.get("message") if isinstance(err, dict) else err
    return f"the server refused ({status}): {clip(message or body.decode('utf-8', 'replace') or 'no reason given')}"


def describe(e: httpx.HTTPError, base: str, timeout: float, midway: bool = False) -> str:
    if isinstance(e, httpx.ConnectError | httpx.ConnectTimeout):
        return f"cannot reach the server at {base} ({type(e).__name__}); is it running?"
    if isinstance(e, httpx.TimeoutException):
        return f"the server at {base} did not answer within {timeout:g} s"
    if midway:
        return f"the server at {base} went away mid-reply ({type(e).__name__}); the partial reply is kept"
    return f"the request to {base} failed ({type(e).__name__}: {e})"
