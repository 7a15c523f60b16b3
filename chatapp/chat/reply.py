"""One reply: prefill what is pending, then decode token by token, the calculator's output
forced through the model (chat/tools.py), the tokens turned into events: `TextDelta`s by kind
(chat/kinds.py), `ToolCall`s, `Progress` while it runs, and the turn's `TurnStats` last.

A function of the session (like chat/trim.py): `Session.turn` and `/retry` call it inside
`undoable` (chat/undoable.py), so the cache invariant holds after every event it yields.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from chatapp.chat import whole
from chatapp.chat.events import Event, Info, Progress, Trimmed, TurnStats
from chatapp.chat.exchange import Exchange
from chatapp.chat.kinds import ReplyText, reply_text, thinking_text
from chatapp.chat.memory import read_memory
from chatapp.chat.session_like import SessionLike
from chatapp.chat.tools import ToolRunner
from model.decode.sampling import SamplingConfig

# A model whose first reply ends before its first token, on a new chat, is most often a damaged
# file (NaN scales, tensors of the wrong type): 96 of issue 45's 1,068 mutations did just that.
EMPTY_FIRST_REPLY = ("note: the model ended its reply before writing anything; if it does so every time, "
                     "its file may be damaged (NaN scales, tensors of the wrong type)")
PROGRESS_S = 0.25  # the decode's Progress at most 4 times a second: what the panel needs, no more


class Meter:
    """Progress events of one reply: every prefill chunk, and rate-limited while decoding."""

    def __init__(self, s: SessionLike) -> None:
        self.s, self.t0, self.last = s, time.perf_counter(), float("-inf")

    def progress(self, phase: str, done: int, total: int, every: float = 0.0) -> Progress | None:
        now = time.perf_counter()
        if now - self.last < every:
            return None
        self.last = now
        c = self.s.cache
        return Progress(phase, done, total, now - self.t0, c.seqlen, c.capacity, c.bytes_used,
                        read_memory(str(c.device)))


def prefill(s: SessionLike, meter: Meter) -> Iterator[Progress]:
    """The pending tokens, in the Generator's own chunks (so the cache is what one call would
    make), a Progress before the first and after each."""
    pending, step = s.tokens[s.cache.seqlen:], s.gen.prefill_chunk
    yield meter.progress("prefill", 0, len(pending))
    for i in range(0, len(pending), step):
        s.gen.prefill(pending[i:i + step])
        yield meter.progress("prefill", min(i + step, len(pending)), len(pending))


def write(s: SessionLike, trim_event: Trimmed | None = None) -> Iterator[Event]:
    """Prefill what is pending and decode. A trim just before (`trim_event`) is part of the wait
    for the first token: its re-prefill counts in the turn's TTFT and prefill tokens."""
    ex = s.exchanges[-1]
    s.gen.configure(SamplingConfig(**s.settings.sampler_values()))
    if s.cache.seqlen == len(s.tokens):  # nothing pending (a retry): re-feed one token for logits
        s.cache.rewind(s.cache.seqlen - 1)
    cached_before = s.cache.seqlen
    meter = Meter(s)
    yield from prefill(s, meter)
    prefill_tokens = s.cache.seqlen - cached_before
    tools, text = ToolRunner(s.template, s.tokenizer), ReplyText(s.template, s.tokenizer)
    closing = len(s.template.end_reply())
    cap = s.settings.max_new_tokens  # None: no cap, the context is the limit
    stop, n, t_first = "length", 0, None
    while cap is None or n < cap:
        token = s.gen.sample()
        if t_first is None:
            t_first = time.perf_counter()
        if token in s.template.stop_ids:
            stop = "end"
            break
        s.tokens.append(token)
        n += 1
        yield from text.push(token)
        if s.cancel_flag.is_set():
            stop = "cancel"
            break
        forced = tools.after(token)
        if s.cache.free < 2 + len(forced) + closing:  # this token, the next one sampled, the close
            stop = "context"
            break  # the context is full: the reply ends here, its close pending and fitting (the next turn trims)
        s.gen.feed(token)
        if tools.new_call:
            yield tools.new_call
        if forced:
            s.tokens.extend(forced)
            s.gen.prefill(forced)
            for token in forced:
                yield from text.push(token)
        if ev := meter.progress("decode", n, cap or n + s.cache.free, PROGRESS_S):
            yield ev
    yield from text.flush()
    t_end = time.perf_counter()
    ex.reply = s.tokenizer.decode(s.tokens[ex.reply_start:])  # the store's text: markers and all
    ex.parts, ex.tool_calls, ex.stop = text.parts.parts, tools.calls, stop
    if whole.is_whole(s):  # closed as the template closes it; the cache keeps what still matches
        whole.close(s, ex, s.tokens[ex.reply_start:])
    else:
        s.tokens.extend(s.template.end_reply())  # pending until the next turn
        ex.end = len(s.tokens)
    t0 = meter.t0
    if trim_event is not None:  # the trim recomputed the history: nothing was reused
        t0 -= trim_event.reprefill_ms / 1000
        prefill_tokens, cached_before = prefill_tokens + cached_before, 0
    st = stats(s, ex, prefill_tokens, cached_before, n, (t0, t_first or t_end, t_end), stop)
    st.reprefilled_tokens = trim_event.reprefilled_tokens if trim_event else 0
    s.turn_stats.append(st)
    yield st
    if n == 0 and stop == "end" and s.turns == 1:   # a new chat's first reply: said once, where it is rare
        yield Info(EMPTY_FIRST_REPLY)  # after the turn it is about, which is already committed


def stats(s: SessionLike, ex: Exchange, prefill_tokens: int, cached_before: int, n: int,
          times: tuple[float, float, float], stop: str) -> TurnStats:
    t0, t_first, t_end = times
    decode_s = t_end - t_first
    return TurnStats(
        turn=s.turns, user=ex.user, reply=reply_text(ex.parts), thinking=thinking_text(ex.parts),
        prefill_tokens=prefill_tokens, cached_before=cached_before, cache_seqlens=s.cache.seqlen,
        capacity=s.cache.capacity, decode_tokens=n, ttft_ms=(t_first - t0) * 1000,
        tokens_per_s=(n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0, stop=stop,
        kv_bytes_used=s.cache.bytes_used, kv_bytes_allocated=s.cache.bytes_allocated,
        backend=s.lm.model.attn.name, tool_calls=list(ex.tool_calls), rss_bytes=read_memory(str(s.cache.device)).rss)
