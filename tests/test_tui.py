"""Pilot tests: the real ChatApp, the real session and engine on random:tiny (no mocks)."""

from __future__ import annotations

import threading

import pytest
import torch
from textual import events
from textual.widgets import Markdown, Sparkline
from tui_pilot import endless, make_app, notices, ready, replies, row, submit, until

from chatapp.chat.figures import human_ms
from chatapp.launch import open_chat
from chatapp.tui.screens import HelpScreen
from chatapp.tui.transcript import UserMessage

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


async def test_chat_turns_reach_transcript_and_panel():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        s = app.session
        await submit(pilot, "hello there")
        assert [w.text for w in app.transcript.query(UserMessage)] == ["hello there"]
        assert replies(app) == [s.exchanges[0].reply] and s.exchanges[0].reply
        assert row(app, "cache_seqlens") == f"{s.cache.seqlen} / {s.cache.capacity}"
        first = s.turn_stats[-1]

        await submit(pilot, "and again")
        st = s.turn_stats[-1]
        # Turn 2 prefills only its new tokens: the pending end of reply 1 and its own user turn.
        new = len(s.template.end_reply()) + len(s.template.user_turn("and again"))
        assert st.prefill_tokens == new and st.cached_before == first.cache_seqlens
        assert row(app, "prefill") == f"{new} new"
        assert row(app, "cached") == f"{first.cache_seqlens} reused"
        assert row(app, "cache_seqlens") == f"{s.cache.seqlen} / {s.cache.capacity}"
        assert replies(app) == [ex.reply for ex in s.exchanges]
        assert app.query_one("#history", Sparkline).data == [first.prefill_tokens, new]
        assert row(app, "turns") == f"2, max {first.prefill_tokens}"
        assert row(app, "model") == "random:tiny" and row(app, "backend") == "SDPA"
        assert row(app, "shape") == "2×1×2048×2×16" and row(app, "dtype") == "float32"
        assert row(app, "rss").endswith(("MiB", "GiB"))  # the whole test process: its size varies


async def test_reset_brings_panel_and_cache_to_zero():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "hi")
        assert app.session.cache.seqlen > 0
        await submit(pilot, "/reset")
        assert app.session.cache.seqlen == 0
        assert row(app, "cache_seqlens") == "0 / 2048" and row(app, "kv_used") == "0 B"
        assert row(app, "prefill") == "—"
        assert not app.transcript.query(UserMessage) and app.transcript.exchanges == []
        assert app.query_one("#history", Sparkline).data == []


async def test_retry_and_undo_move_the_cache_as_the_session_says():
    app = make_app("--temperature", "1")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        s = app.session
        await submit(pilot, "one")
        await submit(pilot, "two")
        reply_start = s.exchanges[1].reply_start
        old_reply = app.transcript.exchanges[1].reply

        await submit(pilot, "/retry")
        assert s.turn_stats[-1].cached_before == reply_start - 1  # rewound, one token re-fed for logits
        assert len(app.transcript.exchanges) == 2 and app.transcript.exchanges[1].reply is not old_reply
        assert replies(app) == [ex.reply for ex in s.exchanges]
        assert row(app, "cache_seqlens") == f"{s.cache.seqlen} / 2048"

        await submit(pilot, "/undo")
        assert len(s.exchanges) == 1 and s.cache.seqlen <= s.exchanges[0].end
        assert [w.text for w in app.transcript.query(UserMessage)] == ["one"]
        assert row(app, "cache_seqlens") == f"{s.cache.seqlen} / 2048"


async def test_undo_takes_the_undone_turn_off_the_panel():
    """The last-turn rows and the sparkline show the chat as it is after /undo: the turn left on
    top (its latest reply, after a retry), or blanks once nothing is left."""
    app = make_app("--temperature", "1")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        s = app.session
        await submit(pilot, "one")
        await submit(pilot, "two")
        await submit(pilot, "/retry")
        first, retried = s.turn_stats[0], s.turn_stats[-1]
        await submit(pilot, "three")
        assert app.query_one("#history", Sparkline).data == [st.prefill_tokens for st in s.turn_stats]

        await submit(pilot, "/undo")
        assert row(app, "prefill") == f"{retried.prefill_tokens} new"
        assert row(app, "cached") == f"{retried.cached_before} reused"
        assert row(app, "ttft") == human_ms(retried.ttft_ms)
        assert row(app, "speed") == f"{retried.tokens_per_s:.1f} tok/s"
        assert app.query_one("#history", Sparkline).data == [st.prefill_tokens for st in s.turn_stats[:3]]

        await submit(pilot, "/undo")  # turn two goes with both of its replies
        assert row(app, "prefill") == f"{first.prefill_tokens} new"
        assert app.query_one("#history", Sparkline).data == [first.prefill_tokens]
        assert row(app, "turns") == f"1, max {first.prefill_tokens}"

        await submit(pilot, "/undo")
        assert [row(app, id) for id in ("prefill", "cached", "ttft", "speed", "turns")] == ["—"] * 5
        assert app.query_one("#history", Sparkline).data == []

        await submit(pilot, "again")
        assert row(app, "prefill") == f"{s.turn_stats[-1].prefill_tokens} new"
        assert app.query_one("#history", Sparkline).data == [s.turn_stats[-1].prefill_tokens]


async def test_escape_cancels_and_the_next_turn_continues_from_the_partial_reply():
    # The SmolLM2 shape writes ~100 tokens/s on a CPU, so Esc lands long before the context is
    # full (random:tiny could fill 2,000 tokens before a loaded machine delivered the key).
    app = make_app("--model", "random:smollm2-135m", "--context", "1024", "--max-new-tokens", "100000",
                   "--temperature", "0")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        endless(app)  # only Esc (or the full context) can end this reply
        s = app.session
        await pilot.press(*"write a lot", "enter")
        await until(pilot, lambda: app.batches > 0, what="the first streamed text")
        await pilot.press("escape")
        await until(pilot, lambda: not app.busy, what="the cancelled turn to end")
        st = s.turn_stats[-1]
        assert st.stop == "cancel" and st.decode_tokens > 0  # "cancel" only comes from Esc
        reply = app.transcript.exchanges[0].reply
        assert reply.text == s.exchanges[0].reply and reply.border_subtitle == "stopped (Esc)"

        await submit(pilot, "/set max_new_tokens=8")
        await submit(pilot, "go on")  # still usable, and the partial reply stayed in the cache
        assert s.turn_stats[-1].cached_before == st.cache_seqlens
        assert row(app, "cache_seqlens") == f"{s.cache.seqlen} / 1024"


async def test_a_context_above_the_models_is_a_warning_in_the_transcript():
    app = make_app("--context", "99999")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.pause()
        assert "--context 99999 is more than random:tiny takes; using its 2048" in notices(app, "warning")
        assert app.session.cache.capacity == 2048


async def test_unknown_command_and_bad_setting_show_one_line_errors():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "/bogus")
        await submit(pilot, "/set temperature=9")
        assert notices(app, "error") == ["unknown command /bogus; try /help",
                                         "temperature must be a number from 0 to 5, got '9'"]
        assert app.session.cache.seqlen == 0 and app.session.turns == 0  # nothing went to the model
        assert app.input.text == ""


async def test_help_screen_from_key_and_command():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press(*"/help", "enter")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)


async def test_a_model_that_fails_to_load_is_one_line_and_model_spec_loads_another():
    app = make_app("--model", "random:nope")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.loading.failed, what="the load to fail")
        await pilot.pause()
        [error] = notices(app, "error")
        assert error.startswith("The model could not be loaded: unknown random preset 'nope'") and "\n" not in error
        assert app.sub_title == "no model"
        await pilot.press(*"/model random:tiny", "enter")  # the app stayed up: load another
        await ready(pilot)
        assert app.session.lm.name == "random:tiny" and not app.loading.failed
        await submit(pilot, "hello")
        assert app.session.exchanges[0].user == "hello" and replies(app) == [app.session.exchanges[0].reply]


def gated_opener(gate: threading.Event):
    """The real opener (chatapp/launch.py), held until the test opens `gate`: what the app does
    while a model loads, at the test's pace."""
    def opener(args, progress):
        gate.wait(60)
        return open_chat(args, progress)
    return opener


async def test_the_input_box_takes_a_message_while_the_model_loads_and_sends_it_once_ready():
    gate = threading.Event()
    app = make_app(opener=gated_opener(gate))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert app.session is None and app.input.has_focus and not app.input.disabled
            await pilot.press(*"hello there", "enter")
            await pilot.pause()
            assert [w.text for w in app.transcript.query(UserMessage)] == ["hello there"]
            assert app.input.text == "" and app.loading.queued == "hello there"
            await pilot.press(*"second", "enter")  # one message waits; the next stays in the box
            await pilot.pause()
            assert app.input.text == "second" and app.loading.queued == "hello there"
            app.input.load_text("")
            await pilot.press(*"/reset", "enter")  # so does a command that needs the model
            await pilot.pause()
            assert app.input.text == "/reset"
            app.input.load_text("")
            gate.set()
            await until(pilot, lambda: app.inputs_done == 1 and not app.busy, what="the queued message's turn")
            await pilot.pause()
            s = app.session
            assert [ex.user for ex in s.exchanges] == ["hello there"]
            assert [w.text for w in app.transcript.query(UserMessage)] == ["hello there"]
            assert replies(app) == [s.exchanges[0].reply]
            assert row(app, "cache_seqlens") == f"{s.cache.seqlen} / {s.cache.capacity}"
    finally:
        gate.set()


async def test_a_message_waiting_for_a_model_that_fails_goes_back_to_the_box():
    gate = threading.Event()
    app = make_app("--model", "random:nope", opener=gated_opener(gate))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press(*"hello there", "enter")
            await pilot.pause()
            assert app.loading.queued == "hello there"
            gate.set()
            await until(pilot, lambda: app.loading.failed, what="the load to fail")
            await pilot.pause()
            assert app.input.text == "hello there" and app.loading.queued is None
            assert not app.transcript.query(UserMessage)
            [error] = notices(app, "error")
            assert error.startswith("The model could not be loaded: unknown random preset 'nope'")
    finally:
        gate.set()


async def test_esc_takes_back_a_waiting_message_and_ctrl_q_quits_during_the_load():
    gate = threading.Event()
    app = make_app(opener=gated_opener(gate))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press(*"/help", "enter")  # a command that needs no model
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            await pilot.press(*"wait for me", "enter")
            await pilot.pause()
            assert app.loading.queued == "wait for me"
            await pilot.press("escape")
            await pilot.pause()
            assert app.loading.queued is None and app.input.text == "wait for me"
            assert not app.transcript.query(UserMessage)
            await pilot.press("ctrl+q")
            await until(pilot, lambda: not app.is_running, what="the app to quit")
        assert app.session is None and app.loading.running  # it quit without waiting for the model
    finally:
        gate.set()


async def test_enter_sends_ctrl_j_adds_a_line_and_up_recalls():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("a", "ctrl+j", "b")
        assert app.input.text == "a\nb" and app.inputs_done == 0
        await pilot.press("enter")
        await until(pilot, lambda: app.inputs_done == 1)
        assert app.session.exchanges[0].user == "a\nb" and app.input.text == ""
        await submit(pilot, "second")
        await pilot.press("up")
        assert app.input.text == "second"
        await pilot.press("up")
        assert app.input.text == "a\nb"
        await pilot.press("down", "down")
        assert app.input.text == ""


async def test_large_paste_is_one_message():
    app = make_app()
    text = "\n".join(f"line {i}: " + "lorem ipsum " * 6 for i in range(20))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.post_message(events.Paste(text))  # as the terminal driver delivers it: to the app
        await until(pilot, lambda: app.input.text == text, what="the paste")
        assert app.inputs_done == 0  # its newlines did not send anything
        await pilot.press("enter")
        await until(pilot, lambda: app.inputs_done == 1 and not app.busy)
        assert app.session.exchanges[0].user == text.strip()


async def test_too_long_message_is_refused_and_given_back():
    app = make_app("--context", "64")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.post_message(events.Paste("x" * 200))
        await until(pilot, lambda: app.input.text == "x" * 200)
        await pilot.press("enter")
        await until(pilot, lambda: app.inputs_done == 1)
        await pilot.pause()
        (error,) = notices(app, "error")
        assert error.startswith("message too long")
        assert app.transcript.exchanges == [] and app.input.text == "x" * 200
        await pilot.press(*"yz")  # given back to edit: typing goes on at its end
        assert app.input.text == "x" * 200 + "yz"


async def test_a_model_failure_mid_reply_gives_the_message_back_and_keeps_the_chat():
    # A real-sized random model decodes slowly enough on a CPU that the failure lands mid-reply.
    app = make_app("--model", "random:smollm2-135m", "--context", "512", "--temperature", "1",
                   "--max-new-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "first", timeout=120)
        before = replies(app)
        await submit(pilot, "/set max_new_tokens=100000")  # the next reply runs until it fails
        endless(app)
        app.post_message(events.Paste("second"))
        await until(pilot, lambda: app.input.text == "second")
        done, streamed = app.inputs_done, app.batches
        await pilot.press("enter")
        await until(pilot, lambda: app.batches > streamed, timeout=120, what="the reply to stream")
        norm = app.session.lm.model.get_parameter("model.norm.weight")
        with torch.no_grad():
            norm.fill_(float("nan"))  # as corrupt weights would: the next sample meets NaN
        await until(pilot, lambda: app.inputs_done > done and not app.busy, timeout=120, what="the turn to fail")
        await pilot.pause()
        assert notices(app, "error")[-1].startswith("the model failed during this turn")
        assert [w.text for w in app.transcript.query(UserMessage)] == ["first"] and replies(app) == before
        assert app.input.text == "second" and app.session.turns == 1


async def test_control_characters_are_drawn_as_pictures_not_sent_to_the_terminal():
    """ESC ] 2 ; ... BEL retitles the terminal window, ESC [ 41 m paints cells: text from a user,
    a model or the store must reach the screen as visible characters."""
    hostile = "hi \x1b]2;PWNED\x07 \x1b[41mRED\x1b[0m \x9b2J \x08back"
    app = make_app("--max-new-tokens", "40", "--temperature", "1")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.post_message(events.Paste(hostile))
        await until(pilot, lambda: app.input.text == hostile)
        await submit(pilot, "")
        s = app.session
        assert s.exchanges[0].user == hostile  # the chat keeps the text as typed
        (user,) = app.transcript.query(UserMessage)
        shown = str(user.render())
        assert shown == "hi ␛]2;PWNED␇ ␛[41mRED␛[0m \ufffd2J ␈back"
        replies_source = "".join(m.source for m in app.transcript.query(Markdown))
        on_screen = shown + replies_source + app.sub_title + "".join(notices(app))
        assert not any(ord(c) < 32 and c not in "\n\t" or 0x7F <= ord(c) < 0xA0 for c in on_screen)
        raw = s.exchanges[0].reply
        assert len(replies_source) >= len(raw.strip()) > 0  # the reply is all there, one picture per control


async def test_transcript_follows_the_reply_until_the_user_scrolls_up():
    app = make_app("--max-new-tokens", "80", "--temperature", "1")
    async with app.run_test(size=(100, 20)) as pilot:
        await ready(pilot)
        t = app.transcript
        await submit(pilot, "first")
        await submit(pilot, "second")
        assert t.max_scroll_y > 0 and t.scroll_y == t.max_scroll_y
        t.scroll_home(animate=False)  # what the mouse wheel / PageUp do: releases the anchor
        await pilot.pause()
        await submit(pilot, "third")
        assert t.scroll_y == 0 < t.max_scroll_y


async def test_panel_updates_while_the_model_writes():
    """From the worker's Progress events: the UI thread never reads the session, and no timer polls it.
    The SmolLM2 shape (random weights) writes slowly enough on a CPU to watch, where random:tiny
    can fill its whole context before the panel's first update."""
    import threading

    app = make_app("--model", "random:smollm2-135m", "--max-new-tokens", "100000", "--temperature", "0")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        endless(app)
        readers, stats = set(), app.session.stats

        def watched_stats() -> dict:  # the real figures, noting which thread asked
            readers.add(threading.current_thread() is threading.main_thread())
            return stats()
        app.session.stats = watched_stats
        await pilot.press(*"go", "enter")
        await until(pilot, lambda: app.batches > 0)
        seen = set()
        for _ in range(250):  # until three refreshes showed the cache growing (at most 10 s)
            seen.add(row(app, "cache_seqlens"))
            if len(seen) >= 3:
                break
            await pilot.pause(0.04)
        assert app.busy  # still writing: the figures moved during the reply, not after it
        await pilot.press("escape")
        await until(pilot, lambda: not app.busy)
        assert len(seen) >= 3, seen
        assert readers == {False}  # read once, by the worker, for the figures it ends the turn with
        assert row(app, "cache_seqlens") == f"{app.session.cache.seqlen} / {app.session.cache.capacity}"


async def test_palette_runs_commands():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "hello")
        done = app.inputs_done
        await pilot.press("ctrl+p", *"/reset")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: app.inputs_done > done and not app.busy)
        assert app.session.cache.seqlen == 0 and row(app, "cache_seqlens") == "0 / 2048"
        await pilot.press("ctrl+p", *"/system")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert app.input.text == "/system " and app.focused is app.input



async def test_narrow_terminals_hide_the_panel_and_keep_chatting():
    """At 42 columns the panel left the input box no width and Textual crashed drawing it."""
    from chatapp.tui.cache_panel import CachePanel

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "hello there")
        panel = app.query_one(CachePanel)
        assert panel.display
        for width, height in ((42, 12), (20, 8), (60, 20)):
            await pilot.resize_terminal(width, height)
            await pilot.pause()
            assert not panel.display and app.return_code is None
        await submit(pilot, "still here")
        assert len(app.session.exchanges) == 2 and replies(app)[-1] == app.session.exchanges[-1].reply
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        cache = app.session.cache
        assert panel.display and row(app, "cache_seqlens") == f"{cache.seqlen} / {cache.capacity}"


async def test_a_doubled_slash_sends_a_message_that_starts_with_one():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "//usr/bin/env crashes, why?")
        assert app.session.exchanges[0].user == "/usr/bin/env crashes, why?"
        assert [w.text for w in app.transcript.query(UserMessage)] == ["/usr/bin/env crashes, why?"]


@pytest.mark.anyio
async def test_a_streamed_list_is_on_screen_when_its_write_returns():
    """Markdown re-reads a reply's last block on every append (a long list: all of it), so the
    write awaits that work: the bridge's draw time must include it, or its back-pressure lets the
    UI starve the model (a numbered reply decoded at half the headless speed)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await app.transcript.add_user("steps?")
        reply = await app.transcript.reply()
        for n in range(1, 4):
            await reply.write(f"{n}. step {n}\n")
            md = reply.segments[0].widget
            assert len(md.query("MarkdownBullet")) == n and reply.text.count("step") == n
        await reply.finish("end")
        assert len(reply.segments[0].widget.query("MarkdownBullet")) == 3
