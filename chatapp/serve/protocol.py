"""The OpenAI chat-completions wire format: a request checked into a `ChatRequest`, and the
bodies we send back (responses, stream chunks, errors).

A bad request is refused with the error body OpenAI's own API sends
(`{"error": {"message", "type", "param", "code"}}`), so every client library shows its message.
Fields we do not serve (n > 1, tools, logprobs, ...) are refused by name rather than ignored: a
client that asked for them would otherwise get something else than it asked for, silently.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field

from chatapp.chat.settings import SETTINGS
from chatapp.serve.messages import BadMessages, normalize

MAX_STOPS = 4  # what OpenAI's API allows
MAX_SALT = 1024  # vLLM suggests 43 characters (256 random bits in base64)


class ApiError(Exception):
    """An HTTP error with an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.code, self.param)


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class ChatRequest:
    messages: list[dict]           # as Session.respond_to takes them (messages.normalize)
    stream: bool = False
    include_usage: bool = False    # stream_options.include_usage: a last chunk with the usage
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    cache_salt: str | None = None  # vLLM's field: cached prefixes are shared only under the same salt
    key_id: int = 0                # which of the server's API keys sent it (app.py)
    id: str = field(default_factory=lambda: "chatcmpl-" + uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    def settings(self) -> dict:
        """The sampling settings this request asks for (the rest stay the server's defaults)."""
        d = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
             "max_new_tokens": self.max_tokens, "seed": self.seed}
        return {k: v for k, v in d.items() if v is not None}

    @property
    def isolation(self) -> tuple[int, str | None]:
        """Requests share cached prefixes, and so learn of each other's prompts through
        `cached_tokens`, only when this is equal (docs/serve.md, cache isolation)."""
        return self.key_id, self.cache_salt


REFUSED = {"tools": "tool calling", "tool_choice": "tool calling", "functions": "function calling",
           "function_call": "function calling", "logprobs": "logprobs", "top_logprobs": "logprobs",
           "response_format": "response_format", "logit_bias": "logit_bias"}


def parse_request(raw: bytes) -> ChatRequest:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({getattr(e, 'msg', e)})", code="invalid_json") \
            from None
    except (RecursionError, ValueError):
        raise ApiError(400, "the request body is nested too deeply or holds too large a number",
                       code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    for name, what in REFUSED.items():
        if body.get(name) not in (None, False, [], {"type": "text"}, "none"):
            raise ApiError(400, f"{name}: {what} is not supported by this server", param=name,
                           code="unsupported_parameter")
    if body.get("n", 1) != 1:
        raise ApiError(400, "n: only one choice per request is supported", param="n", code="unsupported_parameter")
    try:
        messages = normalize(body.get("messages"))
    except BadMessages as e:
        raise ApiError(400, str(e), param="messages") from None
    stream = flag(body, "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest(messages, stream, flag(opts, "include_usage"),
                       temperature=number(body, "temperature", "temperature", float),
                       top_p=number(body, "top_p", "top_p", float),
                       top_k=number(body, "top_k", "top_k", int),
                       max_tokens=number({"max_tokens": max_tokens}, "max_tokens", "max_new_tokens", int),
                       seed=number(body, "seed", "seed", int), stop=stops(body.get("stop")),
                       cache_salt=salt(body.get("cache_salt")))


def flag(body: dict, name: str) -> bool:
    v = body.get(name, False)
    if not isinstance(v, bool) and v is not None:
        raise ApiError(400, f"{name} must be true or false", param=name)
    return bool(v)


def number(body: dict, name: str, setting: str, typ: type) -> float | int | None:
    """A sampling field checked by the same rules `/set` uses (chat/settings.py)."""
    v = body.get(name)
    if v is None:
        return None
    _, ok, valid = SETTINGS[setting]
    x = exactly(v, typ)
    if x is None or not ok(x):
        raise ApiError(400, f"{name} must be {valid}, got {json.dumps(v)[:40]}", param=name)
    return x


def exactly(v: object, typ: type) -> float | int | None:
    """`v` as `typ` when it is a JSON number that `typ` holds exactly (finite; whole for an int),
    else None. Checked before converting: int() raises on 1e999 and NaN, float() on a 400-digit int."""
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not math.isfinite(v)):
        return None
    try:
        x = typ(v)
    except OverflowError:
        return None
    return x if x == v else None


def salt(v: object) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > MAX_SALT:
        raise ApiError(400, f"cache_salt must be a non-empty string of at most {MAX_SALT} characters",
                       param="cache_salt")
    return v


def stops(v: object) -> list[str]:
    if v is None:
        return []
    out = [v] if isinstance(v, str) else v
    if not isinstance(out, list) or not all(isinstance(s, str) and s for s in out) or len(out) > MAX_STOPS:
        raise ApiError(400, f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them", param="stop")
    return out


# --- what we send back ------------------------------------------------------------
def usage(prompt: int, cached: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def completion(req: ChatRequest, model: str, text: str, finish: str, use: dict, timings: dict) -> dict:
    return {"id": req.id, "object": "chat.completion", "created": req.created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": use, "timings": timings}


def chunk(req: ChatRequest, model: str, delta: dict, finish: str | None = None, **extra) -> dict:
    return {"id": req.id, "object": "chat.completion.chunk", "created": req.created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def sse(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()
