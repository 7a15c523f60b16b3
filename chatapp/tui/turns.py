"""Input into the chat, one turn at a time: a message goes to the keeper, a command to the
screen action its table entry names or else to the keeper, each run in the turn worker thread
whose events `bridge.pump` posts back (docs/tui.md: the threading model).
"""

from __future__ import annotations

from functools import partial

from chatapp.chat.commands import Command, parse_input
from chatapp.chat.events import Error
from chatapp.tui.bridge import Gate, pump
from chatapp.tui.face import EventSource, Face
from chatapp.tui.input import ChatInput
from chatapp.tui.loading import Loading
from chatapp.tui.token_count import InputBorder
from model.errors import UserError

NO_MODEL_SCREENS = {"help", "quit", "themes", "panel"}   # the screen commands that work before a model is loaded


class Turns:
    """The one-turn gate and what it knows of the turn in flight."""

    def __init__(self, app: Face, border: InputBorder, loading: Loading) -> None:
        self.app, self.border, self.loading = app, border, loading
        self.busy = False
        self.kind = ""          # "send" or "command": what a failure gives back to the input box
        self.sent = ""          # the last message sent: handed back if the model fails on it
        self.quit_after = False  # Ctrl+Q while the model writes: quit once the turn has ended
        self.inputs_done = 0    # messages and commands the session has finished with
        self.gate = Gate()

    async def submitted(self, msg: ChatInput.Submitted) -> None:
        line = msg.text if msg.editing is None else f"/edit {msg.editing} {msg.text}"  # Ctrl+E's edit
        if await self.submit(line):
            self.app.input.accept(msg.text)

    async def submit(self, text: str) -> bool:
        """Send a message or run a command; False if the app cannot take it now."""
        if self.app.session is None:
            return await self.without_model(text)
        if not self.can_start():
            return False
        try:
            parsed = parse_input(text)  # parsed once: the keeper is handed the Command
        except UserError as e:  # shown as the keeper's events are, in the turn's order
            refusal = Error(str(e))
            self.start(lambda: iter((refusal,)), "command")
            return True
        if isinstance(parsed, Command):
            return self.command(parsed)
        text = parsed
        await self.app.transcript.add_user(text)
        self.border.mark_sent()
        self.sent = text
        self.start(partial(self.app.keeper.send, text), "send")
        return True

    async def without_model(self, text: str) -> bool:
        """Input while no model is ready (loading, or its load failed): one message waits for it,
        the commands that need no model run, `/model SPEC` after a failure loads that one; anything
        else says why not and stays in the box."""
        loading = self.loading
        try:
            parsed = parse_input(text)
        except UserError as e:
            self.app.notify(str(e), severity="error")
            return False
        if isinstance(parsed, Command):
            if parsed.spec.screen in NO_MODEL_SCREENS:
                return self.command(parsed)
            if parsed.spec.name == "/model" and parsed.arg and loading.failed:
                await loading.retry(parsed.arg)
                return True
            why = (f"{parsed.spec.name} needs a model: /model SPEC loads one" if loading.failed else
                   f"The model is still loading: {parsed.spec.name} works once it is ready.")
        elif loading.failed:
            why = "No model is loaded: /model SPEC loads one."
        elif loading.queued is not None:
            why = "A message is already waiting for the model (Esc takes it back)."
        else:
            await loading.wait(parsed)
            return True
        self.app.notify(why, severity="warning")
        return False

    def command(self, cmd: Command) -> bool:
        """A command the screen serves itself (its table entry names the action) runs here; the
        rest go to the keeper (`keeper.run`, chatapp/keeper/base.py)."""
        if cmd.spec.tui:
            getattr(self.app, f"action_{cmd.spec.screen}")(cmd.arg)
        elif cmd.spec.screen and not cmd.arg:
            getattr(self.app, f"action_{cmd.spec.screen}")()
        else:
            self.start(partial(self.app.keeper.run, cmd), "command")
        return True

    def can_start(self) -> bool:
        """One turn at a time on the one session: say why not, and refuse."""
        if self.app.session is None:
            self.app.notify("The model is still loading.", severity="warning")
            return False
        if self.busy:
            self.app.notify("The model is still writing: press Esc to stop it first.", severity="warning")
            return False
        return True

    def start(self, events: EventSource, kind: str) -> None:
        self.busy, self.kind = True, kind
        self.gate = gate = Gate()
        app = self.app
        # the session's figures are read in the worker too, as it leaves them: never from the UI thread
        self.app.run_worker(lambda: pump(events(), app.post_message, gate, lambda: app.session.figures()),
                            thread=True, exclusive=True, group="turn", exit_on_error=False)

    def finished(self) -> None:
        self.busy = False
        self.inputs_done += 1
        if self.quit_after:
            self.app.exit()

    def stop(self) -> bool:
        """Esc: stop the reply being written; False when none is."""
        if self.busy and self.app.session is not None:
            self.app.session.cancel()
            return True
        return False
