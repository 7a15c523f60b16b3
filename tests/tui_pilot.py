"""Helpers for driving the real ChatApp with Textual's Pilot (shared by the TUI test files)."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.pilot import Pilot

from chatapp.options import chat_parser
from chatapp.tui.app import ChatApp

TINY = ["--model", "random:tiny", "--seed", "1", "--max-new-tokens", "24"]


def make_app(*argv: str, stable: bool = False, opener=None) -> ChatApp:
    """The app exactly as `nanochat-tui ARGV` builds it."""
    return ChatApp(chat_parser().parse_args([*TINY, *argv]), stable=stable, opener=opener)


async def until(pilot: Pilot, cond: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        await pilot.pause(0.02)


async def ready(pilot: Pilot) -> ChatApp:
    app = pilot.app
    # Loading.ready is set last in Loading.loaded: the session is set before the panel shows the
    # model's figures, and a load without a converted copy can win that race.
    await until(pilot, lambda: app.session is not None and app.loading.ready, what="the model to load")
    return app


def endless(app: ChatApp) -> None:
    """Random weights often pick a stop token within tens of tokens (the tied embedding favours
    tokens already in the prompt, <|im_end|> among them); tests that act while the model writes
    need a reply that only the user or the context ends."""
    app.session.template.stop_ids.clear()


async def submit(pilot: Pilot, text: str, timeout: float = 60.0) -> None:
    """Type `text` into the input, press Enter, and wait until the session is done with it."""
    app = pilot.app
    done = app.inputs_done
    await pilot.press(*text)
    await pilot.press("enter")
    await until(pilot, lambda: app.inputs_done > done and not app.busy, timeout, f"{text!r} to finish")
    await pilot.pause()


def replies(app: ChatApp) -> list[str]:
    """The assistant replies the transcript shows."""
    return [ex.reply.text for ex in app.transcript.exchanges if ex.reply is not None]


def row(app: ChatApp, id: str) -> str:
    """The value shown in one of the cache panel's rows."""
    return app.panel.row(id).value


def notices(app: ChatApp, kind: str | None = None) -> list[str]:
    from chatapp.tui.transcript import Notice

    return [n.text for n in app.transcript.query(Notice) if kind is None or n.has_class(kind)]
