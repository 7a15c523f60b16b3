"""What a daily user reaches for in the app: the input's live token count, the chats list's
search box, message numbers."""

import time

import pytest
from tui_pilot import make_app, notices, ready, row, submit, until


@pytest.mark.anyio
async def test_the_input_counts_its_tokens_as_you_type():
    app = make_app("--no-store", "--context", "64")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press(*"hello there")
        want = f"{len(app.session.tokenizer.encode('hello there'))} tokens"
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
        assert any("cache_seqlens " in n for n in notices(app))
        await submit(pilot, "/edit 2 another second")
        assert not any("cache_seqlens " in n for n in notices(app))  # it described a turn that is gone
        assert [ex.user.border_title for ex in t.exchanges] == ["you #1", "you #2"]
        assert t.exchanges[-1].user.text == "another second"


@pytest.mark.anyio
async def test_a_long_prefill_shows_its_progress_and_the_turn_in_flight():
    """A 900-token message, prefilled 32 tokens at a time with a pause after each piece, so it
    lasts long enough to watch on any machine (the tiny model alone prefills it in a blink):
    the transcript's bar and the panel's turn rows count the real cache as it fills, then give
    way to the reply and the finished turn's figures."""
    from chatapp.tui.transcript import LoadStatus

    app = make_app("--no-store", "--temperature", "0", "--max-new-tokens", "2")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        gen, real_prefill = app.session.gen, app.session.gen.prefill
        gen.prefill_chunk = 32  # the session prefills (and reports progress) a chunk at a time

        def slow_prefill(ids: list[int]) -> None:   # the real prefill, slowed down
            real_prefill(ids)
            time.sleep(0.05)
        gen.prefill = slow_prefill
        words = " ".join(f"w{i}" for i in range(200))
        assert 700 < len(app.session.tokenizer.encode(words)) < app.session.message_room
        app.input.text = words
        await pilot.press("enter")
        seen, end = [], time.monotonic() + 60
        while (app.busy or not seen) and time.monotonic() < end:
            for bar in app.transcript.query(LoadStatus):
                section = app.panel.query_one("#turn-section").render()
                seen.append((str(bar.note.render()), row(app, "prefill"), section))
            await pilot.pause(0.05)
        text, prefill, section = seen[len(seen) // 2]
        assert text.startswith("prefilling ") and " tokens (" in text and "tok/s" in text
        done, total = (int(x.replace(",", "")) for x in prefill.split(" / "))
        assert 0 < done < total and str(section) == "this turn"
        assert not app.transcript.query(LoadStatus)  # gone with the first text
        assert row(app, "prefill").endswith(" new")
        assert str(app.panel.query_one("#turn-section").render()) == "last turn"
