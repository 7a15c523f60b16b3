"""Opening the chat while the first frame is already up: the load worker (importing torch, a
first-run pull and loading weights take seconds), its progress in the transcript, and either
the error screen or the chat drawn and the input box opened.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from chatapp.config import load_config
from chatapp.options import FlagError
from chatapp.tui.bridge import Loaded, LoadFailed, LoadProgress, read_figures
from chatapp.tui.face import Face
from chatapp.tui.screens import ErrorScreen
from chatapp.tui.show import SessionView
from chatapp.tui.transcript import LoadStatus
from chatapp.tui.visible import visible
from model.errors import ModelLoadError, UserError

Opener = Callable[[argparse.Namespace, Callable[[object], None]], object]  # -> the chat keeper


def failure_title(e: Exception) -> str:
    """The error screen's title: what could not happen (the line below says why)."""
    if isinstance(e, FlagError):
        return "A setting is not valid"
    if isinstance(e, ModelLoadError) or type(e).__name__ == "PullError":
        return "The model could not be loaded"
    return "nanochat-tui could not start"


class Loading:
    def __init__(self, app: Face, args: argparse.Namespace, opener: Opener | None, view: SessionView) -> None:
        self.app, self.args, self.opener, self.view = app, args, opener, view
        self.warnings: list[str] = []

    async def start(self) -> None:
        spec = self.args.model or "the default model"
        self.app.sub_title = visible(f"loading {spec}")
        await self.app.transcript.mount(LoadStatus(f"Loading {spec}…"))
        self.config_theme()
        self.app.run_worker(self.load, thread=True, exit_on_error=False)

    def config_theme(self) -> None:
        """The config file's theme (chatapp/config.py). A bad file is the load worker's to report."""
        try:
            name = load_config().theme
        except UserError:
            return
        if name and name in self.app.available_themes:
            self.app.theme = name
        elif name:
            self.warnings.append(f"config file: no theme {name!r}; themes: "
                                 f"{', '.join(sorted(self.app.available_themes))}")

    def load(self) -> None:
        """In the load worker's thread; what it makes crosses back as messages."""
        post = self.app.post_message
        try:
            opener = self.opener or self.open_chat
            keeper = opener(self.args, lambda p: post(LoadProgress(p)))
        except UserError as e:
            post(LoadFailed(str(e), failure_title(e)))
        except Exception as e:  # a failed load is shown as one line, never a traceback
            post(LoadFailed(f"{type(e).__name__}: {e}"))
        else:
            post(Loaded(keeper, read_figures(keeper.session.figures)))  # read here, off the UI thread

    def open_chat(self, args: argparse.Namespace, progress: Callable[[object], None]):
        if getattr(args, "backend", None):
            from chatapp.remote.open import open_remote  # lazy: httpx is not needed without --backend

            return open_remote(args, self.warnings.append)
        from chatapp.launch import open_chat  # lazy: imports torch, which must not delay the first frame

        return open_chat(args, progress, self.warnings.append)

    def progress(self, msg: LoadProgress) -> None:
        for status in self.app.transcript.query(LoadStatus):
            status.show(msg.text, msg.fraction)

    async def failed(self, msg: LoadFailed) -> None:
        self.app.sub_title = "no model"
        await self.app.transcript.query(LoadStatus).remove()
        await self.app.transcript.notice(msg.text, "error")
        self.app.push_screen(ErrorScreen(msg.text, msg.title))

    async def loaded(self, msg: Loaded) -> None:
        app, keeper, t = self.app, msg.keeper, self.app.transcript
        app.keeper, s = keeper, keeper.session
        app.sub_title = visible(s.lm.name)
        await self.view.redraw()
        for warning in self.warnings:
            await t.notice(warning.removeprefix("nanochat-tui: "), "warning")
        if keeper.restored is not None:
            await t.notice(f"Chat #{keeper.chat_id} {keeper.title}: {keeper.restored.line}.", "dim")
        if msg.figures is not None:
            app.panel.apply(msg.figures)
        if keeper.restored is not None:
            app.panel.apply(keeper.restored)
        app.show_chat()
        await t.notice(f"{s.lm.name} is ready. Enter sends, Ctrl+J adds a line, Esc stops a reply, F1 shows help.",
                       "dim")
        app.input.disabled = False
        app.input.placeholder = "Message, or /help"
        app.input.focus()
