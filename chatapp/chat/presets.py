"""System-prompt presets: `/preset NAME` starts a new chat with a saved system prompt.

Two sources: the config file's `[presets]` (read-only here: the user edits that file) and the
ones saved with `/preset save NAME` (a small JSON file next to the chats; written atomically).
A saved preset may not shadow a config one, so a name always means one text.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from chatapp.chat.events import Event, Info
from model.errors import UserError
from model.files import read_bytes

MAX_PRESETS_BYTES = 1 << 20  # system prompts by name: a few kB in real use

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
USAGE = "/preset [NAME | save NAME | delete NAME]"


class Presets:
    def __init__(self, configured: dict[str, str] | None = None, file: Path | None = None):
        self.configured = dict(configured or {})
        self.file = file

    def saved(self) -> dict[str, str]:
        """The saved presets; a missing or damaged file is none (it is only a convenience)."""
        if self.file is None:
            return {}
        try:
            data = json.loads(read_bytes(self.file, "presets file", MAX_PRESETS_BYTES).decode("utf-8"))
        except (OSError, UserError, ValueError, RecursionError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str) and v.strip()}

    def all(self) -> dict[str, str]:
        return {**self.saved(), **self.configured}

    def get(self, name: str) -> str:
        found = self.all()
        if name not in found:
            have = ", ".join(sorted(found)) or "none yet; /preset save NAME keeps the current system prompt"
            raise UserError(f"/preset: no preset {name!r} (presets: {have})")
        return found[name]

    def save(self, name: str, text: str) -> None:
        check_name(name)
        if name in self.configured:
            raise UserError(f"/preset: {name!r} is defined in the config file; edit it there")
        self._write({**self.saved(), name: text})

    def delete(self, name: str) -> None:
        if name in self.configured:
            raise UserError(f"/preset: {name!r} is defined in the config file; remove it there")
        saved = self.saved()
        if name not in saved:
            raise UserError(f"/preset: no saved preset {name!r}")
        del saved[name]
        self._write(saved)

    def _write(self, presets: dict[str, str]) -> None:
        if self.file is None:
            raise UserError("/preset: presets cannot be saved in this session (no data folder)")
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.file.parent, prefix=".presets-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(presets, f, ensure_ascii=False, indent=1)
            os.replace(tmp, self.file)
        except OSError as e:
            raise UserError(f"/preset: cannot write {self.file} ({e.strerror or e})") from None


def check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise UserError(f"/preset: a name is letters, digits, '.', '_' or '-' (up to 40), got {name!r}")


def listing(presets: Presets) -> Iterator[Event]:
    found = presets.all()
    if not found:
        yield Info("no presets yet: /preset save NAME keeps the current system prompt, or add a [presets] "
                   "table to the config file", {"presets": {}})
        return
    lines = [f"{name}: {' '.join(text.split())[:60]}" for name, text in sorted(found.items())]
    yield Info("presets (/preset NAME starts a chat with it): " + "; ".join(lines), {"presets": found})


def preset_command(presets: Presets, arg: str, system: str, set_system) -> Iterator[Event]:
    """`/preset` lists, `/preset NAME` runs `set_system(text)` (a new chat with that prompt),
    `/preset save NAME` keeps the current system prompt `system`, `/preset delete NAME`."""
    verb, _, name = arg.partition(" ")
    name = name.strip()
    if not arg:
        yield from listing(presets)
    elif verb == "save" and name:
        presets.save(name, system)
        yield Info(f"saved the current system prompt as preset {name!r}", {"preset": name, "saved": True})
    elif verb == "delete" and name:
        presets.delete(name)
        yield Info(f"deleted preset {name!r}", {"preset": name, "deleted": True})
    elif verb in ("save", "delete"):
        raise UserError(f"/preset {verb} needs a name: {USAGE}")
    else:
        yield from set_system(presets.get(arg))
