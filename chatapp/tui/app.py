"""The Textual face of the session: a transcript, an input box and a live KV-cache panel.

All conversation logic lives in `Session`. This app only forwards input to
`keeper.send` / `keeper.run` (a command parsed once, here) in a worker thread and renders the events that
come back (batched by `bridge.pump`). See docs/tui.md for the threading model.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING

from textual import work
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header

from chatapp.chat.commands import TABLE, Command, CommandSpec, parse_input
from chatapp.chat.events import (
    Branched,
    CacheState,
    Copied,
    Error,
    Event,
    Info,
    Prefilling,
    Quit,
    Restored,
    Saved,
    ToolCall,
    Trimmed,
    TurnStats,
)
from chatapp.chat.figures import human_ms
from chatapp.config import load_config
from chatapp.options import FlagError
from chatapp.tui.bridge import Gate, Loaded, LoadFailed, LoadProgress, SessionEvent, TextBatch, TurnFinished, pump
from chatapp.tui.cache_panel import CachePanel, read_memory
from chatapp.tui.chats_screen import ChatAction, ChatsScreen
from chatapp.tui.clipboard import CodeTranscript, copy_text
from chatapp.tui.editing import Editing
from chatapp.tui.input import ChatInput
from chatapp.tui.model_screen import ModelSwitching
from chatapp.tui.prefill_watch import PrefillWatch
from chatapp.tui.screens import ErrorScreen, HelpScreen
from chatapp.tui.token_count import TokenCount
from chatapp.tui.transcript import LoadStatus, Transcript
from chatapp.tui.visible import visible
from model.errors import ModelLoadError, UserError

if TYPE_CHECKING:  # the keeper imports torch, which must not delay the first frame
    from chatapp.keeper.keeper import ChatKeeper

Opener = Callable[[argparse.Namespace, Callable[[object], None]], "ChatKeeper"]

PANEL_REFRESH_S = 0.25  # the panel updates at least 4 times a second while the model writes


CHAT_ACTIONS = {"stop", "chats", "copy_reply", "help"}


def failure_title(e: Exception) -> str:
    """The error screen's title: what could not happen (the line below says why)."""
    if isinstance(e, FlagError):
        return "A setting is not valid"
    if isinstance(e, ModelLoadError) or type(e).__name__ == "PullError":
        return "The model could not be loaded"
    return "nanochat-tui could not start"


class ChatApp(ModelSwitching, TokenCount, PrefillWatch, Editing):
    CSS_PATH = "app.tcss"
    TITLE = "nanochat-tui"
    # Below 80 columns the 38-column cache panel would squeeze the chat (at 42 the input box
    # had no columns left and Textual crashed drawing it): the chat gets the whole width.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (80, "-wide")]
    BINDINGS = [
        Binding("escape", "stop", "Stop reply"),  # CHAT_ACTIONS below: the ones the error screen hides
        Binding("f1", "help", "Help"),
        Binding("ctrl+o", "chats", "Chats"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("ctrl+y", "copy_reply", "Copy reply", priority=True),  # over the input box's redo
    ]

    def __init__(self, args: argparse.Namespace, stable: bool = False, opener: Opener | None = None) -> None:
        """`stable=True` hides figures that differ between runs (memory, timings): snapshots.
        `opener(args, progress)` makes the chat keeper (default: `chatapp.launch.open_chat`: a
        session, with the stored chat restored for --chat/--resume)."""
        super().__init__()
        self.args = args
        self.stable = stable
        self.opener = opener
        self.keeper: ChatKeeper | None = None  # the one chat object: the session, stored as it goes
        self.load_warnings: list[str] = []
        self.quitting = False
        self.busy = False
        self.turn_kind = ""
        self.sent = ""  # the last message sent: handed back if the model fails on it
        self.batches = 0  # TextBatch messages received, for tests and docs
        self.inputs_done = 0  # messages and commands the session has finished with

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield CodeTranscript(id="transcript")
                yield ChatInput(id="input", disabled=True, placeholder="Loading the model…")
            yield CachePanel(self.stable, id="panel")
        yield Footer()

    @property
    def session(self):
        """The keeper's session: /model replaces it."""
        return self.keeper.session if self.keeper is not None else None

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def panel(self) -> CachePanel:
        return self.query_one(CachePanel)

    @property
    def input(self) -> ChatInput:
        return self.query_one(ChatInput)

    async def on_mount(self) -> None:
        spec = self.args.model or "the default model"
        self.sub_title = visible(f"loading {spec}")
        await self.transcript.mount(LoadStatus(f"Loading {spec}…"))
        self.panel_timer = self.set_interval(PANEL_REFRESH_S, self.refresh_panel, pause=True)
        self.input.cursor_blink = not self.stable  # a blinking cursor would make snapshots flaky
        self.config_theme()
        self.load_session()

    def config_theme(self) -> None:
        """The config file's theme (chatapp/config.py). A bad file is the load worker's to report."""
        try:
            name = load_config().theme
        except UserError:
            return
        if name and name in self.available_themes:
            self.theme = name
        elif name:
            self.load_warnings.append(f"config file: no theme {name!r}; themes: "
                                      f"{', '.join(sorted(self.available_themes))}")

    # --- loading -------------------------------------------------------------------
    @work(thread=True, exit_on_error=False)
    def load_session(self) -> None:
        """In a thread: importing torch, a first-run pull and loading weights take seconds."""
        try:
            opener = self.opener or self.open_chat
            chat = opener(self.args, lambda p: self.post_message(LoadProgress(p)))
        except UserError as e:
            self.post_message(LoadFailed(str(e), failure_title(e)))
        except Exception as e:  # a failed load is shown as one line, never a traceback
            self.post_message(LoadFailed(f"{type(e).__name__}: {e}"))
        else:
            self.post_message(Loaded(chat))

    def open_chat(self, args: argparse.Namespace, progress: Callable[[object], None]) -> ChatKeeper:
        if getattr(args, "backend", None):
            from chatapp.remote.open import open_remote  # lazy: httpx is not needed without --backend

            return open_remote(args, self.load_warnings.append)
        from chatapp.launch import open_chat  # lazy: imports torch, which must not delay the first frame

        return open_chat(args, progress, self.load_warnings.append)

    def on_load_progress(self, msg: LoadProgress) -> None:
        for status in self.transcript.query(LoadStatus):
            status.show(msg.text, msg.fraction)

    async def on_load_failed(self, msg: LoadFailed) -> None:
        self.sub_title = "no model"
        await self.transcript.query(LoadStatus).remove()
        await self.transcript.notice(msg.text, "error")
        self.push_screen(ErrorScreen(msg.text, msg.title))

    async def on_loaded(self, msg: Loaded) -> None:
        keeper = msg.chat
        self.keeper, s = keeper, keeper.session
        self.show_markers()
        self.sub_title = visible(s.lm.name)
        await self.show_history()
        for warning in self.load_warnings:
            await self.transcript.notice(warning.removeprefix("nanochat-tui: "), "warning")
        if keeper.restored is not None:
            await self.transcript.notice(f"Chat #{keeper.chat_id} {keeper.title}: {keeper.restored.line}.", "dim")
        self.panel.show_restore(keeper.restored.line if keeper.restored else "")
        self.show_chat()
        await self.transcript.notice(f"{s.lm.name} is ready. Enter sends, Ctrl+J adds a line, "
                                     "Esc stops a reply, F1 shows help.", "dim")
        self.input.disabled = False
        self.input.placeholder = "Message, or /help"
        self.input.focus()
        self.refresh_panel()

    # --- input -------------------------------------------------------------------------
    async def on_chat_input_submitted(self, msg: ChatInput.Submitted) -> None:
        line = msg.text if msg.editing is None else f"/edit {msg.editing} {msg.text}"  # Ctrl+E's edit
        if await self.submit(line):
            self.input.accept(msg.text)

    async def submit(self, text: str) -> bool:
        """Send a message or run a command; False if the app cannot take it now."""
        if not self.can_start():
            return False
        try:
            parsed = parse_input(text)
        except UserError as e:  # shown as the keeper's events are, in the turn's order
            refusal = Error(str(e))
            self.start_turn(lambda: iter((refusal,)), "command")
            return True
        if isinstance(parsed, Command):
            return self.command(parsed)
        text = parsed
        await self.transcript.add_user(text)
        self.mark_attached()
        self.sent = text
        self.start_turn(partial(self.keeper.send, text), "send")
        return True

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """On the error screen the chat's keys do nothing: the footer leaves them out."""
        if isinstance(self.screen, ErrorScreen) and action in CHAT_ACTIONS:
            return False
        return True

    def action_themes(self, name: str = "") -> None:
        """`/theme` alone: Textual's theme picker; `/theme NAME`: that theme, or a line listing them."""
        if not name:
            self.action_change_theme()
        elif name in self.available_themes:
            self.theme = name
            self.notify(f"Theme {name}. Put theme = \"{name}\" in the config file to keep it.")
        else:
            self.notify(f"/theme: no theme {name!r}; themes: {', '.join(sorted(self.available_themes))}",
                        severity="error")

    def command(self, cmd: Command) -> bool:
        """A command the screen serves itself (its table entry names the action) runs here; the
        rest go to the keeper."""
        if cmd.spec.tui:
            getattr(self, f"action_{cmd.spec.screen}")(cmd.arg)
        elif cmd.spec.screen and not cmd.arg:
            getattr(self, f"action_{cmd.spec.screen}")()
        else:
            self.start_turn(partial(self.keeper.run, cmd), "command")
        return True

    def can_start(self) -> bool:
        """One turn at a time on the one session: say why not, and refuse."""
        if self.session is None:
            self.notify("The model is still loading.", severity="warning")
            return False
        if self.busy:
            self.notify("The model is still writing: press Esc to stop it first.", severity="warning")
            return False
        return True

    def start_turn(self, events: Callable[[], Iterator[Event]], kind: str) -> None:
        self.busy, self.turn_kind = True, kind
        self.watch_start()
        self.panel_timer.resume()
        self.gate = Gate()
        self.run_turn(events, self.gate)

    @work(thread=True, exclusive=True, group="turn", exit_on_error=False)
    def run_turn(self, events: Callable[[], Iterator[Event]], gate: Gate) -> None:
        pump(events(), self.post_message, gate)

    # --- session events ----------------------------------------------------------------
    async def on_text_batch(self, msg: TextBatch) -> None:
        self.batches += 1
        self.watch_end()  # the first text: the prefill is over
        await (await self.transcript.reply()).write(msg.text, msg.thinking)
        self.call_after_refresh(self.gate.drawn)

    async def on_session_event(self, msg: SessionEvent) -> None:
        ev, t = msg.event, self.transcript
        if not isinstance(ev, Prefilling):
            self.watch_end()  # the prefill is over (or a trim's own progress shows it)
        self.panel.show_progress(ev)  # a re-prefill (trim or /model): its progress row
        match ev:
            case ToolCall():
                await (await t.reply()).add_tool_call(ev)
            case TurnStats():
                await (await t.reply()).finish(ev.stop, len(ev.tool_calls))
                self.panel.show_turn(ev)
            case CacheState():
                await self.show_cache_state(ev)
            case Trimmed():
                t.mark_dropped(ev.dropped_exchanges)
                await t.notice(f"Context full: dropped the {ev.dropped_exchanges} oldest exchange(s) and "
                               f"re-prefilled {ev.reprefilled_tokens} tokens in {human_ms(ev.reprefill_ms)}.",
                               "warning")
            case Info():
                await t.notice(ev.text)
            case Error():
                await self.show_error(ev)
            case Quit():
                self.action_quit()
            case Copied():
                copy_text(self, ev.text, f"reply {ev.reply} of {ev.of}")
            case Restored():  # a stored chat is now the session's (on its own model, maybe)
                self.show_markers()
                await self.show_history()
                self.panel.clear_turns()
                await t.notice(f"Opened chat #{ev.chat} {ev.title}: {ev.line}.", "dim")
            case Branched():
                await self.show_branch(ev)
            case Saved():
                await t.notice(f"Saved as chat #{ev.chat} “{ev.title}” ({ev.snapshot_tokens} tokens in its "
                               "KV snapshot).", "dim")
            case _:  # a model switch's progress and outcome
                await self.show_model_event(ev)
        if isinstance(ev, Restored) and self.keeper.restored:
            self.panel.show_restore(self.keeper.restored.line)
        elif isinstance(ev, Trimmed) or (isinstance(ev, CacheState) and ev.event in ("reset", "system")) \
                or self.cuts_restore(ev):
            self.panel.show_restore("")
        self.show_chat()
        self.refresh_panel()

    def cuts_restore(self, ev: Event) -> bool:
        """An /undo or /retry that rewound the cache below what the stored chat's restore gave
        back: the restore line would describe K/V that is gone (a trim recomputes all of it)."""
        r = self.keeper.restored
        return isinstance(ev, CacheState) and r is not None and ev.cache_seqlens < r.cache_seqlens

    def show_markers(self) -> None:
        tools, tok = self.session.template.tool_tokens or {}, self.session.tok
        self.transcript.markers = {name: tok.decode([i]) for name, i in tools.items()}

    def show_chat(self) -> None:
        """The header names the model and, once it is stored, the chat."""
        k = self.keeper
        chat = f" — chat #{k.chat_id} {k.title or ''}".rstrip() if k is not None and k.chat_id is not None else ""
        self.sub_title = visible(self.session.lm.name + chat)

    async def show_cache_state(self, ev: CacheState) -> None:
        t = self.transcript
        if ev.event in ("reset", "system"):
            await t.clear()
            self.panel.clear_turns()
            await t.notice(ev.detail or "New chat: the cache is empty.", "dim")
        elif ev.event == "retry":
            await t.remove_last_reply()
        elif ev.event == "undo":
            await t.remove_last_exchange()
            self.panel.undo_turns(self.session.turns)
        elif ev.event == "undone":  # the model failed mid-turn: the session is as before it
            await self.show_history()
            if self.turn_kind == "send" and not self.input.text:
                self.input.give_back(self.sent)  # the message is not lost: edit or send it again

    async def show_history(self) -> None:
        """Redraw the transcript from the session's exchanges."""
        await self.transcript.clear()
        for ex in self.session.archive + self.session.exchanges:
            thinking, reply = self.session.template.split_thinking(ex.reply)
            await self.transcript.add_exchange(ex.user, reply, ex.tool_calls, thinking, ex.stop)
        self.transcript.mark_dropped(len(self.session.archive))  # out of the context: dimmed, as when trimmed

    async def show_error(self, ev: Error) -> None:
        if self.turn_kind == "send" and (text := await self.transcript.drop_unanswered()) is not None:
            if not self.input.text:
                self.input.give_back(text)  # refused: give the message back to edit
        await self.transcript.notice(ev.message, "error")

    def on_turn_finished(self, msg: TurnFinished) -> None:
        if self.quitting:
            self.exit()
        self.busy = False
        self.watch_end()
        self.inputs_done += 1
        self.panel_timer.pause()
        self.refresh_panel()
        self.show_attached()
        if self.session is not None:
            self.show_chat()  # the keeper may detach (/reset) after its last event: name the chat as it ended

    def refresh_panel(self) -> None:
        if self.session is not None:
            stats = self.session.stats()
            self.panel.show_stats(stats, read_memory(stats["device"]))
            self.watch(stats)

    # --- actions -----------------------------------------------------------------------
    def action_stop(self) -> None:
        if self.busy and self.session is not None:
            self.session.cancel()
        else:
            self.cancel_edit()

    def action_chats(self) -> None:
        """The stored chats: open one (its cache comes back from its snapshot), or start a new one."""
        if isinstance(self.screen, ChatsScreen) or not self.can_start():
            return
        if self.keeper.store is None:
            self.notify(f"Chats are not kept in this session ({self.keeper.why_no_store}).", severity="warning")
            return
        self.push_screen(ChatsScreen(self.keeper), self.chats_closed)

    async def chats_closed(self, action: ChatAction | None) -> None:
        self.show_chat()
        if action is None or not self.can_start():  # a turn started behind the screen (the palette)
            return
        if action.kind == "open" and action.chat_id != self.keeper.chat_id:
            self.start_turn(partial(self.keeper.run, Command.of("/load", str(action.chat_id))), "command")
        elif action.kind == "new":
            self.start_turn(partial(self.keeper.run, Command.of("/reset")), "command")

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_quit(self) -> None:
        """While the model writes: stop it and quit once the turn has ended, so the partial reply
        is committed to the store first. A second Ctrl+Q quits at once."""
        if self.busy and self.session is not None and not self.quitting:
            self.quitting = True
            self.session.cancel()
            return
        self.exit()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for spec in TABLE:
            help = spec.help_for(True) + (f" ({spec.key})" if spec.key else "")
            yield SystemCommand(spec.usage, help, partial(self.palette_command, spec))
        presets = self.keeper.presets.all() if self.keeper is not None else {}
        for name, text in sorted(presets.items()):
            yield SystemCommand(f"Preset: {name}", f"a new chat with this system prompt: {' '.join(text.split())[:80]}",
                                partial(self.submit, f"/preset {name}"))
        yield SystemCommand("Chats", "the stored chats: open, rename, delete, new (Ctrl+O)", self.action_chats)
        yield SystemCommand("Switch model…", "the default model, the pulled ones, recent ones: the chat carries over",
                            self.action_models)

    async def palette_command(self, spec: CommandSpec) -> None:
        if spec.needs_arg:
            self.input.give_back(spec.name + " ")
        else:
            await self.submit(spec.name)

    # --- copy and attach (chatapp/tui/clipboard.py, chatapp/chat/attach.py) ---------------
    async def action_copy_reply(self) -> None:
        """Ctrl+Y: the last reply to the clipboard, through /copy (the session knows its text)."""
        if not isinstance(self.screen, (HelpScreen, ChatsScreen, ErrorScreen)):
            await self.submit("/copy")

    def on_chat_input_large_paste(self, msg: ChatInput.LargePaste) -> None:
        """Too large to edit in the box without every key lagging: it goes with the next message."""
        if self.can_start():
            self.start_turn(partial(self.keeper.attach_text, msg.text), "command")

    def show_attached(self) -> None:
        """The input box's border names the files waiting for the next message."""
        att = self.session.attached if self.session is not None else None
        parts = [f"attached: {att.summary}" if att and att.files else "", self.input_tokens()]
        self.input.border_subtitle = visible(" · ".join(p for p in parts if p))

    def mark_attached(self) -> None:
        """The message on screen names the files it carries (the session adds them when it sends)."""
        if files := self.session.attached.files:
            self.transcript.exchanges[-1].user.border_subtitle = visible("with " + ", ".join(f.name for f in files))
