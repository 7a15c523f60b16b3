"""What a daily user tripped on (issue 44, finding 4), each through the real app on random:tiny:
titles from the user's own words, a /theme choice kept in the config file and back at start,
copy inside a stock tmux (set-clipboard external) that says where the text went."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from tui_pilot import endless, make_app, ready, submit, until

from chatapp.chat.kinds import answer_text
from chatapp.config import config_path, load_config

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


async def enter(pilot, line: str) -> None:
    """Submit a line without typing each key (a temp path is long)."""
    app, done = pilot.app, pilot.app.inputs_done
    app.input.load_text(line)
    await pilot.press("enter")
    await until(pilot, lambda: app.inputs_done > done and not app.busy, what=f"{line!r} to finish")


def toasts(app) -> list[str]:
    return [n.message for n in app._notifications]


async def test_a_title_is_the_users_words_not_the_attached_files_fence(tmp_path):
    src = tmp_path / "notes.py"
    src.write_text("def main():\n    return 42\n")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await enter(pilot, f"/file {src}")
        await submit(pilot, "what does this do?")
        assert app.session.exchanges[0].user.startswith(f"```{src}\n")  # the model reads the file first
        assert app.keeper.title == "what does this do?"
        assert [c.title for c in app.keeper.store.list()] == ["what does this do?"]
        assert app.sub_title.endswith("what does this do?")


async def test_a_theme_chosen_is_kept_in_the_config_file_and_back_at_start():
    path = config_path()  # the test's own (conftest points NANOCHAT_TUI_CONFIG at a temp file)
    path.write_text("# mine\nmodel = \"random:tiny\"\n\n[sampling]\ntemperature = 0.5\n")
    app = make_app("--no-store")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"/theme nord", "enter")  # the app serves it: no turn to wait for
        await until(pilot, lambda: f"Theme nord, kept in {path}" in toasts(app), what="the theme to be kept")
        assert app.theme == "nord" and load_config().theme == "nord"
        app.action_themes()  # the picker: a choice there is kept the same way
        await until(pilot, lambda: app.screen.__class__.__name__ == "CommandPalette", what="the picker")
        await pilot.press(*"dracula", "enter")
        await until(pilot, lambda: load_config().theme == "dracula", what="the picked theme to be kept")
    assert path.read_text() == KEPT  # one line added, the rest as the user wrote it
    # back at start: tests/test_config.py::test_theme_from_the_config_then_slash_theme


KEPT = "# mine\nmodel = \"random:tiny\"\ntheme = \"dracula\"\n\n[sampling]\ntemperature = 0.5\n"


@pytest.fixture
def stock_tmux(tmp_path, monkeypatch):
    """A tmux server of our own, as tmux ships (set-clipboard external), that this process is
    "inside" ($TMUX names its socket); the server and its socket go at the end."""
    sock = tmp_path / "tmux.sock"
    run = ["tmux", "-S", str(sock), "-f", "/dev/null"]
    subprocess.run([*run, "new-session", "-d", "-s", "t"], check=True, timeout=30)
    try:
        subprocess.run([*run, "set-option", "-g", "set-clipboard", "external"], check=True, timeout=30)
        monkeypatch.setenv("TMUX", f"{sock},{os.getpid()},0")
        yield lambda *args: subprocess.run([*run, *args], capture_output=True, text=True, timeout=30)
    finally:
        subprocess.run([*run, "kill-server"], capture_output=True, timeout=30)
        sock.unlink(missing_ok=True)


async def test_copy_in_a_stock_tmux_goes_to_its_paste_buffer_and_says_so(stock_tmux):
    """Ctrl+Y said "Copied reply 1 (241 characters)" in a stock tmux, where OSC 52 lands nowhere."""
    app = make_app("--no-store")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        endless(app)
        await submit(pilot, "hello")
        reply = answer_text(app.session.reply_parts(app.session.exchanges[-1]))
        done = app.inputs_done
        await pilot.press("ctrl+y")
        await until(pilot, lambda: app.inputs_done > done, what="Ctrl+Y's /copy")
        assert stock_tmux("show-buffer").stdout == reply
        assert toasts(app)[-1] == (f"Copied reply 1 of 1 ({len(reply):,} characters) to tmux's paste buffer "
                                   "(Prefix ] pastes it); tmux passes it to the terminal, which does not confirm it")


async def test_copy_where_tmux_refuses_goes_to_a_file_and_never_says_copied(tmp_path, monkeypatch, home):
    monkeypatch.setenv("TMUX", f"{tmp_path / 'no-such-server'},1,0")
    app = make_app("--no-store")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        endless(app)
        await submit(pilot, "hello")
        reply = answer_text(app.session.reply_parts(app.session.exchanges[-1]))
        await submit(pilot, "/copy")
        line = toasts(app)[-1]
        saved = Path(home) / "copied.txt"
        assert line.startswith("Not copied to a clipboard (") and line.endswith(
            f"reply 1 of 1 ({len(reply):,} characters) is in {saved}")
        assert "Copied" not in line and saved.read_text() == reply


async def test_tab_completes_a_command_name_from_the_table():
    """Slash commands had no completion (issue 44)."""
    app = make_app("--no-store", "--temperature", "0")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"/se", "tab")
        assert app.input.text == "/set " and app.focused is app.input  # one match: the name and a space
        await pilot.press(*"temperature 0.7", "enter")  # NAME VALUE, as typed (it said "got ''")
        await until(pilot, lambda: app.session.settings.temperature == 0.7, what="/set temperature 0.7")
        await pilot.press(*"/s", "tab")
        assert app.input.text == "/s" and toasts(app)[-1] == "/system  /set  /stats  /save"
        await pilot.press(*"ta", "tab")
        assert app.input.text == "/stats"  # no argument: no space
        app.input.load_text("/nope")
        await pilot.press("tab")
        assert app.focused is app.input and toasts(app)[-1] == "No command starts with /nope; /help lists them"
        app.input.load_text("hello")
        await pilot.press("tab")  # not a command: Tab moves on to the transcript, as before
        assert app.focused is app.transcript


MALFORMED = "Here:\n\ndef area(r):\n    # the formula\n    return 3.14 * r * r\n"  # unfenced, as small models write


async def test_raw_shows_a_reply_as_the_model_wrote_it():
    """Unfenced code lost its indentation and a comment became a heading; no raw view existed."""
    from chatapp.chat.kinds import Part
    from chatapp.tui.raw_view import RawScreen

    app = make_app("--no-store")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        t = app.transcript
        await t.add_exchange("area?", [Part("answer", MALFORMED)], [])
        await t.add_exchange("code?", [Part("answer", "```python\nprint(1)\n```\n")], [])
        await pilot.pause()
        app.input.load_text("/raw 1")  # the app serves it: no turn to wait for
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RawScreen), what="the raw view")
        assert app.screen.query_one("#raw").text == MALFORMED
        assert app.screen.query_one("Vertical").border_title == "reply 1 of 2, raw text"
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RawScreen), what="Esc to close it")
        app.input.load_text("/raw 3")
        await pilot.press("enter")
        await pilot.pause()
        assert toasts(app)[-1] == "/raw: there are 2 replies; N is 1 to 2, or -1 to -2 counting back"
        t.focus()
        await pilot.press("r")  # on the transcript, nothing selected: the last reply
        await until(pilot, lambda: isinstance(app.screen, RawScreen), what="r's raw view")
        assert app.screen.query_one("#raw").text == "```python\nprint(1)\n```\n"
