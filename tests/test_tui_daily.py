"""What a daily user reaches for in the app: the input's live token count, the chats list's
search box, message numbers."""

import pytest
from tui_pilot import make_app, notices, ready, submit, until


@pytest.mark.anyio
async def test_the_input_counts_its_tokens_as_you_type():
    app = make_app("--no-store", "--context", "64")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press(*"hello there")
        want = f"{len(app.session.tok.encode('hello there'))} tokens"
        await until(pilot, lambda: app.input.border_subtitle == want, what=want)
        app.input.text = "word " * 200
        await until(pilot, lambda: "more than the" in str(app.input.border_subtitle), what="the room warning")
        app.input.text = "/set"
        await until(pilot, lambda: app.input.border_subtitle == "", what="no count for a command")


@pytest.mark.anyio
async def test_messages_are_numbered_as_edit_takes_them_and_a_rewind_clears_what_followed():
    app = make_app("--temperature", "0", "--max-new-tokens", "3")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await submit(pilot, "first")
        await submit(pilot, "second")
        await submit(pilot, "/stats")
        t = app.transcript
        assert [ex.user.border_title for ex in t.exchanges] == ["you #1", "you #2"]
        assert [ex.reply.border_title for ex in t.exchanges] == ["assistant #1", "assistant #2"]
        assert any("cache_seqlens=" in n for n in notices(app))
        await submit(pilot, "/edit 2 another second")
        assert not any("cache_seqlens=" in n for n in notices(app))  # it described a turn that is gone
        assert [ex.user.border_title for ex in t.exchanges] == ["you #1", "you #2"]
        assert t.exchanges[-1].user.text == "another second"
