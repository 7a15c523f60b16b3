"""Pilot tests of copying (Ctrl+Y, /copy, the code cursor), /file and large pastes in the real app
on random:tiny with the real store. `app.clipboard` is what `copy_to_clipboard` sent as OSC 52;
tests/test_tmux.py checks that a real terminal (tmux) receives it."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from textual import events
from tui_pilot import endless, make_app, notices, ready, submit, until

import chatapp.tui.input as chat_input
from chatapp.chat.kinds import Part, answer_text
from chatapp.tui.transcript import UserMessage

SIZE = (120, 40)
pytestmark = pytest.mark.anyio
CODE_REPLY = "Two ways:\n\n```python\nprint(1)\n```\n\nor\n\n```\nx = `2`\n```\n"


async def enter(pilot, line: str) -> None:
    """`submit` without typing each key (a temp path is long): the box's text, then Enter."""
    app, done = pilot.app, pilot.app.inputs_done
    app.input.load_text(line)
    await pilot.press("enter")
    await until(pilot, lambda: app.inputs_done > done and not app.busy, what=f"{line!r} to finish")


@pytest.fixture(autouse=True)
def _no_tmux(monkeypatch):
    """Outside tmux: OSC 52 alone (tests/test_daily_use.py copies inside tmux)."""
    monkeypatch.delenv("TMUX", raising=False)


def toasts(app) -> list[str]:
    return [n.message for n in app._notifications]


async def test_ctrl_y_and_copy_n_put_a_reply_on_the_clipboard():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        endless(app)  # replies of exactly --max-new-tokens: never empty
        await submit(pilot, "hello")
        await submit(pilot, "again")
        s = app.session
        first, last = (answer_text(s.reply_parts(ex)) for ex in s.exchanges)
        done = app.inputs_done
        await pilot.press("ctrl+y")
        await until(pilot, lambda: app.inputs_done > done, what="Ctrl+Y's /copy")
        assert app.clipboard == last and app.input.text == ""
        assert toasts(app)[-1] == (f"Sent reply 2 of 2 ({len(last):,} characters) to the terminal's clipboard "
                                   "(OSC 52: the terminal does not confirm it)")

        await submit(pilot, "/copy 1")
        assert app.clipboard == first
        await submit(pilot, "/copy -2")
        assert app.clipboard == first and toasts(app)[-1].startswith("Sent reply 1 of 2")
        await submit(pilot, "/copy 3")
        assert notices(app, "error")[-1] == "/copy: there are 2 replies; N is 1 to 2, or -1 to -2 counting back"
        assert app.clipboard == first


async def test_the_code_cursor_selects_and_copies_code_blocks():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        t = app.transcript
        await t.add_exchange("show me code", [Part("answer", CODE_REPLY)], [])
        await pilot.pause()
        await pilot.press("c")  # the input box has focus: a plain letter
        assert app.input.text == "c" and app.clipboard == ""

        t.focus()
        await pilot.press("left_square_bracket")  # from none: the last block
        first, second = t.code_blocks()
        assert t.selected is second and second.has_class("-code-selected")
        await pilot.press("left_square_bracket", "left_square_bracket")  # stops at the first
        assert t.selected is first and not second.has_class("-code-selected")
        await pilot.press("c")
        assert app.clipboard == "print(1)" and toasts(app)[-1].startswith("Sent code block 1 of 2 (8 characters) to")
        await pilot.press("right_square_bracket", "c")
        assert app.clipboard == "x = `2`"

        await pilot.click(first)
        assert t.selected is first


async def test_file_attaches_to_the_next_message_which_the_store_keeps(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\nremember the milk\n")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for bad, why in [(tmp_path / "nope.txt", "cannot read it (No such file or directory)"),
                         (tmp_path, "a directory, not a file")]:
            await enter(pilot, f"/file {bad}")
            assert notices(app, "error")[-1] == f"/file {bad}: {why}"
        await enter(pilot, f"/file {notes}")
        assert notices(app)[-1].startswith(f"attached {notes} (26 bytes, ")
        assert app.input.border_subtitle.startswith(f"attached: {notes} (")

        await submit(pilot, "what is in it?")
        (msg,) = app.transcript.query(UserMessage)
        assert msg.text == "what is in it?" and msg.border_subtitle == f"with {notes}"
        sent = f"```{notes}\n# Notes\nremember the milk\n```\n\nwhat is in it?"
        assert app.session.exchanges[0].user == sent
        assert app.input.border_subtitle == "" and not app.session.attached.files  # gone with the message
        stored = app.keeper.store.get(app.keeper.chat_id)
        assert stored.messages[0].content == sent


async def test_a_large_paste_becomes_an_attachment_and_typing_stays_fast(monkeypatch):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for text in ("x" * 1_000_000, ("y" * 79 + "\n") * 12_500):  # 1 MB on one line, and in lines
            done = app.inputs_done
            app.input.post_message(events.Paste(text))
            await until(pilot, lambda done=done: app.inputs_done > done, what="the paste to be attached")
            assert app.input.text == ""
            assert notices(app, "error")[-1].startswith("pasted text: too large for the context: 1.0 MB is far "
                                                        "more than the")  # random:tiny holds 2048 tokens
        latencies = []
        for ch in "abcdefgh":
            before = app.input.text
            t0 = time.perf_counter()
            app.post_message(events.Key(ch, ch))
            while app.input.text == before:
                await asyncio.sleep(0.001)
            await pilot.pause()  # drawn, not just in the document
            latencies.append(time.perf_counter() - t0)
        print(f"keystroke after a 1 MB paste: median {statistics.median(latencies) * 1000:.1f} ms")
        assert statistics.median(latencies) < 0.1, latencies

        monkeypatch.setattr(chat_input, "PASTE_LIMIT", 20)  # one that fits random:tiny's context
        app.input.post_message(events.Paste("a pasted paragraph, long enough"))
        await until(pilot, lambda: bool(app.session.attached.files), what="the paste to be attached")
        await until(pilot, lambda: not app.busy)
        assert notices(app)[-1].startswith("attached pasted text (31 bytes, ")
        assert app.input.text == "abcdefgh" and app.input.border_subtitle.startswith("attached: pasted text (")
        await pilot.press("enter")
        await until(pilot, lambda: app.session.exchanges and not app.busy, what="the message to be sent")
        assert app.session.exchanges[0].user == "```pasted text\na pasted paragraph, long enough\n```\n\nabcdefgh"
