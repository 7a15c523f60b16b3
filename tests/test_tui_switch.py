"""/model in the real app: the palette's "Switch model…" picker lists the models, a switch runs in
the turn worker with its progress in the cache panel, and the header names the new model."""

from __future__ import annotations

import pytest
from test_session import assert_invariant
from textual.widgets import OptionList
from tui_pilot import make_app, notices, ready, replies, submit, until

from chatapp.keeper.models import DEFAULT
from chatapp.tui.model_screen import ModelScreen

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


def restore_line(app) -> str:
    return str(app.panel.query_one("#restore").render())


async def pick(pilot, app, spec: str) -> None:
    """In the open picker, move to `spec` and press Enter; wait for the switch to finish."""
    options = app.screen.query_one(OptionList)
    while options.get_option_at_index(options.highlighted).id != spec:
        await pilot.press("down")
    done = app.inputs_done
    await pilot.press("enter")
    await until(pilot, lambda: app.inputs_done > done and not app.busy, what=f"the switch to {spec}")
    await pilot.pause()


async def test_palette_picker_and_model_command_switch_with_progress_and_a_new_header(tmp_path, monkeypatch):
    # Its own model cache: the picker lists the user's converted GGUFs between the default and the recents.
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))
    app = make_app("--temperature", "0")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await submit(pilot, "hello there")
        chat_id, first_reply = app.keeper.chat_id, replies(app)
        shown = []
        show = app.panel.show_restore
        app.panel.show_restore = lambda line: (shown.append(line), show(line))[1]

        await submit(pilot, "/model random:tiny-qwen3")
        s = app.session
        assert s.lm.name == "random:tiny-qwen3" and app.keeper.chat_id == chat_id
        assert app.sub_title == f"random:tiny-qwen3 — chat #{chat_id} hello there"
        assert f"re-prefilling {s.cache.seqlen} / {s.cache.seqlen} tokens" in shown
        assert restore_line(app) == f"switched: re-prefilled {s.cache.seqlen} tokens"
        assert app.panel.row("model").value == "random:tiny-qwen3"
        assert "loading random:tiny-qwen3…" in notices(app)
        assert any(n.startswith("Switched from random:tiny to random:tiny-qwen3") for n in notices(app))
        assert replies(app) == first_reply  # the transcript is the same chat
        assert_invariant(s)
        await submit(pilot, "and on the new model?")
        assert len(replies(app)) == 2 and s.turn_stats[-1].cached_before == s.exchanges[0].end

        await submit(pilot, "/model no/such/dir")
        assert app.session is s and notices(app, "error")[-1].endswith("still on random:tiny-qwen3")

        await pilot.press("ctrl+p")
        await pilot.press(*"Switch model")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ModelScreen), what="the model picker")
        ids = [o.id for o in app.screen.query_one(OptionList).options]
        assert ids[0] == DEFAULT and ids[1:3] == ["random:tiny-qwen3", "random:tiny"]  # recent, the last first
        await pick(pilot, app, "random:tiny")
        assert app.session.lm.name == "random:tiny" and app.sub_title.startswith("random:tiny — chat #")
        assert app.keeper.store.get(chat_id).model == "random:tiny"
        assert_invariant(app.session)
