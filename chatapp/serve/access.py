"""The outermost layer of the server: one log line per request, and OpenAI's JSON error body for
anything the routes did not catch.

The line follows uvicorn's access log (client, request line, status) and adds what llama.cpp's
server logs per request: prompt tokens, the cached ones, time to first token and decode speed
(issue 44). A route leaves those in `request.state.figures`, an error its message in
`request.state.error`. An exception no route caught is answered with a JSON 500 (when nothing
was sent yet) and logged as one line with its type, never as a traceback (issue 45): a log line
per request is what a reader of the log wants, and the message is in the client's hands too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from http import HTTPStatus

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatapp.serve.protocol import error_body
from model.escapes import escape_controls

Log = Callable[[str], object]


class AccessLog:
    def __init__(self, app: ASGIApp, log: Log):
        self.app, self.log = app, log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        status, t0 = 0, time.perf_counter()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as e:  # a bug of ours: the client still gets OpenAI's shape, the log one line
            state["error"] = f"internal error: {type(e).__name__}: {e}"
            if status == 0:
                status = 500
                await JSONResponse(error_body(state["error"], "server_error"), status_code=500)(scope, receive, send)
            else:  # mid-stream: end the body so the connection closes cleanly
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.log(access_line(scope, status, state, (time.perf_counter() - t0) * 1000))


def access_line(scope: Scope, status: int, state: dict, ms: float) -> str:
    """`127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK prompt_tokens=31 ...`:
    one line, every part from the client escaped (the path is percent-decoded: %1b is ESC)."""
    host, port = scope.get("client") or ("-", 0)
    request = f'{scope["method"]} {scope["path"]} HTTP/{scope.get("http_version", "1.1")}'
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
    parts = [f'{host}:{port} - "{request}" {status} {phrase}'.rstrip()]
    if fig := state.get("figures"):
        use, t = fig
        cached = use["prompt_tokens_details"]["cached_tokens"]
        parts.append(f"prompt_tokens={use['prompt_tokens']} cached_tokens={cached} "
                     f"completion_tokens={use['completion_tokens']} ttft_ms={t['prompt_ms']:.1f} "
                     f"tok/s={t['predicted_per_second']:.1f}")
    if err := state.get("error"):
        parts.append(f"error={err[:300]!r}"[:320])
    parts.append(f"{ms:.0f}ms")
    return escape_controls(" ".join(parts))
