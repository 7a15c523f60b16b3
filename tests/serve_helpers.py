"""Our server, started for real on a loopback port in this process (uvicorn in a thread), on
a tiny random model: the tests talk to it through the real `openai` client and plain HTTP."""

from __future__ import annotations

import contextlib
import time

import httpx

from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.serve.app import make_app
from chatapp.serve.engine import Engine
from chatapp.serve.kvlru import SnapshotLRU
from chatapp.serve.main import Server, bind


@contextlib.contextmanager
def running(lm, queue_size: int = 128, slots: int = 3, api_key: str | None = None, context: int = 512,
            max_new_tokens: int = 6):
    defaults = Settings(temperature=0, max_new_tokens=max_new_tokens)
    engine = Engine(Session(lm, Settings(**vars(defaults)), context=context), defaults, queue_size,
                    SnapshotLRU(slots))
    server = Server(make_app(engine, api_key), bind("127.0.0.1", 0)).start()
    base = server.url.removesuffix("/v1")
    for _ in range(200):
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        time.sleep(0.02)
    try:
        yield server, engine
    finally:
        server.stop()
        engine.close()


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}
