"""One conversation over one persistent KV cache. The cache invariant lives here.

INVARIANT (docs/cache-invariant.md): the cache holds exactly the K/V of
`tokens[:cache.pos]`; `tokens[cache.pos:]` are pending and get prefilled at the start of
the next generation. `tokens` always equals the chat template rendered over the
exchanges in the context, piece by piece (a trim moves the oldest to `archive`, text
only); a reply takes the form the template gives it in the history when the next user
message comes (Qwen3 drops its thinking: docs/chat-formats.md). Every method below leaves
that true when it returns or yields.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator as Yields
from collections.abc import Iterator
from dataclasses import replace

from chatapp.chat import trim, whole
from chatapp.chat.attach import PASTED, Attachment, Attachments, Budget, file_command
from chatapp.chat.clip import pick_reply, reply_text
from chatapp.chat.commands import help_text, is_text
from chatapp.chat.events import CacheState, Copied, Error, Event, Info, Quit, TextDelta, Trimmed, TurnStats
from chatapp.chat.exchange import Exchange
from chatapp.chat.figures import stats_line, weights_format
from chatapp.chat.respond import adopt_history, parse_messages
from chatapp.chat.settings import Settings, set_command
from chatapp.chat.tools import ToolRunner
from model.chat_formats.completion import MODE as COMPLETION_MODE
from model.chat_formats.whole import Rendered
from model.errors import UserError
from model.generate import Generator
from model.loading import LoadedModel
from model.sampling import SamplingConfig


class Session:
    def __init__(self, lm: LoadedModel, settings: Settings | None = None, context: int | None = None):
        self.lm, self.tok, self.template = lm, lm.tokenizer, lm.template
        self.settings = settings or Settings()
        self.context = context  # as asked for (--context): a model switch asks the new model the same
        self.cache = lm.model.new_cache(min(context or lm.context_length, lm.context_length))
        self.check_system_fits(self.system)
        self.gen = Generator(lm.model, self.cache, self.tok.vocab_size)
        self.cancel_flag = threading.Event()
        self.history: list[TurnStats] = []
        self.exchanges: list[Exchange] = []
        self.archive: list[Exchange] = []  # trimmed out of the context: kept for the transcript and the store
        self.tokens: list[int] = []
        self.attached = Attachments()  # /file and large pastes: they go with the next message
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
        return len(self.archive) + len(self.exchanges)

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
        self.archive = []
        self.history = []  # turn figures belong to the chat they were measured in

    def adopt(self, tokens: list[int], exchanges: list[Exchange], archive: list[Exchange] = ()) -> None:
        """Take over a stored conversation with an empty cache: every token is pending, so the
        invariant holds; the store then refills the cache (snapshot or prefill, chatapp/restore.py)."""
        self.cache.reset()
        self.gen.forget()
        self.tokens, self.exchanges, self.archive = list(tokens), list(exchanges), list(archive)
        self.history = []

    def fit(self) -> list[Trimmed]:
        """After `adopt` of a conversation made for a longer context (/model): drop the oldest
        exchanges, as a full context does, until a reply fits. A trim refills the cache."""
        return [ev for ev in self._make_room(0) if isinstance(ev, Trimmed)]

    def truncate(self, n: int) -> None:
        """Cut the token list to n tokens, rewinding the cache if it held more."""
        del self.tokens[n:]
        if self.cache.pos > n:
            self.cache.rewind(n)
            self.gen.forget()

    def state(self, event: str, detail: str = "") -> CacheState:
        return CacheState(event, self.cache.pos, self.cache.capacity, len(self.tokens), detail)

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

        def turn() -> Iterator[Event]:
            yield from self.turn(text, new)
            self.attached.clear()  # sent with this message (one the model failed on keeps them)
        yield from self._undoable(turn())

    def respond_to(self, messages: list[dict]) -> Iterator[Event]:
        """An OpenAI-style message list (an optional system message, then user and assistant
        messages in turn, ending with a user message): the history becomes those messages,
        rewinding the cache to the longest token prefix it shares with them
        (chatapp/chat/respond.py), and the last user message is sent as a turn. The events
        are `send`'s: `cached_before` is the prefix reused, `prefill_tokens` what was not."""
        saved = (list(self.tokens), list(self.exchanges), list(self.archive), self.settings.system)
        try:
            conv = parse_messages(messages)
            if not conv.user.strip() or not is_text(conv.user):  # refused before anything moves
                self.user_tokens(conv.user.strip(), first=False)
            adopt_history(self, conv)
            new = self.user_tokens(conv.user.strip(), first=not self.exchanges)
        except UserError as e:
            # the cache holds a prefix the old and new token lists share: the old one is valid
            self.tokens, self.exchanges, self.archive, self.settings.system = saved
            yield Error(str(e))
            return
        self.cancel_flag.clear()
        yield from self._undoable(self.turn(conv.user.strip(), new))

    def user_tokens(self, text: str, first: bool) -> list[int]:
        """The tokens a user message adds (with the system prompt folded in when it is the
        `first` in the context, for families that do that); UserError, nothing changed, when it
        cannot be sent. /edit checks with it before it rewinds (chatapp/chat/edit.py)."""
        if not text:
            raise UserError("empty message")
        if not is_text(text):
            raise UserError("message is not valid Unicode (it holds a lone surrogate); nothing was sent")
        new = self.template.user_turn(text, self.system if first else "")
        room = self.message_room
        if len(new) > room:
            raise UserError(f"message too long: {len(new)} tokens, the context holds {room} after the "
                            f"system prompt ({self.room_hint()})")
        return new

    def turn(self, text: str, new: list[int]) -> Iterator[Event]:
        """The turn for a message `user_tokens` gave `new` for; run it inside `_undoable`."""
        self.cancel_flag.clear()  # before the trim's re-fill, so a stop pressed during it counts
        if whole.is_whole(self):  # the template rendered whole: chat/whole.py
            trimmed = yield from whole.make_room(self, text)
            whole.sync(self, text)
            start = max((ex.end for ex in self.exchanges if ex.end >= 0), default=len(self.template.start(self.system)))
            self.exchanges.append(Exchange(text, min(start, len(self.tokens)), len(self.tokens)))
            yield from self._reply(trimmed)
            return
        self._last_reply_as_history()
        trimmed = yield from self._make_room(len(new))
        self.exchanges.append(Exchange(text, len(self.tokens), len(self.tokens) + len(new)))
        self.tokens.extend(new)
        yield from self._reply(trimmed)

    def user_turn(self, text: str) -> list[int]:
        """The tokens a user message adds (the first one carries the system prompt in some formats)."""
        return self.template.user_turn(text, "" if self.exchanges else self.system)

    @property
    def message_room(self) -> int:
        """The most tokens one user turn may take: older exchanges are trimmed to make room for it."""
        return self.cache.capacity - self.prefix_len - 1

    def _undoable(self, turn: Iterator[Event]) -> Iterator[Event]:
        """Run a turn; if the model fails mid-turn (NaN logits from bad weights, out of memory),
        put the chat back as it was before it and report one line: the user's message and the
        conversation stay intact. The cache keeps only the K/V still valid for the restored
        tokens, so the invariant holds."""
        saved = (list(self.tokens), [replace(ex, tool_calls=list(ex.tool_calls)) for ex in self.exchanges],
                 list(self.archive), len(self.history))
        try:
            yield from turn
        except Exception as e:  # a model failure must not lose the chat
            held = self.tokens[:self.cache.pos]  # what the cache holds K/V for, at the failure
            self.tokens, self.exchanges, self.archive = saved[0], saved[1], saved[2]
            del self.history[saved[3]:]
            valid = next((i for i, (a, b) in enumerate(zip(self.tokens, held, strict=False)) if a != b),
                         min(len(self.tokens), len(held)))
            if self.cache.pos > valid:
                self.cache.rewind(valid)
            self.gen.forget()
            reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            yield self.state("undone")
            if isinstance(e, UserError):   # the chat template refused the chat (chat_formats/whole.py)
                yield Error(f"{reason}; the chat is as it was before this message")
                return
            yield Error(f"the model failed during this turn ({type(e).__name__}: {reason}); "
                        f"the chat is as it was before it")

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

    def _reply(self, trimmed: Trimmed | None = None) -> Iterator[Event]:
        """Prefill what is pending and decode. A trim just before (`trimmed`) is part of the wait
        for the first token: its re-prefill counts in the turn's TTFT and prefill tokens."""
        ex = self.exchanges[-1]
        s = self.settings
        self.gen.configure(SamplingConfig(**s.sampler_values()))
        if self.cache.pos == len(self.tokens):  # nothing pending (a retry): re-feed one token for logits
            self.cache.rewind(self.cache.pos - 1)
        cached_before = self.cache.pos
        t0 = time.perf_counter()
        self.gen.prefill(self.tokens[cached_before:])
        prefill_tokens = self.cache.pos - cached_before
        tools = ToolRunner(self.template, self.tok)
        decoder = self.tok.stream_decoder()
        closing = len(self.template.end_reply())
        stop, n, t_first = "length", 0, None
        think, thinking = self.template.think_ids or (), False
        while n < self.settings.max_new_tokens:
            tok = self.gen.sample()
            if t_first is None:
                t_first = time.perf_counter()
            if tok in self.template.stop_ids:
                stop = "end"
                break
            self.tokens.append(tok)
            n += 1
            if tok in think:  # the block's markers are structure, not text: the flag carries them
                if tail := decoder.flush():
                    yield TextDelta(tail, thinking)
                thinking = tok == think[0]
            elif text := decoder.push(tok):
                yield TextDelta(text, thinking)
            if self.cancel_flag.is_set():
                stop = "cancel"
                break
            forced = tools.after(tok)
            if self.cache.free < 1 + len(forced) + closing:
                break  # the context is full: end the reply here, closed properly
            self.gen.feed(tok)
            if tools.new_call:
                yield tools.new_call
            if forced:
                self.tokens.extend(forced)
                self.gen.prefill(forced)
                if text := decoder.push_many(forced):
                    yield TextDelta(text, thinking)
        if tail := decoder.flush():
            yield TextDelta(tail, thinking)
        t_end = time.perf_counter()
        ex.reply = self.tok.decode(self.tokens[ex.reply_start:])
        ex.tool_calls, ex.stop = tools.calls, stop
        if whole.is_whole(self):  # closed as the template closes it; the cache keeps what still matches
            whole.close(self, ex, self.tokens[ex.reply_start:])
        else:
            self.tokens.extend(self.template.end_reply())  # pending until the next turn
            ex.end = len(self.tokens)
        if trimmed is not None:  # the trim recomputed the history: nothing was reused
            t0 -= trimmed.reprefill_ms / 1000
            prefill_tokens, cached_before = prefill_tokens + cached_before, 0
        st = self._stats(ex, prefill_tokens, cached_before, n, t0, t_first or t_end, t_end, stop)
        st.reprefilled_tokens = trimmed.reprefilled_tokens if trimmed else 0
        yield st

    def _stats(self, ex, prefill_tokens, cached_before, n, t0, t_first, t_end, stop) -> TurnStats:
        decode_s = t_end - t_first
        thinking, reply = self.template.split_thinking(ex.reply)  # ex.reply keeps both: the store's text
        st = TurnStats(
            turn=self.turns, user=ex.user, reply=reply, thinking=thinking, prefill_tokens=prefill_tokens,
            cached_before=cached_before, cache_seqlens=self.cache.pos, capacity=self.cache.capacity,
            decode_tokens=n, ttft_ms=(t_first - t0) * 1000,
            tokens_per_s=(n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0, stop=stop,
            kv_bytes_used=self.cache.bytes_used, kv_bytes_allocated=self.cache.bytes_allocated,
            backend=self.lm.model.attn.name, tool_calls=list(ex.tool_calls))
        self.history.append(st)
        return st

    def _make_room(self, incoming: int) -> Yields[Event, None, Trimmed | None]:
        """If the new turn and a reply do not fit, drop the oldest whole exchanges down to the
        low-water mark and re-prefill what is kept (chat/trim.py: the policy and why). The
        system prompt stays. Returns the Trimmed event, whose cost the turn's figures include."""
        drop = trim.count_to_drop(len(self.tokens), [ex.start for ex in self.exchanges], incoming,
                                  self.settings.max_new_tokens, self.cache.capacity, self.settings.low_water)
        if drop == 0:
            return None
        # families without a system role (nanochat) carry it in the first user turn
        head = self.template.user_turn(self.exchanges[drop].user, self.system) if drop < len(self.exchanges) else []
        done = trim.cut(self.tokens, self.exchanges, drop, head)
        self.archive += self.exchanges[:drop]  # out of the context, still part of the chat
        self.exchanges = self.exchanges[drop:]
        self.cache.reset()
        self.gen.forget()
        seconds = yield from trim.reprefill(self.gen, self.tokens)
        ev = Trimmed(done.dropped, done.removed, self.cache.pos, self.cache.pos, self.cache.capacity,
                     seconds * 1000)
        yield ev
        return ev

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
            yield from self._reply()
        yield from self._undoable(retry())

    def undo(self, _arg: str = "") -> Iterator[Event]:
        if not self.exchanges:
            raise UserError("/undo: nothing to undo")
        ex = self.exchanges.pop()
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
        replies = self.archive + self.exchanges
        n = pick_reply(arg, len(replies))
        text = reply_text(self.template, self.tok, replies[n - 1].reply)
        if not text.strip():
            raise UserError(f"/copy: reply {n} has no text to copy")
        yield Copied(n, len(replies), text)

    def attach_file(self, arg: str) -> Iterator[Event]:
        """`/file PATH` (chatapp/chat/attach.py): the file goes with the next message."""
        yield from file_command(self.attached, arg, self.budget())

    def attach_text(self, text: str) -> Iterator[Event]:
        """A paste too large for the input box, attached like a file."""
        if not is_text(text):
            raise UserError("the pasted text is not valid Unicode (it holds a lone surrogate); nothing was attached")
        yield self.attached.add(Attachment(PASTED, text), self.budget())

    def budget(self) -> Budget:
        return Budget(lambda body: len(self.user_turn(body)), self.message_room, self.room_hint())

    def stats(self) -> dict:
        c = self.cache
        d = {"model": self.lm.name, "cache_seqlens": c.pos, "capacity": c.capacity, "tokens": len(self.tokens),
             "shape": list(c.shape), "dtype": str(c.dtype).removeprefix("torch."),
             "weights": weights_format(self.lm.model), "device": str(c.device),
             "kv_bytes_used": c.bytes_used, "kv_bytes_allocated": c.bytes_allocated,
             "backend": self.lm.model.attn.name, "turns": self.turns, **self.settings.sampling_values()}
        if getattr(self.template, "completion", False):  # only then: a chat model's figures stay as they were
            d["mode"] = COMPLETION_MODE
        kept = [st for st in self.history if st.turn <= self.turns]  # an /undo takes its turn's figures too
        if kept:
            last = kept[-1]
            d |= {"last_prefill_tokens": last.prefill_tokens, "last_ttft_ms": round(last.ttft_ms, 2),
                  "last_tokens_per_s": round(last.tokens_per_s, 2)}
        return d

    def stats_text(self) -> str:
        return stats_line(self.stats())
