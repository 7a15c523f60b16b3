"""Drive a command in a real terminal: a private tmux server, keys in, pane text out.

Each `Tmux` has its own server on a socket in a temp folder of its own (`-S`), never in tmux's
socket folder (/tmp/tmux-UID), and `close` kills the server and removes the folder: tmux's
kill-server leaves its socket file behind. Waits are on the screen's state: `wait_for` polls
the pane until it shows what the test waits for; its deadline only turns a hang into a failure
with the screen in the message, far past what a machine at load 8 needs (issue 44: 60 s waits
failed 3 of 3 there).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

DEADLINE = 300.0  # seconds: a failure's latest moment, not a wait (the app takes what it takes)


def installed_script() -> str | None:
    """The `nanochat-tui` console script of this environment (the venv's bin, then PATH)."""
    return shutil.which("nanochat-tui", path=str(Path(sys.executable).parent)) or shutil.which("nanochat-tui")


class Tmux:
    """One tmux server of our own (its own -S socket), so a user's tmux is never touched."""

    def __init__(self, command: str, size: tuple[int, int] = (120, 40), name: str = "nanochat") -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="nct-tmux-"))  # short: a socket path holds < 108 bytes
        self.socket = str(self.folder / "socket")
        self.target = name
        w, h = size
        try:
            self._tmux("new-session", "-d", "-s", name, "-x", str(w), "-y", str(h), command)
            self._tmux("resize-window", "-t", name, "-x", str(w), "-y", str(h))  # no client: pin the size
        except BaseException:
            self.close()
            raise

    def _tmux(self, *args: str) -> str:
        # Without COLUMNS and LINES: an earlier App.run_test in this process leaves them in the
        # environment, the server hands them to the app, and Textual takes them over the pane's
        # size (the app drew 80x24 in a 120x40 window, and folded its panel).
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        out = subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=DEADLINE,
                             env=env)
        if out.returncode:
            raise RuntimeError(f"tmux {args[0]}: {out.stderr.strip()}")
        return out.stdout

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", self.target, "-l", text)

    def press(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.target, *keys)

    def capture(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.target)

    def set_option(self, name: str, value: str) -> None:
        self._tmux("set-option", "-g", name, value)

    def buffer(self) -> str:
        """The newest paste buffer: what an application copied through OSC 52 (set-clipboard on)."""
        return self._tmux("show-buffer")

    def wait_for(self, pattern: str) -> re.Match:
        """The first match of `pattern` on the screen, once the screen shows one."""
        return re.search(pattern, self.wait_until(lambda screen: re.search(pattern, screen) is not None,
                                                  f"{pattern!r} on screen"))

    def wait_until(self, shown: Callable[[str], bool], what: str) -> str:
        """The first screen for which `shown(screen)` holds (polled every 50 ms)."""
        end = time.monotonic() + DEADLINE
        while not shown(screen := self.capture()):
            if time.monotonic() > end:
                raise AssertionError(f"never {what} (in {DEADLINE:.0f} s):\n{screen}")
            time.sleep(0.05)
        return screen

    def close(self) -> None:
        """Kill the server and remove its socket: nothing of this terminal is left."""
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=DEADLINE)
        shutil.rmtree(self.folder, ignore_errors=True)


def shell_around(argv: list[str]) -> str:
    """Run argv between two `stty -g` readings, then report its exit status and whether the
    terminal modes came back as they were; sleep so the pane stays readable."""
    cmd = shlex.join(argv)
    return ("sh -c " + shlex.quote(f'b=$(stty -g); {cmd}; rc=$?; a=$(stty -g); '
                                   f'[ "$a" = "$b" ] && t=restored || t=changed; '
                                   f'printf "\\nEXIT=%s TTY=%s\\n" "$rc" "$t"; sleep 600'))
