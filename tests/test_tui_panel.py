"""The cache panel on a small terminal, F2 and /panel, its turn history across --resume and /load,
its labels, and the help screen at 80 columns: the real app on random:tiny through Pilot."""

from __future__ import annotations

import pytest
from textual.widgets import Sparkline, Static
from tui_pilot import make_app, ready, row, submit, until

from chatapp.tui.cache_panel import LABEL_WIDTH, StatusLine, backend_label

pytestmark = pytest.mark.anyio


def status_text(app) -> str:
    return str(app.query_one(StatusLine).render())


async def test_at_80x24_the_panel_folds_to_a_status_line_and_f2_shows_it():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await submit(pilot, "hello")
        s, status = app.session, app.query_one(StatusLine)
        assert not app.panel.display and status.display
        assert app.transcript.size.width >= 70, app.transcript.size
        line = status_text(app)
        assert f"KV {s.cache.seqlen} / {s.cache.capacity}" in line and "RSS " in line and "tok/s" in line, line
        assert status.region.width <= 80 and status.region.height == 1

        await pilot.press("f2")  # shown on request, the chat narrower
        await pilot.pause()
        assert app.panel.display and not status.display and app.transcript.size.width < 70
        await pilot.press(*"/panel", "enter")  # and hidden again (the screen serves it: no turn)
        await pilot.pause()
        assert not app.panel.display and status.display and app.transcript.size.width >= 70


async def test_f2_hides_the_panel_on_a_wide_terminal_and_a_narrow_one_refuses_it():
    app = make_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(pilot)
        assert app.panel.display and not app.query_one(StatusLine).display
        await pilot.press("f2")
        await pilot.pause()
        assert not app.panel.display and app.query_one(StatusLine).display
        assert app.transcript.size.width >= 110
    narrow = make_app()
    async with narrow.run_test(size=(60, 24)) as pilot:
        await ready(pilot)
        await pilot.press("f2")  # 60 columns cannot hold it: the chat keeps them
        await pilot.pause()
        assert not narrow.panel.display and narrow.query_one(StatusLine).display


async def test_the_turn_history_survives_resume_and_load():
    app = make_app("--temperature", "0")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        for text in ("one", "two", "three", "four"):
            await submit(pilot, text)
        first = app.session.turn_stats[0].prefill_tokens
        chat_id = app.keeper.chat_id
        assert row(app, "turns").startswith("4, max")
        await submit(pilot, "/reset")
        assert row(app, "turns") == "—"
        await submit(pilot, f"/load {chat_id}")  # the panel was "turns —" on a reopened chat
        loaded = app.query_one("#history", Sparkline).data
        assert len(loaded) == 4 and loaded[0] == first and all(n > 0 for n in loaded), loaded
        assert row(app, "turns") == f"4, max {max(loaded)}"

    again = make_app("--resume")
    async with again.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert again.keeper.chat_id == chat_id
        assert again.query_one("#history", Sparkline).data == loaded
        assert row(again, "turns") == f"4, max {max(loaded)}"
        await submit(pilot, "five")  # a new turn adds its measured figure after the stored ones
        history = again.query_one("#history", Sparkline).data
        assert history[:4] == loaded and history[4] == again.session.turn_stats[-1].prefill_tokens
        assert row(again, "turns") == f"5, max {max(history)}"


def test_the_backend_label_names_the_engine_and_stays_put():
    assert backend_label("c", "cpu") == backend_label("c+sdpa", "cpu") == "C kernels"
    assert backend_label("sdpa", "cpu") == "SDPA" and backend_label("fa3+sdpa", "cuda:0") == "FA3+SDPA"
    assert backend_label("llamacpp", "remote") == "llamacpp"
    assert LABEL_WIDTH + len("C kernels") <= 33


async def test_the_help_screen_keeps_its_columns_at_80():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        await pilot.pause()
        texts = list(app.screen.query(".help-text").results(Static))
        keys = list(app.screen.query(".help-key").results(Static))
        assert len(texts) == len(keys) > 20
        assert len({t.region.x for t in texts}) == 1  # every description starts in one column
        assert all(t.region.x == k.region.right for k, t in zip(keys, texts, strict=True))
        assert any(t.region.height > 1 for t in texts)  # long ones wrap, within their column
        assert all(t.region.right <= 80 for t in texts)


async def test_f2_works_while_the_model_loads():
    app = make_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("f2")
        await pilot.pause()
        assert not app.panel.display
        await until(pilot, lambda: app.session is not None, what="the model")
