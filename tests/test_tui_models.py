"""Pilot tests of the real app with other models: nanochat's tool calls (a scripted tiny
nanochat), the default model when it is pulled, and a real-shaped model for echo latency.
Also a context trim and a transcript redrawn from the session."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from textual import events
from tui_pilot import endless, make_app, notices, ready, replies, row, submit, until

from chatapp.chat.events import ToolCall
from chatapp.options import chat_parser
from chatapp.tui.app import ChatApp
from chatapp.tui.transcript import ToolCallView, UserMessage

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


async def test_tool_calls_are_shown_apart_from_the_reply():
    scripted = pytest.importorskip("test_tool_session", reason="needs the scripted nanochat model").scripted
    from chatapp.chat.session import Session
    from chatapp.chat.settings import Settings
    from chatapp.keeper.keeper import ChatKeeper

    lm = scripted("12*7", " ok")
    settings = Settings(temperature=0.0, max_new_tokens=40)
    app = make_app(opener=lambda args, progress: ChatKeeper(Session(lm, settings), None))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "What is 12*7?")
        reply = app.transcript.exchanges[0].reply
        (view,) = reply.query(ToolCallView)
        assert view.call == ToolCall("12*7", "84")
        assert reply.text == " ok"  # the markers and the forced output are not in the Markdown
        assert app.session.exchanges[0].reply.endswith("<|output_start|>84<|output_end|> ok")
        assert row(app, "cache_seqlens") == f"{app.session.cache.seqlen} / {app.session.cache.capacity}"

        await app.redraw()  # a restored chat is drawn the same way
        (view,) = app.transcript.exchanges[0].reply.query(ToolCallView)
        assert view.call == ToolCall("12*7", "84") and replies(app) == [" ok"]


async def test_the_default_model_chats_in_the_app(pulled, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(pulled.home))  # where a plain `nanochat-tui` looks
    args = chat_parser().parse_args(["--temperature", "0", "--max-new-tokens", "12"])  # no --model
    app = ChatApp(args)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        s = app.session
        assert row(app, "model") == s.lm.name and s.lm.name != "random:tiny"
        await submit(pilot, "What is the capital of France?", timeout=300)
        assert "Paris" in replies(app)[0]
        first = s.turn_stats[-1]
        await submit(pilot, "Thanks!", timeout=300)
        st = s.turn_stats[-1]
        assert st.cached_before == first.cache_seqlens
        assert st.prefill_tokens == len(s.template.end_reply()) + len(s.template.user_turn("Thanks!"))
        assert row(app, "cache_seqlens") == f"{s.cache.seqlen} / {s.cache.capacity}"


async def test_keystrokes_echo_quickly_while_a_real_sized_model_decodes():
    app = make_app("--model", "random:smollm2-135m", "--context", "512", "--max-new-tokens", "100000")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        endless(app)
        await pilot.press(*"go", "enter")
        await until(pilot, lambda: app.batches > 0, timeout=120, what="decoding to start")
        latencies = []
        for ch in "abcdefghij":
            before = app.input.text
            t0 = time.perf_counter()
            app.post_message(events.Key(ch, ch))  # as the terminal driver delivers a key
            while app.input.text == before:
                await asyncio.sleep(0.001)
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.05)
        assert app.busy  # it was decoding all along
        await pilot.press("escape")
        await until(pilot, lambda: not app.busy, timeout=60)
        assert app.input.text == "abcdefghij"
    median = statistics.median(latencies)
    print(f"echo latency while decoding: median {median * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")
    assert median < 0.25, latencies


async def test_a_full_context_drops_old_exchanges_and_says_so():
    app = make_app("--context", "160")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for text in ("first message", "second message", "third message", "fourth message"):
            await submit(pilot, text)
        warnings = notices(app, "warning")
        # the context is cut to half of it, so the next re-prefill is half a context away
        assert warnings and all(w.startswith("Context full: dropped the ") and " ms." in w for w in warnings)
        dropped = [w.text for w in app.transcript.query(UserMessage) if w.has_class("trimmed")]
        assert dropped == [ex.user for ex in app.session.trimmed] and dropped[0] == "first message"
        assert [ex.user.text for ex in app.transcript.exchanges] == [ex.user for ex in app.session.exchanges]
        assert row(app, "cache_seqlens") == f"{app.session.cache.seqlen} / 160"
