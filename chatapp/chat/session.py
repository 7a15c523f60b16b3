"""One conversation over one persistent KV cache. The cache invariant lives here.

INVARIANT (docs/cache-invariant.md): the cache holds exactly the K/V of
`tokens[:cache.seqlen]`; `tokens[cache.seqlen:]` are pending and get prefilled at the start of
the next generation. `tokens` always equals the chat template rendered over the
exchanges in the context, piece by piece (a trim moves the oldest to `trimmed`, text
only); a reply takes the form the template gives it in the history when the next user
message comes (Qwen3 drops its thinking: docs/chat-formats.md). Every method below leaves
that true when it returns or yields.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from chatapp.chat import reply, respond, trim, whole
from chatapp.chat.attach import Attachments, Budget, file_command, paste_command
from chatapp.chat.clip import pick_reply
from chatapp.chat.commands import help_text, is_text
from chatapp.chat.events import CacheState, Copied, Error, Event, Info, Quit, SessionFigures, Trimmed, TurnStats
from chatapp.chat.exchange import Exchange, prefill_history
from chatapp.chat.figures import stats_text
from chatapp.chat.kinds import Part, answer_text, stored_parts
from chatapp.chat.memory import read_memory
from chatapp.chat.settings import Settings, set_command
from chatapp.chat.stats import session_stats
from chatapp.chat.undoable import undoable
from model.chat_formats.whole import Rendered
from model.decode.generate import Generator
from model.errors import UserError, unexpected
from model.loading import LoadedModel


class Session:
    def __init__(self, lm: LoadedModel, settings: Settings | None = None, context: int | None = None):
        self.lm, self.tokenizer, self.template = lm, lm.tokenizer, lm.template
        self.settings = settings or Settings()
        self.context = context  # as asked for (--context): a model switch asks the new model the same
        self.cache = lm.model.new_cache(min(context or lm.context_length, lm.context_length))
        self.check_system_fits(self.system)
        self.gen = Generator(lm.model, self.cache, self.tokenizer.vocab_size)
        self.cancel_flag = threading.Event()
        self.turn_stats: list[TurnStats] = []
        self.exchanges: list[Exchange] = []
        self.trimmed: list[Exchange] = []  # trimmed out of the context: kept for the transcript and the store
        self.tokens: list[int] = []
        self.attached = Attachments()  # /file and large pastes: they go with the next message
        self.snapshot_budget: int | None = None  # the store's, for /stats: its keeper sets it (None: not stored)
        self.reset()

    # --- state -----------------------------------------------------------------
    @property
    def system(self) -> str:
        s = self.settings.system
        return self.template.default_system if s is None else s

    @property
    def turns(self) -> int:
        """Exchanges in this chat, trimmed ones included: a retry regenerates a turn, /undo and
        /reset remove them."""
        return len(self.trimmed) + len(self.exchanges)

    @property
    def prefix_len(self) -> int:
        return self.exchanges[0].start if self.exchanges else len(self.tokens)

    def check_system_fits(self, system: str) -> None:
        """UserError unless a short message and one reply token fit after `system`: a prompt
        that fills the context would refuse every message that follows it."""
        need = len(self.template.start(system)) + len(self.template.user_turn("hi", system)) + 1
        if need > self.cache.capacity:
            raise UserError(f"the system prompt leaves no room: it needs {need} tokens with a message, "
                            f"the context holds {self.cache.capacity} (shorten it, or {self.room_hint()})")

    def room_hint(self) -> str:
        """What the user can do about a full context: --context helps only below the model's own."""
        if self.cache.capacity < self.lm.context_length:
            return f"raise --context, up to the model's {self.lm.context_length}"
        return f"{self.cache.capacity} tokens is all this model takes"

    def reset(self) -> None:
        self.cache.reset()
        self.gen.forget()
        self.tokens = self.template.start(self.system)
        self.exchanges = []
        self.trimmed = []
        self.turn_stats = []  # turn figures belong to the chat they were measured in

    def adopt(self, tokens: list[int], exchanges: list[Exchange], trimmed: list[Exchange] = ()) -> None:
        """Take over a stored conversation with an empty cache: every token is pending, so the
        invariant holds; the store then refills the cache (snapshot or prefill, chatapp/restore.py)."""
        self.cache.reset()
        self.gen.forget()
        self.tokens, self.exchanges, self.trimmed = list(tokens), list(exchanges), list(trimmed)
        self.turn_stats = []

    def fit(self) -> list[Trimmed]:
        """After `adopt` of a conversation made for a longer context (/model): drop the oldest
        exchanges, as a full context does, until a reply fits. A trim refills the cache."""
        return [ev for ev in trim.make_room(self, 0) if isinstance(ev, Trimmed)]

    def truncate(self, n: int) -> None:
        """Cut the token list to n tokens, rewinding the cache if it held more."""
        del self.tokens[n:]
        if self.cache.seqlen > n:
            self.cache.rewind(n)
            self.gen.forget()

    def forget_turn_stats(self) -> None:
        """The figures of turns no longer in the chat (/undo, /edit) leave its list with them."""
        self.turn_stats = [st for st in self.turn_stats if st.turn <= self.turns]

    def state(self, event: str, detail: str = "") -> CacheState:
        return CacheState(event, self.cache.seqlen, self.cache.capacity, len(self.tokens), detail)

    def cancel(self) -> None:
        self.cancel_flag.set()

    # --- the turn ----------------------------------------------------------------
    def send(self, text: str) -> Iterator[Event]:
        """A user message: render only its tokens, prefill what is pending, decode."""
        text = text.strip()
        try:
            if text:  # attached files ride with a typed message, never alone
                text = self.attached.wrap(text)
            new = self.user_tokens(text, first=not self.exchanges)
        except UserError as e:
            yield Error(str(e))
            return
        except Exception as e:  # nothing has changed yet: the turn is refused in one line
            yield Error(unexpected(e))
            return

        def turn() -> Iterator[Event]:
            yield from self.turn(text, new)
            self.attached.clear()  # sent with this message (one the model failed on keeps them)
        yield from undoable(self, turn())

    def respond_to(self, messages: list[dict]) -> Iterator[Event]:
        """An OpenAI-style message list (an optional system message, then user and assistant
        messages in turn, ending with a user message): the history becomes those messages,
        rewinding the cache to the longest token prefix it shares with them
        (chatapp/chat/respond.py), and the last user message is sent as a turn. The events
        are `send`'s: `cached_before` is the prefix reused, `prefill_tokens` what was not."""
        yield from respond.respond_to(self, messages)

    def user_tokens(self, text: str, first: bool) -> list[int]:
        """The tokens a user message adds (with the system prompt folded in when it is the
        `first` in the context, for families that do that); UserError, nothing changed, when it
        cannot be sent. /edit checks with it before it rewinds (chatapp/chat/edit.py)."""
        if not text:
            raise UserError("empty message")
        if not is_text(text):
            raise UserError("message is not valid Unicode (it holds a lone surrogate); nothing was sent")
        new = self.turn_tokens(text, first)
        room = self.message_room
        if len(new) > room:
            raise UserError(f"message too long: {len(new)} tokens, the context holds {room} after the "
                            f"system prompt ({self.room_hint()})")
        return new

    def turn_tokens(self, text: str, first: bool) -> list[int]:
        """The template's tokens for a user message, unchecked (a /file's size is measured with it)."""
        return self.template.user_turn(text, self.system if first else "")

    def turn(self, text: str, new: list[int]) -> Iterator[Event]:
        """The turn for a message `user_tokens` gave `new` for; run it inside `undoable` (chat/undoable.py)."""
        self.cancel_flag.clear()  # before the trim's re-fill, so a stop pressed during it counts
        if whole.is_whole(self):  # the template rendered whole: chat/whole.py
            trim_event = yield from whole.make_room(self, text)
            whole.sync(self, text)
            start = max((ex.end for ex in self.exchanges if ex.end >= 0), default=len(self.template.start(self.system)))
            self.exchanges.append(Exchange(text, min(start, len(self.tokens)), len(self.tokens)))
            yield from reply.write(self, trim_event)
            return
        self._last_reply_as_history()
        trim_event = yield from trim.make_room(self, len(new))
        self.exchanges.append(Exchange(text, len(self.tokens), len(self.tokens) + len(new)))
        self.tokens.extend(new)
        yield from reply.write(self, trim_event)

    @property
    def message_room(self) -> int:
        """The most tokens one user turn may take: older exchanges are trimmed to make room for it."""
        return self.cache.capacity - self.prefix_len - 1

    def _last_reply_as_history(self) -> None:
        """A user message follows the last reply now: give it the tokens the official template
        gives a reply in the history (Qwen3 drops its thinking, Llama 3 trims it), rewinding
        the cache to where they change. Most replies stay as generated: nothing to redo."""
        if not self.exchanges:
            return
        ex, closing = self.exchanges[-1], self.template.end_reply()
        hist = self.template.as_history(self.tokens[ex.reply_start:ex.end - len(closing)])
        if hist is not None:
            self.truncate(ex.reply_start)
            self.tokens += hist + closing
            ex.end = len(self.tokens)

    # --- commands (chatapp/chat/commands.py's table names these; the keeper dispatches) ------
    def reset_chat(self, _arg: str = "") -> Iterator[Event]:
        self.reset()
        yield self.state("reset")

    def retry(self, _arg: str = "") -> Iterator[Event]:
        if not self.exchanges:
            raise UserError("/retry: nothing to retry yet")
        self.cancel_flag.clear()

        def retry() -> Iterator[Event]:
            if whole.is_whole(self):  # the prompt rendered again, without the reply
                ex = self.exchanges.pop()
                whole.sync(self, ex.user)
                self.exchanges.append(Exchange(ex.user, max(ex.start, 0), len(self.tokens)))
            else:
                self.truncate(self.exchanges[-1].reply_start)
            yield self.state("retry")
            yield from reply.write(self)
        yield from undoable(self, retry())

    def undo(self, _arg: str = "") -> Iterator[Event]:
        if not self.exchanges:
            raise UserError("/undo: nothing to undo")
        ex = self.exchanges.pop()
        self.forget_turn_stats()
        if whole.is_whole(self):
            whole.adopt(self, self.template.render(self.system, whole.pairs_of(self, self.exchanges), None)
                        if self.exchanges else Rendered(self.template.start(self.system), []), self.exchanges)
        else:
            self.truncate(ex.start)
        yield self.state("undo")

    def set_system(self, text: str) -> Iterator[Event]:
        self.check_system_fits(text)
        self.settings.system = text
        self.reset()
        yield self.state("system", "system prompt set; new chat started")

    def change_settings(self, arg: str) -> Iterator[Event]:
        """`/set NAME=VALUE ...` changes settings; `/set` alone shows every one of them."""
        yield Info(*set_command(self.settings, arg))

    def show_stats(self, _arg: str = "") -> Iterator[Event]:
        yield Info(self.stats_text(), self.stats())

    def show_help(self, _arg: str = "") -> Iterator[Event]:
        yield Info(help_text())

    def quit(self, _arg: str = "") -> Iterator[Event]:
        yield Quit()

    def copy_reply(self, arg: str) -> Iterator[Event]:
        """`/copy [N]`: a reply's answer as the transcript shows it (no thinking, no tool spans)."""
        replies = self.trimmed + self.exchanges
        n = pick_reply(arg, len(replies))
        text = answer_text(self.reply_parts(replies[n - 1]))
        if not text.strip():
            raise UserError(f"/copy: reply {n} has no text to copy")
        yield Copied(n, len(replies), text)

    def reply_parts(self, ex: Exchange) -> list[Part]:
        """A reply by kind: as it streamed, or (a stored chat's) found in its text."""
        return ex.parts or stored_parts(self.template, self.tokenizer, ex.reply)

    def attach_file(self, arg: str) -> Iterator[Event]:
        """`/file PATH` (chatapp/chat/attach.py): the file goes with the next message."""
        yield from file_command(self.attached, arg, self.budget())

    def attach_text(self, text: str) -> Iterator[Event]:
        """A paste too large for the input box, attached like a file."""
        yield paste_command(self.attached, text, self.budget())

    def budget(self) -> Budget:
        return Budget(lambda body: len(self.turn_tokens(body, first=not self.exchanges)), self.message_room,
                      self.room_hint())

    def stats(self) -> dict:
        return session_stats(self)

    def figures(self) -> SessionFigures:
        """What the TUI's panel shows between turns; its worker reads it, never the UI thread."""
        return SessionFigures(self.stats(), read_memory(str(self.cache.device)), list(self.turn_stats),
                              prefill_history(self.exchanges, self.turn_stats, len(self.trimmed) + 1))

    def stats_text(self) -> str:
        return stats_text(self.stats())
