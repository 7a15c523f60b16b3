"""What the TUI's parts may use of the app: the one written contract between `ChatApp` (the
wiring, chatapp/tui/app.py) and the objects it hands input, events and actions to
(`Turns`, `Show`, `Actions`, `Loading`, `Editing`, `ModelPicker`, `InputBorder`).
Each takes the app as a `Face` and uses nothing of it that is not declared here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from textual.screen import Screen

from chatapp.chat.events import Event

if TYPE_CHECKING:  # the keeper imports torch, which must not delay the first frame
    from chatapp.tui.cache_panel import CachePanel
    from chatapp.tui.input import ChatInput
    from chatapp.tui.transcript import Transcript

EventSource = Callable[[], Iterator[Event]]


class Face(Protocol):
    keeper: Any                  # the ChatKeeper (or RemoteKeeper) once loaded, else None
    stable: bool                 # snapshot tests: hide the figures that differ between runs
    sub_title: str
    theme: str
    available_themes: dict
    screen: Screen

    @property
    def session(self) -> Any: ...          # the keeper's session; None while loading

    @property
    def transcript(self) -> Transcript: ...

    @property
    def panel(self) -> CachePanel: ...

    @property
    def input(self) -> ChatInput: ...

    @property
    def busy(self) -> bool: ...            # a turn is running in the worker

    def notify(self, message: str, *, severity: str = "information") -> None: ...

    def push_screen(self, screen: Screen, callback: Callable | None = None) -> Any: ...

    def exit(self) -> None: ...

    def call_after_refresh(self, callback: Callable) -> bool: ...

    def set_timer(self, delay: float, callback: Callable) -> Any: ...

    def post_message(self, message: Any) -> bool: ...   # thread-safe: the workers' way in

    def run_worker(self, work: Callable, **kwargs: Any) -> Any: ...

    def action_change_theme(self) -> None: ...

    async def submit(self, text: str) -> bool: ...   # a message or a command, as if typed

    def can_start(self) -> bool: ...                  # False, with a warning, while a turn runs

    def start_turn(self, events: EventSource, kind: str) -> None: ...   # in the turn worker

    def show_chat(self) -> None: ...                  # the header: the model and the stored chat

    async def redraw(self) -> None: ...               # the transcript again, from the session
