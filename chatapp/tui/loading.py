"""Opening the chat while the screen is already up: the load thread (importing torch, a
first-run pull and loading weights take seconds), its progress in the transcript, and what the
app does meanwhile. The input box takes text at once: the first message waits here and is sent
once the model is ready; Esc takes it back. A load that fails is one red line, and the app stays
up: `/model SPEC` loads another, Ctrl+Q quits.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable

from chatapp.config import load_config
from chatapp.options import FlagError
from chatapp.tui.bridge import Loaded, LoadFailed, LoadProgress, read_figures
from chatapp.tui.face import Face
from chatapp.tui.transcript import LoadStatus
from chatapp.tui.visible import visible
from model.errors import ModelLoadError, UserError

Opener = Callable[[argparse.Namespace, Callable[[object], None]], object]  # -> the chat keeper

WAITING = "Type your message: it is sent once the model is ready"
READY = "Message, or /help"
FAILED = "/model SPEC loads a model; Ctrl+Q quits"


def failure_title(e: Exception) -> str:
    """What could not happen (the rest of the line says why)."""
    if isinstance(e, FlagError):
        return "A setting is not valid"
    if isinstance(e, ModelLoadError) or type(e).__name__ == "PullError":
        return "The model could not be loaded"
    return "nanochat-tui could not start"


class Loading:
    def __init__(self, app: Face, args: argparse.Namespace, opener: Opener | None) -> None:
        self.app, self.args, self.opener = app, args, opener
        self.warnings: list[str] = []
        self.thread: threading.Thread | None = None
        self.failed = False          # the last load failed: no model until /model SPEC loads one
        self.queued: str | None = None  # a message typed during the load, sent once the model is ready
        self.ready = False           # the chat is drawn and the panel filled: the box sends now

    @property
    def running(self) -> bool:
        """A load is under way (or about to start: the thread starts once the frame is drawn)."""
        return self.thread is not None and (self.thread.is_alive() or self.thread.ident is None)

    async def start(self) -> None:
        spec = self.args.model or "the default model"
        self.failed = self.ready = False
        self.app.sub_title = visible(f"loading {spec}")
        self.app.input.placeholder = WAITING
        await self.app.transcript.mount(LoadStatus(f"Loading {spec}…"))
        self.config_theme()
        # A daemon thread of our own rather than a Textual worker (whose executor thread the
        # interpreter joins at exit): Ctrl+Q during a load quits at once (chatapp/cli.py).
        self.thread = threading.Thread(target=self.load, name="load", daemon=True)
        # after the first frame is on the screen: the load's imports would share the GIL with drawing it
        self.app.call_after_refresh(self.thread.start)

    def config_theme(self) -> None:
        """The config file's theme (chatapp/config.py). A bad file is the load thread's to report."""
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
        """In the load thread; what it makes crosses back as messages."""
        post = self.app.post_message
        try:
            opener = self.opener or self.open_chat
            keeper = opener(self.args, lambda p: post(LoadProgress(p)))
        except UserError as e:
            post(LoadFailed(str(e), failure_title(e)))
        except Exception as e:  # a failed load is shown as one line, never a traceback
            post(LoadFailed(f"{type(e).__name__}: {e}", failure_title(e)))
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

    async def failed_load(self, msg: LoadFailed) -> None:
        app = self.app
        self.failed = True
        app.sub_title = "no model"
        await app.transcript.query(LoadStatus).remove()
        if self.queued is not None:  # it cannot be sent: back in the box
            await self.take_back()
        await app.transcript.notice(f"{msg.title}: {msg.text}", "error")
        app.input.placeholder = FAILED  # what to do next

    async def retry(self, spec: str) -> None:
        """`/model SPEC` after a failed load: open the chat on that model instead."""
        self.args.model = spec
        await self.start()

    async def wait(self, text: str) -> None:
        """A message typed during the load: shown now, sent once the model is ready."""
        self.queued = text
        await self.app.transcript.add_user(text)

    async def take_back(self) -> bool:
        """Esc while a message waits for the model: it leaves the transcript for the box. False: none waits."""
        if self.queued is None:
            return False
        text, self.queued = self.queued, None
        await self.app.transcript.drop_unanswered()
        if not self.app.input.text:
            self.app.input.give_back(text)
        return True

    async def loaded(self, msg: Loaded) -> None:
        app, keeper, t = self.app, msg.keeper, self.app.transcript
        app.keeper, s = keeper, keeper.session
        app.sub_title = visible(s.lm.name)
        await app.redraw()
        for warning in self.warnings:
            await t.notice(warning.removeprefix("nanochat-tui: "), "warning")
        self.warnings.clear()
        if keeper.restored is not None:
            await t.notice(f"Chat #{keeper.chat_id} {keeper.title}: {keeper.restored.line}.", "dim")
        if msg.figures is not None:
            app.panel.apply(msg.figures)
        if keeper.restored is not None:
            app.panel.apply(keeper.restored)
        app.show_chat()
        await t.notice(f"{s.lm.name} is ready. Enter sends, Ctrl+J adds a line, Esc stops a reply, F1 shows help.",
                       "dim")
        app.input.placeholder = READY
        self.ready = True
        if self.queued is not None:
            text, self.queued = self.queued, None
            await app.submit(text)
