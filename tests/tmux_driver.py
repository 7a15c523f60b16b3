"""Drive a command in a real terminal: a private tmux server, keys in, pane text out."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path


def installed_script() -> str | None:
    """The `nanochat-tui` console script of this environment (the venv's bin, then PATH)."""
    return shutil.which("nanochat-tui", path=str(Path(sys.executable).parent)) or shutil.which("nanochat-tui")


class Tmux:
    """One tmux server of our own (-L socket), so a user's tmux is never touched."""

    def __init__(self, command: str, size: tuple[int, int] = (120, 40), name: str = "nanochat") -> None:
        self.socket = f"nanochat-test-{os.getpid()}-{time.monotonic_ns()}"
        self.target = name
        w, h = size
        self._tmux("new-session", "-d", "-s", name, "-x", str(w), "-y", str(h), command)
        self._tmux("resize-window", "-t", name, "-x", str(w), "-y", str(h))  # no client: pin the size

    def _tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
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

    def wait_for(self, pattern: str, timeout: float = 60.0, poll: float = 0.05) -> re.Match:
        end = time.monotonic() + timeout
        while True:
            if m := re.search(pattern, self.capture()):
                return m
            if time.monotonic() > end:
                raise AssertionError(f"{pattern!r} not on screen after {timeout}s:\n{self.capture()}")
            time.sleep(poll)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def shell_around(argv: list[str]) -> str:
    """Run argv between two `stty -g` readings, then report its exit status and whether the
    terminal modes came back as they were; sleep so the pane stays readable."""
    cmd = shlex.join(argv)
    return ("sh -c " + shlex.quote(f'b=$(stty -g); {cmd}; rc=$?; a=$(stty -g); '
                                   f'[ "$a" = "$b" ] && t=restored || t=changed; '
                                   f'printf "\\nEXIT=%s TTY=%s\\n" "$rc" "$t"; sleep 600'))
