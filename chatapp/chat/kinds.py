"""What each token of a reply is: answer, thinking, a tool call or a tool result.

The session knows it from the token ids (a template's thinking markers, nanochat's calculator
tokens), so the events say it (`TextDelta.kind`) and no face parses marker strings. Thinking
markers are structure, not text: their own text is never shown. A tool span keeps its markers
in its text, which is what the model wrote (a server sends it on as content; the TUI hides the
span by its kind and shows the `ToolCall` instead).

A reply known only as text (a stored chat reopened, a client's message list) has no token ids
any more: `stored_parts` finds the same marker tokens by their text and runs the same states.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chatapp.chat.events import TextDelta, TextKind

if TYPE_CHECKING:  # the TUI imports this module before its first frame: tiktoken must wait
    from model.chat_formats.templates import ChatTemplate
    from model.tokenizers.tokenizer import Tokenizer

TOOL_SPANS = (("python_start", "python_end", "tool_call"), ("output_start", "output_end", "tool_result"))


@dataclass
class Part:
    """A run of reply text of one kind."""

    kind: TextKind
    text: str


class KindTracker:
    """Walks a reply's tokens: `step(token)` says the token's kind and whether its text shows."""

    def __init__(self, template: ChatTemplate) -> None:
        self.think = tuple(template.think_ids or ())
        tools = template.tool_tokens or {}
        self.spans = {tools[a]: (tools[b], kind) for a, b, kind in TOOL_SPANS if a in tools and b in tools}
        self.kind: TextKind = "answer"
        self.closer: int | None = None   # inside a tool span: the token that ends it
        self.outside: TextKind = "answer"   # the kind a tool span returns to

    @property
    def markers(self) -> set[int]:
        return {*self.think, *self.spans, *(closer for closer, _ in self.spans.values())}

    def step(self, token: int) -> tuple[TextKind, bool]:
        if self.closer is not None:   # inside a tool span, its closing token included
            kind = self.kind
            if token == self.closer:
                self.closer, self.kind = None, self.outside
            return kind, True
        if token in self.think:
            self.kind = "thinking" if token == self.think[0] else "answer"
            return self.kind, False
        if token in self.spans:
            self.outside = self.kind
            self.closer, self.kind = self.spans[token]
            return self.kind, True
        return self.kind, True


class PartsBuilder:
    """A reply's parts as they stream: `add` joins runs of one kind."""

    def __init__(self) -> None:
        self.parts: list[Part] = []

    def add(self, kind: TextKind, text: str) -> None:
        if not text:
            return
        if self.parts and self.parts[-1].kind == kind:
            self.parts[-1].text += text
        else:
            self.parts.append(Part(kind, text))


class ReplyText:
    """A reply's tokens into `TextDelta`s of one kind each, and its parts. A kind's text is
    flushed before the next kind starts, so a split UTF-8 sequence never crosses kinds."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer) -> None:
        self.tracker = KindTracker(template)
        self.decoder = tokenizer.stream_decoder()
        self.kind: TextKind = "answer"
        self.parts = PartsBuilder()

    def push(self, token: int) -> Iterator[TextDelta]:
        kind, shown = self.tracker.step(token)
        if kind != self.kind:
            yield from self.flush()
            self.kind = kind
        if shown and (text := self.decoder.push(token)):
            yield self._delta(text)

    def flush(self) -> Iterator[TextDelta]:
        if tail := self.decoder.flush():
            yield self._delta(tail)

    def _delta(self, text: str) -> TextDelta:
        self.parts.add(self.kind, text)
        return TextDelta(text, self.kind)


def stored_parts(template: ChatTemplate, tokenizer: Tokenizer | None, reply: str) -> list[Part]:
    """The parts of a reply known only as text: the marker tokens found by their text."""
    tracker = KindTracker(template)
    by_text = {tokenizer.decode([i]): i for i in tracker.markers} if tokenizer is not None else {}
    out = PartsBuilder()
    if not by_text:
        out.add("answer", reply)
        return out.parts
    pos = 0
    for m in re.finditer("|".join(map(re.escape, sorted(by_text, key=len, reverse=True))), reply):
        out.add(tracker.kind, reply[pos:m.start()])
        kind, shown = tracker.step(by_text[m.group()])
        out.add(kind, m.group() if shown else "")
        pos = m.end()
    out.add(tracker.kind, reply[pos:])
    return out.parts


def of_kind(parts: list[Part], *kinds: TextKind) -> Iterator[str]:
    return (p.text for p in parts if p.kind in kinds)


def thinking_text(parts: list[Part]) -> str:
    return "".join(of_kind(parts, "thinking")).strip("\n")


def reply_text(parts: list[Part]) -> str:
    """The reply without its thinking, tool spans kept (TurnStats.reply, what a server sends):
    the newlines after a thinking block are part of the block's layout, not of the answer."""
    text = "".join(of_kind(parts, "answer", "tool_call", "tool_result"))
    return text.lstrip("\n") if any(p.kind == "thinking" for p in parts) else text


def answer_text(parts: list[Part]) -> str:
    """The answer alone, as the transcript shows it and /copy copies it."""
    return "".join(of_kind(parts, "answer")).strip("\n")
