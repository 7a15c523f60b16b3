"""The scrolling conversation: user messages, streamed Markdown replies, tool calls, notices.

The transcript mirrors the session's exchanges one to one (so /retry and /undo can remove
the right widgets), but it holds no conversation logic: the app tells it what happened.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Collapsible, ProgressBar, Static

from chatapp.chat.events import TextKind, ToolCall
from chatapp.chat.kinds import Part
from chatapp.tui.markdown import ReplyMarkdown
from chatapp.tui.visible import visible

STOP_NOTES = {"cancel": "stopped (Esc)", "length": "cut at max_new_tokens", "context": "cut: the context is full",
              "error": "cut off (the server failed)"}


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        super().__init__(Content(visible(text)))  # plain text: what the user typed, not markup
        self.text = text
        self.border_title = "you"


class ToolCallView(Static):
    def __init__(self, call: ToolCall) -> None:
        result = call.result if call.result is not None else "(invalid expression, no output)"
        super().__init__(Content.assemble(("calculator  ", "bold"), visible(call.expr), "  →  ",
                                          (visible(result), "bold")))
        self.call = call


class Notice(Static):
    """A one-line info or error note in the transcript."""

    def __init__(self, text: str, kind: str = "info") -> None:
        super().__init__(Content(visible(text)), classes=kind)
        self.text = text


class LoadStatus(Vertical):
    """Shown while the model loads: a line of text, and a bar once a pull reports a fraction."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.note = Notice(text, "dim")
        self.bar = ProgressBar(total=1.0, show_eta=False)
        self.bar.display = False

    def compose(self) -> ComposeResult:
        yield self.note
        yield self.bar

    def show(self, text: str, fraction: float | None) -> None:
        self.note.update(Content(visible(text)))
        if fraction is not None:
            self.bar.display = True
            self.bar.update(progress=fraction)


class Thinking(Collapsible):
    """A reply's thinking block: dimmed plain text, open while the model thinks, folded once
    the answer starts (a click or Enter on the title opens it again)."""

    def __init__(self) -> None:
        self.body = Static("", classes="thinking")
        super().__init__(self.body, title="thinking", collapsed=False)
        self.parts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.parts).strip("\n")

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.body.update(Content(visible(self.text)))


class ReplyPiece:
    """One Markdown block of a reply (a tool call starts a new one)."""

    def __init__(self, widget: ReplyMarkdown) -> None:
        self.widget = widget
        self.parts: list[str] = []

    async def write(self, text: str) -> None:
        """Append and wait until the widgets are updated: the batch's draw time (bridge.Gate)
        must include the parse, which for a long list re-reads the whole list every time."""
        self.parts.append(text)
        await self.widget.add(visible(text))


class Reply(Vertical):
    """An assistant reply: Markdown streamed in place, then one full update at the end."""

    def __init__(self, title: str = "assistant") -> None:
        super().__init__()
        self.segments: list[ReplyPiece] = []
        self.open: ReplyPiece | None = None
        self.thinking: Thinking | None = None
        self.finished = False
        self.border_title = title

    @property
    def text(self) -> str:
        """The visible reply text so far, tool spans left out."""
        return "".join("".join(s.parts) for s in self.segments)

    async def write(self, text: str, kind: TextKind = "answer") -> None:
        if kind == "thinking":
            if self.thinking is None:
                self.thinking = Thinking()
                await self.mount(self.thinking)
            self.thinking.add(text)
            return
        if kind != "answer":  # a tool span: the ToolCall event shows it; the answer goes on in a new block
            self.open = None
            return
        if self.thinking is not None and text.strip():
            self.thinking.collapsed = True  # the answer has started
        if not self.segments:
            text = text.lstrip("\n")  # the blank lines after a thinking block are its layout
        if self.open or text.strip():
            await (await self._open_segment()).write(text)

    async def add_tool_call(self, call: ToolCall) -> None:
        self.open = None
        await self.mount(ToolCallView(call))

    async def finish(self, stop: str, tool_calls: int = 0) -> None:
        """The final full update: each block re-rendered once from its whole text."""
        self.open = None
        for seg in self.segments:
            await seg.widget.replace(visible("".join(seg.parts)))
        if not self.segments and not tool_calls and self.thinking is None:
            await self.mount(Notice("(empty reply)", "dim"))
        if note := STOP_NOTES.get(stop):
            self.border_subtitle = note
        self.finished = True

    async def _open_segment(self) -> ReplyPiece:
        if self.open is None:
            widget = ReplyMarkdown()
            await self.mount(widget)
            self.open = ReplyPiece(widget)
            self.segments.append(self.open)
        return self.open


class ExchangeView:
    def __init__(self, user: UserMessage) -> None:
        self.user = user
        self.reply: Reply | None = None


class Transcript(VerticalScroll, can_focus=True):
    """Anchored to the bottom while replies stream, until the user scrolls up."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.exchanges: list[ExchangeView] = []

    def on_mount(self) -> None:
        self.anchor()

    def next_number(self) -> int:
        """The number the next message gets: the one /edit N and /copy N take (trimmed ones count)."""
        return self.trimmed() + len(self.exchanges) + 1

    async def add_user(self, text: str) -> None:
        ex = ExchangeView(UserMessage(text))
        ex.user.border_title = f"you #{self.next_number()}"
        self.exchanges.append(ex)
        await self.mount(ex.user)

    def open_reply(self) -> Reply | None:
        """The reply being written, if any."""
        ex = self.exchanges[-1] if self.exchanges else None
        return ex.reply if ex and ex.reply and not ex.reply.finished else None

    async def reply(self) -> Reply:
        """The reply being written, started on first use."""
        if (r := self.open_reply()) is not None:
            return r
        r = Reply(f"assistant #{self.trimmed() + len(self.exchanges)}")
        self.exchanges[-1].reply = r
        await self.mount(r)
        return r

    async def add_exchange(self, user: str, parts: list[Part], tool_calls: list[ToolCall], stop: str = "end") -> None:
        """A finished exchange at once (a restored chat): its reply by kind, then its tool calls,
        its stop reason's label (stored with the reply) on its border."""
        await self.add_user(user)
        r = await self.reply()
        thinking = "".join(p.text for p in parts if p.kind == "thinking").strip("\n")
        if thinking:
            await r.write(thinking, "thinking")
        for p in parts:
            if p.kind != "thinking":
                await r.write(p.text, p.kind)
        for call in tool_calls:
            await r.add_tool_call(call)
        await r.finish(stop or "end", len(tool_calls))

    async def notice(self, text: str, kind: str = "info") -> None:
        await self.mount(Notice(text, kind))

    async def drop_unanswered(self) -> str | None:
        """The session refused the last message: take it back off the screen."""
        if self.exchanges and self.exchanges[-1].reply is None:
            ex = self.exchanges.pop()
            await ex.user.remove()
            return ex.user.text
        return None

    async def remove_last_reply(self) -> None:
        if self.exchanges and (r := self.exchanges[-1].reply) is not None:
            self.exchanges[-1].reply = None
            await r.remove()

    async def remove_last_exchange(self) -> None:
        if self.exchanges:
            ex = self.exchanges.pop()
            await ex.user.remove()
            if ex.reply is not None:
                await ex.reply.remove()

    def mark_trimmed(self, n: int) -> None:
        """The oldest n exchanges left the context: they stay visible, dimmed."""
        for ex in self.exchanges[:n]:
            for w in (ex.user, ex.reply):
                if w is not None:
                    w.add_class("trimmed")
        del self.exchanges[:n]

    async def clear(self) -> None:
        self.exchanges.clear()
        await self.remove_children()

    # --- /edit -------------------------------------------------------------------------
    def trimmed(self) -> int:
        """Exchanges shown dimmed above the context: message numbers count them (Session.turns)."""
        return len(self.query("UserMessage.trimmed"))

    def editable(self) -> list[tuple[int, str]]:
        """(number as shown, text) of each user message /edit can take: those in the context."""
        base = self.trimmed()
        return [(base + i + 1, ex.user.text) for i, ex in enumerate(self.exchanges)]

    def highlight(self, number: int | None) -> None:
        """Mark message `number` (None: none) as the one the input box points at."""
        base = self.trimmed()
        for i, ex in enumerate(self.exchanges):
            ex.user.set_class(base + i + 1 == number, "selected")
            if base + i + 1 == number:
                self.scroll_to_widget(ex.user, animate=False)

    async def cut_from(self, number: int) -> None:
        """/edit: message `number` and everything after it leave the screen, notices and /stats
        lines included: they described a conversation that no longer exists."""
        k = max(number - 1 - self.trimmed(), 0)
        if k < len(self.exchanges):
            children = list(self.children)
            await self.remove_children(children[children.index(self.exchanges[k].user):])
        del self.exchanges[k:]
