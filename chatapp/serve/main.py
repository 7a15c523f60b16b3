"""`nanochat-tui serve`: the model, the engine, and uvicorn on a socket we bind ourselves (so
`--port 0` works and the line we print names the port really listened on). Flags: flags.py."""

from __future__ import annotations

import argparse
import socket
import sys
import threading

import uvicorn

from chatapp.launch import open_session, settings_from
from chatapp.serve.app import make_app
from chatapp.serve.engine import Engine
from chatapp.serve.kvlru import SnapshotLRU
from model.errors import UserError
from model.escapes import escape_controls, to_stderr


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(256)
    return sock


class Server:
    """uvicorn serving `app` on `sock` in a thread: what the CLI blocks on and tests start."""

    def __init__(self, app, sock: socket.socket):
        self.sock = sock
        cfg = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                             ws="none", lifespan="off")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def start(self) -> Server:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def banner(model: str, url: str, context: int, args: argparse.Namespace) -> str:
    """The start-up line. The model's name comes from its files (config.json, GGUF metadata):
    escaped, so a name holding ESC cannot drive the terminal."""
    keys = len(args.api_keys)
    auth = "" if not keys else ", API key required" if keys == 1 else f", {keys} API keys, each with its own cache"
    return escape_controls(f"nanochat-tui serve: {model} at {url} (context {context}, queue {args.queue_size}, "
                           f"{args.kv_slots} KV snapshot slots{auth})")


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; `args` as chatapp/serve/flags.py checked them."""
    args.system, args.low_water = None, None
    defaults = settings_from(args)
    session = open_session(args, progress=to_stderr)
    sock = bind(args.host, args.port)
    engine = Engine(session, defaults, args.queue_size, SnapshotLRU(args.kv_slots, args.kv_budget_mb << 20))
    server = Server(make_app(engine, args.api_keys), sock)
    print(banner(session.lm.name, server.url, session.cache.capacity, args), file=sys.stderr, flush=True)
    try:
        server.server.run(sockets=[sock])
    finally:
        engine.close()
    return 0
