"""Editing an earlier message in the real app: Up recalls and highlights it, Ctrl+E edits it,
Enter sends `/edit N TEXT` through the keeper, the transcript is redrawn from N on, and the
old continuation is a stored chat (the real store, in the test's chats dir)."""

from __future__ import annotations

import pytest
from helpers import assert_invariant
from tui_pilot import make_app, notices, ready, replies, row, submit, until

from chatapp.tui.transcript import UserMessage

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


def shown(app) -> list[str]:
    return [w.text for w in app.transcript.query(UserMessage)]


def selected(app) -> list[str]:
    return [w.text for w in app.transcript.query("UserMessage.selected")]


async def test_up_then_ctrl_e_edits_the_recalled_message_and_keeps_the_old_continuation():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for text in ("one", "two", "three"):
            await submit(pilot, text)
        s, box = app.session, app.input
        start = s.exchanges[1].start
        await pilot.press("up", "up")
        await pilot.pause()
        assert box.text == "two" and selected(app) == ["two"]  # the recalled message, highlighted
        await pilot.press("ctrl+e")
        await pilot.pause()
        assert box.editing == 2 and box.border_title.startswith("editing message 2")
        box.load_text("")  # the edit itself is typed
        done = app.inputs_done
        await pilot.press(*"deux", "enter")
        await until(pilot, lambda: app.inputs_done > done and not app.busy, 60, "the edit's turn")
        await pilot.pause()
        assert shown(app) == ["one", "deux"] and len(replies(app)) == 2 and not selected(app)
        assert box.editing is None and not box.border_title and box.text == ""
        st = s.turn_stats[-1]
        assert (st.turn, st.cached_before) == (2, start)
        assert row(app, "cached") == f"{start} reused"
        assert row(app, "turns").startswith("2, ")  # the figures of turns 2 and 3 went with them
        assert "Edited message 2; the old continuation is kept as chat #2." in notices(app)
        assert_invariant(s)
        store = app.keeper.store
        assert [m.content for m in store.get(2).messages][0::2] == ["one", "two", "three"]
        assert store.get(2).title == "one (branch from #1, message 2)" and app.keeper.chat_id == 1


async def test_ctrl_e_edits_the_last_message_up_chooses_another_and_esc_cancels():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        box = app.input
        await pilot.press("ctrl+e")
        await pilot.pause()
        assert box.editing is None  # nothing to edit yet: a notification says so
        await submit(pilot, "first")
        await submit(pilot, "second")
        await pilot.press("ctrl+e")
        await pilot.pause()
        assert (box.editing, box.text, selected(app)) == (2, "second", ["second"])
        await pilot.press("up")
        await pilot.pause()
        assert (box.editing, box.text, selected(app)) == (1, "first", ["first"])
        await pilot.press("escape")
        await pilot.pause()
        assert (box.editing, box.text, selected(app)) == (None, "", [])
        assert shown(app) == ["first", "second"]
        await submit(pilot, "/edit 1 typed as a command")  # the command works in the box as well
        assert shown(app) == ["typed as a command"] and app.session.turns == 1
        assert_invariant(app.session)
