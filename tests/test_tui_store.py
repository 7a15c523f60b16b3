"""The app keeps chats: autosave, the chats screen, /save, /load, --resume, with the cache restored
from its snapshot (the store lives in the per-test NANOCHAT_TUI_CHATS dir set in conftest)."""

from __future__ import annotations

import pytest
import torch
from textual.widgets import DataTable
from tui_pilot import make_app, notices, ready, submit, until

from chatapp.tui.chats_screen import ChatsScreen
from chatapp.tui.transcript import UserMessage

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


def users(app) -> list[str]:
    return [w.text for w in app.transcript.query(UserMessage)]


async def test_chats_screen_reopens_a_chat_with_its_cache_from_the_snapshot():
    app = make_app("--temperature", "0")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        s = app.session
        await submit(pilot, "first chat, one")
        await submit(pilot, "first chat, two")
        first_id, pos = app.keeper.chat_id, s.cache.seqlen
        k_before = s.cache.k_cache[:, :, :pos].clone()
        assert first_id is not None and f"chat #{first_id}" in app.sub_title  # autosaved

        await submit(pilot, "/reset")
        await submit(pilot, "second chat")
        assert users(app) == ["second chat"] and app.keeper.chat_id != first_id

        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, ChatsScreen), what="the chats screen")
        table = app.screen.query_one(DataTable)
        assert table.row_count == 2
        while str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value) != str(first_id):
            await pilot.press("down")
        done = app.inputs_done
        await pilot.press("enter")
        await until(pilot, lambda: app.inputs_done > done and not app.busy, what="the chat to open")
        await pilot.pause()

        assert users(app) == ["first chat, one", "first chat, two"]
        assert app.keeper.chat_id == first_id and s.cache.seqlen == pos
        assert torch.equal(s.cache.k_cache[:, :, :pos], k_before)  # bit-identical, not recomputed
        restore = str(app.panel.query_one("#restore").render())
        assert restore == f"restored {pos} tokens from snapshot"
        assert any(f"Opened chat #{first_id}" in n for n in notices(app))

        await submit(pilot, "first chat, three")
        assert s.turn_stats[-1].cached_before == pos  # the next turn costs only its new tokens


async def test_save_with_a_title_then_resume_in_a_new_app():
    app = make_app("--temperature", "0")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "remember me")
        await submit(pilot, "/save My title")
        assert any("“My title”" in n for n in notices(app))
        chat_id, pos = app.keeper.chat_id, app.session.cache.seqlen

    again = make_app("--resume")
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert again.keeper.chat_id == chat_id and users(again) == ["remember me"]
        assert again.session.cache.seqlen == pos
        assert str(again.panel.query_one("#restore").render()) == f"restored {pos} tokens from snapshot"
        assert again.sub_title.endswith(f"chat #{chat_id} My title")


async def test_no_store_says_so():
    app = make_app("--no-store")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "/save x")
        assert any("not stored" in n or "not kept" in n for n in notices(app, "error"))


async def test_resume_shows_trimmed_exchanges_dimmed():
    msgs = [f"important fact number {i} to remember" for i in range(6)]
    app = make_app("--temperature", "0", "--context", "160", "--max-new-tokens", "8")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for m in msgs:
            await submit(pilot, m)
        assert app.session.trimmed  # the context was trimmed on the way
        kept = len(app.session.exchanges)

    app = make_app("--resume", "--context", "160", "--max-new-tokens", "8")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await until(pilot, lambda: users(app) == msgs, what="the whole chat on screen")
        dimmed = [w.has_class("trimmed") for w in app.transcript.query(UserMessage)]
        assert dimmed == [True] * (len(msgs) - kept) + [False] * kept


def restore_line(app) -> str:
    """The panel's "restored …" line, "" while it is hidden."""
    line = app.panel.query_one("#restore")
    return str(line.render()) if line.display else ""


async def test_undo_or_retry_into_an_opened_chat_takes_back_the_restore_line():
    """The line says how the opened chat's cache came back. It stays while the cache still holds
    all of that, and goes once an /undo or a /retry rewinds into it (or a trim recomputes it)."""
    app = make_app("--temperature", "0", "--context", "256", "--max-new-tokens", "8")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        s = app.session
        await submit(pilot, "one")
        await submit(pilot, "two")
        first = app.keeper.chat_id
        await submit(pilot, "/reset")
        await submit(pilot, "other")
        second = app.keeper.chat_id

        await submit(pilot, f"/load {first}")
        line = f"restored {s.cache.seqlen} tokens from snapshot"
        assert restore_line(app) == line
        await submit(pilot, "three")
        await submit(pilot, "/undo")  # takes back only what came after the restore
        assert restore_line(app) == line
        await submit(pilot, "/undo")  # now into what was restored
        assert restore_line(app) == "" and users(app) == ["one"]
        await submit(pilot, "two again")
        assert restore_line(app) == ""  # and it does not come back

        await submit(pilot, f"/load {second}")
        assert restore_line(app).startswith("restored ")
        await submit(pilot, "/retry")  # the restored reply is generated anew
        assert restore_line(app) == ""

        await submit(pilot, f"/load {first}")
        assert restore_line(app).startswith("restored ")
        await submit(pilot, "y" * 150)  # the context is full: everything kept is re-prefilled
        assert s.trimmed and restore_line(app) == ""


async def test_a_chat_undone_to_nothing_leaves_the_chats_list_and_the_next_message_starts_one():
    app = make_app("--temperature", "0")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "oops")
        gone = app.keeper.chat_id
        assert app.sub_title.endswith(f"chat #{gone} oops")
        await submit(pilot, "/undo")
        assert app.keeper.chat_id is None and app.sub_title == "random:tiny"
        assert f"chat #{gone} is empty now, so it is no longer stored" in notices(app)
        assert app.keeper.store.list() == []
        await submit(pilot, "meant this")
        new = app.keeper.chat_id
        assert new not in (None, gone) and app.sub_title.endswith(f"chat #{new} meant this")
        assert [c.title for c in app.keeper.store.list()] == ["meant this"]


async def test_the_header_drops_the_chat_name_after_reset_even_when_the_store_is_slow(monkeypatch):
    """The keeper detaches from the stored chat after its last /reset event; on a busy machine
    the app used to redraw the header before that and keep the old chat's name for good."""
    import time

    from chatapp.keeper.keeper import ChatKeeper

    detach = ChatKeeper.detach
    monkeypatch.setattr(ChatKeeper, "detach", lambda self: (time.sleep(0.05), detach(self))[1])
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "hello there")
        assert f"chat #{app.keeper.chat_id}" in app.sub_title
        await submit(pilot, "/reset")
        assert app.keeper.chat_id is None and app.sub_title == "random:tiny"


async def test_a_chat_picked_while_a_turn_runs_behind_the_chats_screen_is_refused():
    """The palette can start /retry with the chats screen open; opening a chat then used to run
    /load in a second thread on the same session, mid-decode, and store a corrupt cache."""
    from tui_pilot import endless

    # The SmolLM2 shape decodes slowly enough on a CPU that the retry is still running.
    app = make_app("--model", "random:smollm2-135m", "--context", "512", "--temperature", "1",
                   "--max-new-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "first chat", timeout=120)
        first = app.keeper.chat_id
        await submit(pilot, "/reset")
        await submit(pilot, "second chat", timeout=120)
        second, turns = app.keeper.chat_id, app.session.turns
        await submit(pilot, "/set max_new_tokens=100000")
        endless(app)
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, ChatsScreen), what="the chats screen")
        app.start_turn(lambda: app.keeper.run_command("/retry"), "command")  # as the palette does
        await until(pilot, lambda: app.busy and app.batches > 0, what="the retry to stream")
        await pilot.press("down", "enter")  # the first chat
        await pilot.pause(0.3)
        assert app.keeper.chat_id == second and app.busy
        await pilot.press("escape")
        await until(pilot, lambda: not app.busy, what="the retry to stop")
        assert app.keeper.chat_id == second != first and app.session.turns == turns


async def test_renaming_the_open_chat_sticks():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "alpha")
        chat_id = app.keeper.chat_id
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, ChatsScreen), what="the chats screen")
        await pilot.press("r", "ctrl+a", "ctrl+k", *"Project notes", "enter")
        await pilot.pause()
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="the chat")
        assert app.sub_title.endswith(f"chat #{chat_id} Project notes")
        await submit(pilot, "beta")  # the autosave keeps the new name
        assert app.keeper.store.get(chat_id).title == "Project notes"
