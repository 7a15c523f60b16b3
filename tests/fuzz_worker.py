"""The process tests/test_fuzz.py feeds fuzzed files to: one JSON request a line on stdin, one JSON
answer a line on stdout. It runs each input through the app's real code path and says how it
ended: `ok` (it loaded, or the chat opened), `error` (the one-line error the app shows) or
`crash` (anything else: what would have been a traceback), with the process's peak RSS so far.
The parent enforces the time limit (a hang is an answer that never comes) and the memory bound;
RLIMIT_AS stops a runaway allocation here before it takes the machine.

    {"kind": "gguf" | "tokenizer" | "config" | "template" | "row" | "toml", "path": ..., "cell": ...}
    {"kind": "request", "path": "/v1/chat/completions", "body": "..."}   a real `serve` on random:tiny
    {"kind": "backend", "path": "models" | "chat", "body": "..."}        what a hostile server answers
"""

from __future__ import annotations

import faulthandler
import json
import resource
import signal
import sys
import traceback
from pathlib import Path

AS_LIMIT = 24 << 30  # virtual bytes: torch maps far more than it touches, so this is only a backstop


def peak_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def run(req: dict, ctx: dict) -> str:
    from chatapp.store.database import StoreError
    from model.errors import UserError

    kind, path = req["kind"], Path(req["path"])
    try:
        if kind == "gguf":
            from model.loading.gguf_meta import hf_config, open_gguf, tokenizer_files

            g = open_gguf(path)
            hf_config(g, "fuzz")
            tokenizer_files(g)
        elif kind == "tokenizer":
            from model.tokenizers.bpe import tokenizer_from_json

            try:
                tokenizer_from_json(path, {}).encode("hello <|im_end|> world")
            except (TypeError, KeyError, ValueError, AttributeError, IndexError):  # what load_hf_dir turns
                return "error"  # into its one-line "malformed tokenizer.json" error
        elif kind == "config":
            from model.loading import load_model

            load_model(str(path))
        elif kind == "template":
            return chat_on_template(path.read_text(encoding="utf-8"), ctx)
        elif kind == "row":
            return open_row(path, req, ctx)
        elif kind == "toml":
            from chatapp.config import load_config

            load_config(path)
        elif kind == "request":
            from tests.fuzz_serve import ask_server

            return ask_server(req["path"], req["body"].encode("latin-1"), ctx)
        elif kind == "backend":
            from tests.fuzz_serve import ask_backend

            return ask_backend(req["path"], req["body"].encode("latin-1"), ctx)
        return "ok"
    except (UserError, StoreError):
        return "error"


def chat_on_template(source: str, ctx: dict) -> str:
    """The template as the loaders take it (compiled, recognized or rendered whole), then two
    real turns on it: a refusal at load or an Error event is the app's one line."""
    import dataclasses

    from chatapp.chat.events import Error
    from chatapp.chat.session import Session
    from chatapp.chat.settings import Settings
    from model.chat_formats.recognize import template_for
    from model.errors import UserError

    try:
        fmt = template_for(ctx["lm"].tokenizer, source)
    except (ValueError, KeyError) as e:  # what the loaders give as the model's one-line error
        raise UserError(str(e)) from None
    session = Session(dataclasses.replace(ctx["lm"], template=fmt), Settings(temperature=0, max_new_tokens=2),
                      context=256)
    errors = [e.message for text in ("hi", "and again") for e in session.send(text) if isinstance(e, Error)]
    if any("\n" in m or "internal error" in m for m in errors):
        raise RuntimeError(f"a turn error that is not one clean line: {errors}")
    return "error" if errors else "ok"


def open_row(root: Path, req: dict, ctx: dict) -> str:
    """A store whose one cell the parent fuzzed: it must list, and the chat must open."""
    from chatapp.chat.session import Session
    from chatapp.chat.settings import Settings
    from chatapp.keeper.keeper import ChatKeeper
    from chatapp.store.database import ChatStore

    store = ChatStore(root)
    try:
        store.list()
        keeper = ChatKeeper(Session(ctx["lm"], Settings(max_new_tokens=2), context=256), store)
        keeper.open(req["chat"])
        return "ok"
    finally:
        store.close()


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks where a hang spins
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    from model.loading import load_model

    ctx = {"lm": load_model("random:tiny")}
    print(json.dumps({"ready": True, "peak_kb": peak_kb()}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            outcome, detail = run(req, ctx), ""
        except BaseException as e:  # noqa: BLE001 (what the app would have shown as a traceback)
            outcome = "crash"
            detail = f"{type(e).__name__}: {str(e)[:200]} | " + traceback.format_exc(limit=-3)[-800:]
        print(json.dumps({"outcome": outcome, "detail": detail, "peak_kb": peak_kb()}), flush=True)


if __name__ == "__main__":
    main()
