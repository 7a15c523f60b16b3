"""The session's events, on screen: each goes to the widgets that show it. The panel and the
prefill bar apply events themselves (`CachePanel.apply`, `PrefillWatch.apply`); the reply
writes its own text by kind (`Reply.write`); what is left here is which widget an event is for.
"""

from __future__ import annotations

from collections.abc import Callable

from chatapp.chat.events import (
    Branched,
    CacheState,
    Copied,
    Error,
    Info,
    ModelSwitched,
    Prefilling,
    Progress,
    Quit,
    Restored,
    Saved,
    ToolCall,
    Trimmed,
    TurnStats,
)
from chatapp.chat.figures import counted, human_ms
from chatapp.tui.bridge import SessionEvent, TextBatch, TurnFinished
from chatapp.tui.clipboard import copy_text
from chatapp.tui.editing import Editing
from chatapp.tui.face import Face
from chatapp.tui.model_screen import ModelPicker
from chatapp.tui.prefill_watch import PrefillWatch
from chatapp.tui.token_count import InputBorder
from chatapp.tui.turns import Turns


class SessionView:
    def __init__(self, app: Face, turns: Turns, border: InputBorder, editing: Editing, models: ModelPicker,
                 quit: Callable[[], None]) -> None:
        self.app, self.turns, self.border, self.editing, self.models, self.quit = (
            app, turns, border, editing, models, quit)
        self.prefill_watch: PrefillWatch | None = None  # once the transcript is mounted
        self.batches = 0  # TextBatch messages received, for tests and docs

    async def text_batch(self, msg: TextBatch) -> None:
        self.batches += 1
        self.prefill_watch.end()  # the first text: the prefill is over
        await (await self.app.transcript.reply()).write(msg.text, msg.kind)
        self.app.call_after_refresh(self.turns.gate.drawn)

    async def event(self, msg: SessionEvent) -> None:
        ev, t = msg.event, self.app.transcript
        self.app.panel.apply(ev)
        if isinstance(ev, Progress):
            self.prefill_watch.apply(ev)
            return
        if not isinstance(ev, Prefilling):
            self.prefill_watch.end()  # the prefill is over (or a trim's own progress shows it)
        match ev:
            case ToolCall():
                await (await t.reply()).add_tool_call(ev)
            case TurnStats():
                await (await t.reply()).finish(ev.stop, len(ev.tool_calls))
            case CacheState():
                await self.cache_state(ev)
            case Trimmed():
                t.mark_trimmed(ev.dropped_exchanges)
                await t.notice(f"Context full: dropped the {counted(ev.dropped_exchanges, 'oldest exchange')} and "
                               f"re-prefilled {ev.reprefilled_tokens} tokens in {human_ms(ev.reprefill_ms)}.",
                               "warning")
            case Info():
                await t.notice(ev.text)
            case Error():
                await self.error(ev)
            case Quit():
                self.quit()
            case Copied():
                copy_text(self.app, ev.text, f"reply {ev.reply} of {ev.of}")
            case Restored():  # a stored chat is now the session's (on its own model, maybe)
                await self.redraw()
                await t.notice(f"Opened chat #{ev.chat} {ev.title}: {ev.line}.", "dim")
            case Branched():
                await self.editing.show_branch(ev)
            case Saved():
                await t.notice(f"Saved as chat #{ev.chat} “{ev.title}” ({ev.snapshot_tokens} tokens in its "
                               "KV snapshot).", "dim")
            case ModelSwitched():
                await self.models.show_switch(ev)
        self.app.show_chat()

    async def cache_state(self, ev: CacheState) -> None:
        t, box = self.app.transcript, self.app.input
        if ev.event in ("reset", "system"):
            await t.clear()
            await t.notice(ev.detail or "New chat: the cache is empty.", "dim")
        elif ev.event == "retry":
            await t.remove_last_reply()
        elif ev.event == "undo":
            await t.remove_last_exchange()
        elif ev.event == "undone":  # the model failed mid-turn: the session is as before it
            await self.redraw()
            if self.turns.kind == "send" and not box.text:
                box.give_back(self.turns.sent)  # the message is not lost: edit or send it again

    async def redraw(self) -> None:
        """Redraw the transcript from the session's exchanges, each reply by kind."""
        t, s = self.app.transcript, self.app.session
        await t.clear()
        for ex in s.trimmed + s.exchanges:
            await t.add_exchange(ex.user, s.reply_parts(ex), ex.tool_calls, ex.stop)
        t.mark_trimmed(len(s.trimmed))  # out of the context: dimmed, as when trimmed

    async def error(self, ev: Error) -> None:
        t, box = self.app.transcript, self.app.input
        if self.turns.kind == "send" and (text := await t.drop_unanswered()) is not None:
            if not box.text:
                box.give_back(text)  # refused: give the message back to edit
        await t.notice(ev.message, "error")

    def finished(self, msg: TurnFinished) -> None:
        self.turns.finished()
        self.prefill_watch.end()
        if msg.figures is not None:
            self.app.panel.apply(msg.figures)
        self.border.show()
        if self.app.session is not None:
            self.app.show_chat()  # the keeper may detach (/reset) after its last event: name the chat as it ended
