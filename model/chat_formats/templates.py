"""Chat formats: how a conversation becomes tokens, one piece at a time.

A format never renders the whole history. The session asks for just the tokens a new turn
adds, which is what lets each turn cost only its new tokens. Rendering piece by piece must
equal the model's official Jinja template rendering the whole transcript at once:
model/chat_formats/recognize.py checks that for a model's own template before using a
format, and tests/test_chat_formats.py checks it against the vendors' templates
(docs/chat-formats.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from model.tokenizers.tokenizer import Tokenizer


def encode_rendered(tokenizer: Tokenizer, text: str) -> list[int]:
    """Tokens of text a template rendered, special-token strings included: what a Hugging Face
    tokenizer makes of `apply_chat_template`'s output. Never for user text (Tokenizer.encode)."""
    return tokenizer.encode_rendered(text)


@dataclass
class ChatTemplate:
    """Token pieces of a family's chat format. Subclasses fill in the pieces."""

    tokenizer: Tokenizer
    default_system: str = ""
    stop_ids: set[int] = field(default_factory=set)
    # (open, close) tokens of a reply's thinking block; None for formats that do not think.
    think_ids: tuple[int, int] | None = field(default=None, init=False)
    # nanochat's calculator; None for families without tools.
    tool_tokens: dict[str, int] | None = field(default=None, init=False)

    def start(self, system: str) -> list[int]:
        """Tokens that open a conversation (BOS, system prompt)."""
        raise NotImplementedError

    def user_turn(self, text: str, system: str = "") -> list[int]:
        """A user message followed by the assistant header: what the model answers after.
        `system` comes with the conversation's first user message only: a family with no
        system role (nanochat) folds it into that message; the others have it in start()."""
        raise NotImplementedError

    def end_reply(self) -> list[int]:
        """Tokens that close an assistant reply. The stop token the model sampled is never
        kept as is: the reply is always closed with these, so a reply cut short (length,
        Esc) and one that ended on EOS leave the same well-formed transcript."""
        raise NotImplementedError

    def fits_start(self, tokens: list[int], system: str) -> bool:
        """Whether stored opening tokens are this format's start (a reopened chat)."""
        return tokens == self.start(system)

    def history_text(self, reply: str) -> str:
        """A reply's text as the official template renders it once a later user message
        follows it; the session re-encodes a reply whose history text differs."""
        return reply

    def as_history(self, reply: list[int]) -> list[int] | None:
        """A finished reply's tokens once a user message follows; None when unchanged."""
        text = self.tokenizer.decode(reply)
        hist = self.history_text(text)
        return None if hist == text else encode_rendered(self.tokenizer, hist)

    def split_thinking(self, reply: str) -> tuple[str, str]:
        """(thinking, answer) of a reply's text: formats that do not think have no thinking."""
        return "", reply

    def conversation(self, system: str, replies: list[tuple[str, list[int]]], user: str) -> list[int]:
        """What the session's token list is after these exchanges (each user message with the
        reply token ids the model generated) and one more user message, built the way the
        session builds it, turn by turn."""
        tokens = self.start(system)
        for i, (text, reply) in enumerate(replies):
            tokens += self.user_turn(text, "" if i else system)
            tokens += (self.as_history(reply) or reply) + self.end_reply()
        return tokens + self.user_turn(user, "" if replies else system)


@dataclass
class ChatML(ChatTemplate):
    """<|im_start|>role\\ntext<|im_end|>\\n — SmolLM2, Qwen2.5 and most HF chat models."""

    bos: list[int] = field(default_factory=list)
    # The template puts a system message in every chat (SmolLM2's and Qwen2.5's default), so
    # an empty prompt is an empty system message, as the template renders one.
    system_always: bool = False

    def __post_init__(self):
        self.im_start = self.tokenizer.token("<|im_start|>")
        self.im_end = self.tokenizer.token("<|im_end|>")
        self.stop_ids = {self.im_end} | ({self.tokenizer.eos_id} if self.tokenizer.eos_id is not None else set())
        self.nl = self.tokenizer.encode("\n")

    def _message(self, role: str, text: str) -> list[int]:
        return [self.im_start, *self.tokenizer.encode(f"{role}\n{text}"), self.im_end, *self.nl]

    def start(self, system: str) -> list[int]:
        return list(self.bos) + (self._message("system", system) if system or self.system_always else [])

    def user_turn(self, text: str, system: str = "") -> list[int]:
        return self._message("user", text) + [self.im_start, *self.tokenizer.encode("assistant\n")]

    def end_reply(self) -> list[int]:
        return [self.im_end, *self.nl]


@dataclass
class Qwen3(ChatML):
    """ChatML whose replies open with <think>…</think>. Its template drops the thinking of
    replies that a later user message follows, so the session re-encodes those replies."""

    def __post_init__(self):
        super().__post_init__()
        self.think_ids = (self.tokenizer.token("<think>"), self.tokenizer.token("</think>"))

    def history_text(self, reply: str) -> str:
        # The template's own expression: content.split('</think>')[-1].lstrip('\n').
        return reply.split("</think>")[-1].lstrip("\n") if "</think>" in reply else reply

    def split_thinking(self, reply: str) -> tuple[str, str]:
        if "</think>" in reply:
            head = reply.split("</think>")[0].rstrip("\n")
            return head.split("<think>")[-1].strip("\n"), self.history_text(reply)
        if reply.lstrip().startswith("<think>"):  # cut short while thinking: no answer yet
            return reply.lstrip().removeprefix("<think>").strip("\n"), ""
        return "", reply


@dataclass
class NanochatFormat(ChatTemplate):
    """<|bos|><|user_start|>…<|user_end|><|assistant_start|>…<|assistant_end|>."""

    def __post_init__(self):
        t = self.tokenizer.token
        self.bos_id, self.user_start, self.user_end = t("<|bos|>"), t("<|user_start|>"), t("<|user_end|>")
        self.assistant_start, self.assistant_end = t("<|assistant_start|>"), t("<|assistant_end|>")
        self.stop_ids = {self.assistant_end, self.bos_id}
        self.tool_tokens = {name: t(f"<|{name}|>") for name in
                            ("python_start", "python_end", "output_start", "output_end")}

    def start(self, system: str) -> list[int]:
        return [self.bos_id]

    def user_turn(self, text: str, system: str = "") -> list[int]:
        # nanochat has no system role: its render_conversation prepends a system message to
        # the first user message as "system\n\nuser", encoded as one text.
        text = f"{system}\n\n{text}" if system else text
        return [self.user_start, *self.tokenizer.encode(text), self.user_end, self.assistant_start]

    def end_reply(self) -> list[int]:
        return [self.assistant_end]


# Where a template's system block holds strftime_now(FORMAT) (Llama 3.2's "Today Date").
DATE = re.compile("\x00strftime:(.*?)\x00")


def strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@dataclass
class Llama3(ChatTemplate):
    """<|start_header_id|>role<|end_header_id|>\\n\\ntext<|eot_id|> — Llama 3.x instruct models."""

    # Text of the system block before the system prompt (3.1+: the knowledge and today's
    # dates); DATE marks a date filled in when a chat starts.
    preamble: str = ""
    system_always: bool = False  # 3.1+ write the system block even with no system prompt
    strftime: Callable[[str], str] = strftime_now

    def __post_init__(self):
        t = self.tokenizer.token
        self.bot, self.sh, self.eh, self.eot = (t("<|begin_of_text|>"), t("<|start_header_id|>"),
                                                t("<|end_header_id|>"), t("<|eot_id|>"))
        self.stop_ids = {self.eot} | ({self.tokenizer.eos_id} if self.tokenizer.eos_id is not None else set())

    def _header(self, role: str) -> list[int]:
        return [self.sh, *self.tokenizer.encode(role), self.eh]

    def _block(self, role: str, text: str) -> list[int]:
        # The blank line after the header and the text are one run of text to its tokenizer.
        return [*self._header(role), *self.tokenizer.encode("\n\n" + text), self.eot]

    def start(self, system: str, date: str | None = None) -> list[int]:
        if not (system or self.system_always):
            return [self.bot]
        preamble = DATE.sub(lambda m: date or self.strftime(m.group(1)), self.preamble)
        return [self.bot, *self._block("system", preamble + system.strip())]

    def fits_start(self, tokens: list[int], system: str) -> bool:
        """A chat keeps the date it started on: any date where the preamble has one."""
        parts = DATE.split(self.preamble)
        if len(parts) == 1:
            return tokens == self.start(system)
        pattern = "".join(re.escape(p) if i % 2 == 0 else "(.+?)" for i, p in enumerate(parts))
        m = re.search(pattern, self.tokenizer.decode(tokens))
        return m is not None and tokens == self.start(system, m.group(1))

    def user_turn(self, text: str, system: str = "") -> list[int]:
        # The template trims every message (`| trim`), the system prompt too (start).
        return [*self._block("user", text.strip()), *self._header("assistant"), *self.tokenizer.encode("\n\n")]

    def end_reply(self) -> list[int]:
        return [self.eot]

    def history_text(self, reply: str) -> str:
        return reply.strip()  # `message['content'] | trim`


@dataclass
class GemmaFormat(ChatTemplate):
    """<bos><start_of_turn>user\\ntext<end_of_turn>\\n<start_of_turn>model\\n — Gemma 3.

    Gemma has no system role: its template puts a system prompt at the start of the first user
    message, followed by a blank line, untrimmed; every message itself is trimmed."""

    system_always: bool = False   # no system block of its own, ever (what recognize.py probes)

    def __post_init__(self):
        t = self.tokenizer.token
        self.bos_id, self.sot, self.eot = t("<bos>"), t("<start_of_turn>"), t("<end_of_turn>")
        self.stop_ids = {self.eot} | ({self.tokenizer.eos_id} if self.tokenizer.eos_id is not None else set())
        self.nl = self.tokenizer.encode("\n")

    def start(self, system: str) -> list[int]:
        return [self.bos_id]

    def user_turn(self, text: str, system: str = "") -> list[int]:
        prefix = f"{system}\n\n" if system else ""
        return [self.sot, *self.tokenizer.encode(f"user\n{prefix}{text.strip()}"), self.eot, *self.nl,
                self.sot, *self.tokenizer.encode("model\n")]

    def end_reply(self) -> list[int]:
        return [self.eot, *self.nl]

    def history_text(self, reply: str) -> str:
        return reply.strip()  # `message['content'] | trim`
