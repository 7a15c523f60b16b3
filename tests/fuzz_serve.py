"""The fuzz worker's two servers (tests/fuzz_worker.py): a real `serve` on random:tiny, which
fuzzed request bodies are posted to, and a hostile OpenAI-compatible server on loopback, whose
fuzzed answers the real `--backend` client and session read. Both live as long as the worker.

A request ends `ok` (a 200 that reads to its end) or `error` (a 4xx or 503 in OpenAI's JSON error
shape); a 500, any other shape, or a traceback in serve's log is a `crash`. A backend answer
ends `ok` (a reply), or `error` (RemoteError, or one Error event of one line); anything else
the session raised is a `crash`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODELS = b'{"object": "list", "data": [{"id": "hostile", "object": "model", "max_model_len": 4096}]}'


def serve_url(ctx: dict) -> str:
    """The worker's `serve`, started at its first request."""
    if "serve" not in ctx:
        from chatapp.chat.session import Session
        from chatapp.chat.settings import Settings
        from chatapp.serve.app import make_app
        from chatapp.serve.engine import Engine
        from chatapp.serve.kvlru import SnapshotLRU
        from chatapp.serve.main import Server, bind

        defaults = Settings(temperature=0, max_new_tokens=6)
        engine = Engine(Session(ctx["lm"], Settings(**vars(defaults)), context=256), defaults, 16, SnapshotLRU(2))
        ctx["serve_log"] = []
        server = Server(make_app(engine, (), ctx["serve_log"].append), bind("127.0.0.1", 0)).start()
        ctx["serve"] = (server, engine)
    return ctx["serve"][0].url.removesuffix("/v1")


def ask_server(path: str, body: bytes, ctx: dict) -> str:
    import httpx

    base = serve_url(ctx)
    for _ in range(500):  # the first request waits for uvicorn to listen
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
    ctx["serve_log"].clear()
    r = httpx.post(base + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    traced = [line for line in ctx["serve_log"] if "Traceback" in line or "\n" in line]
    if traced:
        raise RuntimeError(f"serve logged {traced[0][:300]!r}")
    if r.status_code == 200:
        return "ok"
    try:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and "\n" not in error["message"]
    except (ValueError, KeyError, TypeError, AssertionError):
        raise RuntimeError(f"a {r.status_code} that is not OpenAI's error shape: {r.text[:200]!r}") from None
    if r.status_code >= 500 and r.status_code != 503:
        raise RuntimeError(f"serve answered {r.status_code}: {error['message'][:200]}")
    return "error"


class Hostile:
    """A loopback server answering /v1/models and chat completions with the bytes set last."""

    def __init__(self):
        self.models, self.chat = MODELS, b""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the connection's end is the body's end

            def log_message(self, *_args):
                pass

            def do_GET(self):
                self.answer(outer.models, "application/json")

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.answer(outer.chat, "text/event-stream")

            def answer(self, body: bytes, kind: str):
                with contextlib.suppress(OSError):  # the client hung up, as it may
                    self.send_response(200)
                    self.send_header("Content-Type", kind)
                    self.end_headers()
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def ask_backend(which: str, body: bytes, ctx: dict) -> str:
    from chatapp.chat.events import Error
    from chatapp.chat.settings import Settings
    from chatapp.remote.client import OpenAIClient
    from chatapp.remote.session import RemoteSession
    from chatapp.remote.wire import RemoteError

    if "hostile" not in ctx:  # one for the worker's life (setdefault would start a server per input)
        ctx["hostile"] = Hostile()
    hostile = ctx["hostile"]
    hostile.models, hostile.chat = (body, b"") if which == "models" else (MODELS, body)
    client = OpenAIClient(hostile.url, timeout=3)
    try:
        info = client.info()
    except RemoteError as e:
        assert "\n" not in str(e), str(e)
        return "error"
    session = RemoteSession(client, info.model, Settings(temperature=0, max_new_tokens=20), context=4096)
    errors = [e.message for e in session.send("hello") if isinstance(e, Error)]
    if len(errors) > 1 or any("\n" in m or "\x1b" in m or "internal error" in m for m in errors):
        raise RuntimeError(f"not one clean error line: {json.dumps(errors)[:300]}")
    return "error" if errors else "ok"
