"""What a daily user reaches for in the app: the input's live token count, the chats list's
search box, message numbers."""

import pytest
from tui_pilot import make_app, ready, until


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
