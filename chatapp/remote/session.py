"""`--backend URL`: the conversation held here as messages, each reply written by an
OpenAI-compatible server (chatapp/remote/client.py). The faces get the same events as from
the in-process session: text deltas, a `TurnStats` with what the server reported (its prompt
tokens, the cached ones, TTFT and tokens/s measured here), and one-line errors.

The server owns the cache, so commands that move it (/retry, /undo, /edit, /system, /reset)
only change the message list: the next request sends it whole and the server's own prefix
matching decides what it reuses. A failure mid-reply keeps the partial reply in the chat.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from chatapp.chat.attach import Attachments, Budget, file_command, paste_command
from chatapp.chat.clip import pick_reply
from chatapp.chat.commands import help_text, is_text
from chatapp.chat.edit import parse_edit
from chatapp.chat.events import (
    CacheState,
    Copied,
    Error,
    Event,
    Info,
    Quit,
    SessionFigures,
    TextDelta,
    ToolCall,
    TurnStats,
)
from chatapp.chat.figures import stats_text
from chatapp.chat.kinds import Part, PartsBuilder
from chatapp.chat.memory import read_memory
from chatapp.chat.settings import Settings, set_command
from chatapp.remote.client import OpenAIClient
from chatapp.remote.wire import Figures, RemoteError
from model.errors import UserError
from model.escapes import escape_controls

CHARS_PER_TOKEN = 4  # only to bound a /file attachment: the server's tokenizer is not here
MOST_TOKENS = 1 << 17  # a reply's bound when neither the user's max_new_tokens nor the server's context says


@dataclass
class RemoteExchange:
    user: str
    reply: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop: str = ""  # not stored for a remote chat: a reopened one shows no stop labels
    parts: list[Part] = field(default_factory=list)  # the reply by kind as it streamed ([] when reopened)


class PlainFormat:
    """What the faces ask a chat format for, when the server holds the real one."""

    tool_tokens = None
    think_ids = None

    @staticmethod
    def split_thinking(reply: str) -> tuple[str, str]:
        return "", reply


@dataclass
class Served:
    name: str          # what the title bar and the panel show


class RemoteSession:
    def __init__(self, client: OpenAIClient, model: str, settings: Settings | None = None, context: int = 0,
                 server: str = "server"):
        self.client, self.model, self.context = client, model, context
        self.server = escape_controls(server)  # what the server calls itself: shown escaped, as its model
        self.lm = Served(escape_controls(f"{model} @ {client.base}"))  # the server names its model: shown escaped
        self.template, self.tokenizer = PlainFormat(), None
        self.settings = settings or Settings()
        self.cancel_flag = threading.Event()
        self.exchanges: list[RemoteExchange] = []
        self.trimmed: list[RemoteExchange] = []  # nothing is trimmed here: the server keeps the context
        self.turn_stats: list[TurnStats] = []
        self.attached = Attachments()
        self.last: TurnStats | None = None

    @property
    def system(self) -> str:
        return self.settings.system or ""

    @property
    def turns(self) -> int:
        return len(self.exchanges)

    def cancel(self) -> None:
        self.cancel_flag.set()

    def messages(self) -> list[dict]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for ex in self.exchanges:
            msgs.append({"role": "user", "content": ex.user})
            if ex is not self.exchanges[-1] or ex.reply:
                msgs.append({"role": "assistant", "content": ex.reply})
        return msgs

    def state(self, event: str, detail: str = "") -> CacheState:
        pos = self.last.cache_seqlens if self.last else 0
        return CacheState(event, pos, self.context, pos, detail)

    # --- the turn ----------------------------------------------------------------
    def send(self, text: str) -> Iterator[Event]:
        text = text.strip()
        if not text:
            yield Error("empty message")
            return
        if not is_text(text):
            yield Error("message is not valid Unicode (it holds a lone surrogate); nothing was sent")
            return
        self.exchanges.append(RemoteExchange(self.attached.wrap(text)))
        ok = yield from self._reply()
        if ok:
            self.attached.clear()

    def _reply(self) -> Iterator[Event]:
        """Ask the server for the last exchange's reply. A failure before any text takes the
        exchange back (the TUI returns the message to the input box); after some text, the
        partial reply stays. Returns whether a reply (whole or partial) was kept."""
        ex, s = self.exchanges[-1], self.settings
        ex.reply = ""
        self.cancel_flag.clear()
        body = {"model": self.model, "messages": self.messages(), "temperature": s.temperature,
                "top_p": s.top_p}
        body |= {"max_tokens": s.max_new_tokens} if s.max_new_tokens else {}  # none: the server's own limit
        body |= {"seed": s.seed} if s.seed is not None else {}
        body |= {"top_k": s.top_k} if s.top_k else {}  # not OpenAI's: sent only when set
        fig, parts, stop, error = Figures(), PartsBuilder(), "end", ""
        try:
            most = s.max_new_tokens or self.context or MOST_TOKENS  # enforced here too: a server may ignore it
            for d in self.client.chat(body, fig, most):  # the server's content is the answer: no token ids here
                delta = TextDelta(d.text, "thinking" if d.thinking else "answer")
                parts.add(delta.kind, delta.text)
                yield delta
                if self.cancel_flag.is_set():
                    stop = "cancel"
                    break
        except RemoteError as e:
            stop, error = "error", str(e)
        ex.parts = parts.parts
        ex.reply = "".join(p.text for p in ex.parts if p.kind == "answer")
        if stop == "error" and not ex.reply:
            self.exchanges.pop()
            yield self.state("undone")
            yield Error(error)
            return False
        if fig.finish == "length":
            stop = "length"
        yield self._stats(ex, fig, stop)
        if error:
            yield Error(error)
        return True

    def _stats(self, ex: RemoteExchange, f: Figures, stop: str) -> TurnStats:
        cached = f.cached_tokens or 0
        st = TurnStats(turn=self.turns, user=ex.user, reply=ex.reply, prefill_tokens=max(f.prompt_tokens - cached, 0),
                       cached_before=cached, cache_seqlens=f.prompt_tokens + f.completion_tokens,
                       capacity=self.context, decode_tokens=f.completion_tokens, ttft_ms=f.ttft_ms,
                       tokens_per_s=f.tokens_per_s, stop=stop, kv_bytes_used=0, kv_bytes_allocated=0,
                       backend="remote", rss_bytes=read_memory("remote").rss)
        self.turn_stats.append(st)
        self.last = st
        return st

    # --- commands (chatapp/chat/commands.py's table names these; RemoteKeeper.run dispatches) ---
    def reset_chat(self, _arg: str = "") -> Iterator[Event]:
        self.exchanges, self.turn_stats, self.last = [], [], None
        yield self.state("reset")

    def retry(self, _arg: str = "") -> Iterator[Event]:
        if not self.exchanges:
            raise UserError("/retry: nothing to retry yet")
        yield self.state("retry")
        yield from self._reply()

    def undo(self, _arg: str = "") -> Iterator[Event]:
        if not self.exchanges:
            raise UserError("/undo: nothing to undo")
        self.exchanges.pop()
        self.turn_stats = [st for st in self.turn_stats if st.turn <= self.turns]  # its figures go with it
        yield self.state("undo")

    def edit(self, arg: str) -> Iterator[Event]:
        """/edit N TEXT: the chat goes on from message N with TEXT (no branch is stored here)."""
        n, text = parse_edit(arg)
        if not 1 <= n <= len(self.exchanges):
            raise UserError(f"/edit: there is no message {n} (the chat has {len(self.exchanges)})")
        del self.exchanges[n - 1:]
        self.turn_stats = [st for st in self.turn_stats if st.turn <= self.turns]
        yield self.state("edit", f"rewound to message {n}")
        self.exchanges.append(RemoteExchange(text))
        yield from self._reply()

    def set_system(self, text: str) -> Iterator[Event]:
        self.settings.system = text
        self.exchanges, self.turn_stats, self.last = [], [], None
        yield self.state("system", "system prompt set; new chat started")

    def change_settings(self, arg: str) -> Iterator[Event]:
        yield Info(*set_command(self.settings, arg))

    def show_stats(self, _arg: str = "") -> Iterator[Event]:
        d = self.stats()
        yield Info(stats_text(d), d)

    def show_help(self, _arg: str = "") -> Iterator[Event]:
        yield Info(help_text())

    def quit(self, _arg: str = "") -> Iterator[Event]:
        yield Quit()

    def copy_reply(self, arg: str) -> Iterator[Event]:
        n = pick_reply(arg, len(self.exchanges))
        text = self.exchanges[n - 1].reply.strip("\n")
        if not text.strip():
            raise UserError(f"/copy: reply {n} has no text to copy")
        yield Copied(n, len(self.exchanges), text)

    def reply_parts(self, ex: RemoteExchange) -> list[Part]:
        return ex.parts or [Part("answer", ex.reply)]

    def attach_file(self, arg: str) -> Iterator[Event]:
        yield from file_command(self.attached, arg, self.budget())

    def attach_text(self, text: str) -> Iterator[Event]:
        yield paste_command(self.attached, text, self.budget())

    def budget(self) -> Budget:
        room = (self.context or 32768) - (self.last.cache_seqlens if self.last else 0)
        return Budget(lambda body: len(body) // CHARS_PER_TOKEN + 1, room,
                      "the server's context is the limit (an estimate: its tokenizer is not here)")

    def figures(self) -> SessionFigures:
        return SessionFigures(self.stats(), read_memory("remote"), list(self.turn_stats),
                              [st.prefill_tokens for st in self.turn_stats])

    def stats(self) -> dict:
        last = self.last
        # what the server reports, no more: it tells no cache shape, dtype or K/V bytes (the panel
        # hides those rows), and names itself in /v1/models' owned_by (llamacpp, vllm, nanochat-tui)
        d = {"model": self.lm.name, "cache_seqlens": last.cache_seqlens if last else 0, "capacity": self.context,
             "tokens": last.cache_seqlens if last else 0, "device": "remote", "backend": self.server,
             "turns": self.turns, **self.settings.sampling_values()}
        if last:
            d |= {"last_prefill_tokens": last.prefill_tokens, "last_cached_tokens": last.cached_before,
                  "last_ttft_ms": round(last.ttft_ms, 2), "last_tokens_per_s": round(last.tokens_per_s, 2)}
        return d
