"""A real-terminal smoke test: the INSTALLED `nanochat-tui` in tmux, on random:tiny. Every wait is
on what the screen shows (tests/tmux_driver.py), so a loaded machine makes them slower, not fail."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from tmux_driver import Tmux, installed_script, shell_around

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture
def tui():
    exe = installed_script()
    if exe is None:
        pytest.skip("the nanochat-tui console script is not installed (pip install -e .)")
    argv = [exe, "--model", "random:tiny", "--seed", "1", "--max-new-tokens", "24", "--temperature", "0"]
    term = Tmux(shell_around(argv))
    yield term
    term.close()


def test_chat_reset_and_quit_in_a_real_terminal(tui):
    tui.wait_for(r"random:tiny is ready")
    tui.wait_for(r"cache_seqlens\s+0 / 2048")
    tui.type("hello there")
    tui.press("Enter")
    tui.wait_for(r"speed\s+[\d.]+ tok/s")  # the panel saw the turn end (its turns row is below the fold here)
    # the transcript may be drawn a frame after the panel: wait for the reply's end, then read it
    screen = tui.wait_for(r"cut at max_new_tokens").string
    assert "hello there" in screen and "assistant" in screen and "cut at max_new_tokens" in screen
    seqlens = int(tui.wait_for(r"cache_seqlens\s+(\d+) / 2048").group(1))
    assert seqlens > 24

    tui.type("/reset")
    tui.press("Enter")
    tui.wait_for(r"cache_seqlens\s+0 / 2048")
    tui.wait_until(lambda s: "New chat" in s and "hello there" not in s, "the new chat drawn")

    tui.press("C-q")
    done = tui.wait_for(r"EXIT=(\d+) TTY=(\w+)")
    assert done.groups() == ("0", "restored")
    assert "KV cache" not in tui.capture()  # the alternate screen is gone


def test_bytes_that_are_not_utf8_do_not_end_the_app(tui):
    """xterm's 8-bit Meta sends Alt+key as one high byte; Textual's strict decoder died on it."""
    tui.wait_for(r"random:tiny is ready")
    tui.type("abc")
    tui.press("-H", "ff")  # a raw 0xff byte: never valid in UTF-8
    tui.type("def")
    tui.wait_for(r"abc.?def")  # still running, and the half-typed message is still there
    tui.press("Enter")
    tui.wait_for(r"speed\s+[\d.]+ tok/s")
    tui.press("C-q")
    done = tui.wait_for(r"EXIT=(\d+) TTY=(\w+)")
    assert done.groups() == ("0", "restored")


def test_ctrl_y_puts_the_reply_in_the_terminals_clipboard(tui, tmp_path):
    """OSC 52 reaches a real terminal: tmux with set-clipboard on makes it a paste buffer."""
    tui.set_option("set-clipboard", "on")
    tui.wait_for(r"random:tiny is ready")
    tui.type("hello there")
    tui.press("Enter")
    tui.wait_for(r"speed\s+[\d.]+ tok/s")
    # The figures line lands just before the turn's worker ends (it still reads the session's
    # figures); a Ctrl+Y in between is refused with "still writing", as a user would see: once
    # that notice has gone, the worker has too, and Ctrl+Y again copies.
    copied = re.compile(r"Copied reply 1 of 1 \(\d+ characters\)")
    tui.press("C-y")
    while not copied.search(tui.wait_until(lambda s: copied.search(s) or "still writing" in s, "copied or refused")):
        tui.wait_until(lambda s: "still writing" not in s, "the refusal gone")
        tui.press("C-y")
    tui.type(f"/export {tmp_path / 'chat.md'}")  # the reply as the app holds it, to compare with
    tui.press("Enter")
    tui.wait_for(r"exported 1 exchange\b")
    reply = (tmp_path / "chat.md").read_text().split("## Assistant\n\n")[1].split("\n\n<!-- exported")[0]
    assert tui.buffer() == reply.strip("\n")
    tui.press("C-q")
    assert tui.wait_for(r"EXIT=(\d+) TTY=(\w+)").groups() == ("0", "restored")


def test_the_terminal_leaves_no_socket_behind():
    """Issue 44: the suite left tmux socket files in tmux's socket folder (kill-server keeps them)."""
    tmux_folder = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}"
    term = Tmux("sleep 600")
    socket = Path(term.socket)
    assert socket.is_socket() and tmux_folder not in socket.parents
    term.close()
    assert not socket.exists() and not socket.parent.exists()
