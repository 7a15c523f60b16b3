"""Switching models in the app: the picker (`/model` alone, or "Switch model…" in the palette) and
how a switch shows (progress in the cache panel, then the transcript redrawn for the new model).

The switch itself is the keeper's `/model SPEC` (chatapp/keeper/switch.py), run in the turn worker
like any command, so the one-turn-at-a-time gate (`ChatApp.can_start`) covers it.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from chatapp.chat.events import ModelSwitched
from chatapp.tui.face import Face
from chatapp.tui.visible import visible


class ModelScreen(ModalScreen[str | None]):
    """The models to switch to (`ModelChoice`s); Enter picks one, Esc closes."""

    DEFAULT_CSS = """
    ModelScreen { align: center middle; }
    #models { width: 90; max-width: 95%; height: auto; max-height: 90%; border: thick $primary;
              background: $surface; padding: 1 2; }
    #models .title { text-style: bold; margin-bottom: 1; }
    #models .hint { color: $text-muted; margin-top: 1; }
    #models OptionList { height: auto; max-height: 20; }
    """
    BINDINGS = [Binding("escape", "dismiss", "Close")]

    def __init__(self, choices: list, current: str) -> None:
        super().__init__()
        self.choices, self.current = choices, current

    def compose(self) -> ComposeResult:
        options = [Option(Content.assemble((visible(c.label), "bold"), "  ", (visible(self.note(c)), "dim")),
                          id=c.spec) for c in self.choices]
        with Vertical(id="models"):
            yield Label(Content(visible(f"Switch model (now {self.current})")), classes="title")
            yield OptionList(*options, id="model-list")
            yield Label("Enter switches: the chat carries over. Esc closes. Other models: /model SPEC",
                        classes="hint")

    def note(self, c) -> str:
        return f"{c.note}, the current model" if self.current in (c.spec, c.label) else c.note

    def on_option_list_option_selected(self, msg: OptionList.OptionSelected) -> None:
        self.dismiss(msg.option.id)

    async def action_dismiss(self, result: str | None = None) -> None:
        self.dismiss(result)


class ModelPicker:
    """The app's part in a switch: the picker, and the transcript once the switch is reported
    (the panel shows its progress and outcome itself: CachePanel.apply)."""

    def __init__(self, app: Face) -> None:
        self.app = app

    def open(self) -> None:
        app = self.app
        if isinstance(app.screen, ModelScreen) or not app.can_start():
            return
        from chatapp.keeper.models import choices  # lazy: the pull module's imports stay off the first frame

        store = app.keeper.store
        app.push_screen(ModelScreen(choices(store.root if store else None), app.session.lm.name), self.picked)

    async def picked(self, spec: str | None) -> None:
        if spec is not None:
            await self.app.submit(f"/model {spec}")

    async def show_switch(self, ev: ModelSwitched) -> None:
        """The keeper holds the new session now: the transcript stays as it is (the same text),
        dimming what a smaller context left out."""
        self.app.transcript.mark_trimmed(ev.dropped_exchanges)
        await self.app.transcript.notice(f"Switched from {ev.previous} to {ev.line}.", "dim")
