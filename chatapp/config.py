"""The config file: `$XDG_CONFIG_HOME/nanochat-tui/config.toml` (else ~/.config/...), or the
file `$NANOCHAT_TUI_CONFIG` names. Defaults for the model, sampling, theme and system-prompt
presets; a flag on the command line wins over it. Every value goes through the same validator
as the flags and `/set`, and a bad one is one line naming the file, the key and what it takes.

    model = "gemma3-270m"
    theme = "nord"
    snapshot_budget_mib = 1024      # KV snapshots kept on disk, all chats together (default 4096)
    [sampling]
    temperature = 0.7
    min_p = 0.05
    repetition_penalty = 1.1
    [presets]
    brief = "Answer in one short paragraph."

Imports no torch: the CLI and the TUI's first frame read it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from chatapp.chat.settings import SETTINGS, parse_settings, settings_text
from chatapp.options import FlagError
from model.errors import UserError
from model.files import read_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package (pyproject.toml's conditional dependency)
    import tomli as tomllib

MAX_CONFIG_BYTES = 1 << 20    # a real config is under a kilobyte; presets may hold long prompts
MAX_TOML_PARTS = 1_000        # dots and brackets outside strings: a real config has a few dozen
MAX_TOML_DEPTH = 32           # nested [ and {: a real config has none deeper than 2
STRUCTURE = re.compile(r"[#\"'.\[\]{}]")

THEME_LINE = re.compile(r"^theme\s*=.*$", re.M)
TABLE_LINE = re.compile(r"^\s*\[", re.M)
TOP_KEYS = {"model": str, "theme": str, "system": str, "snapshot_budget_mib": int, "sampling": dict, "presets": dict}
MAX_BUDGET_MIB = 1 << 30  # a pebibyte: any larger number is a typo


@dataclass
class Config:
    path: Path | None = None
    model: str | None = None
    theme: str | None = None
    system: str | None = None
    sampling: dict = field(default_factory=dict)   # validated Settings values
    presets: dict[str, str] = field(default_factory=dict)
    snapshot_budget_mib: int | None = None         # None: the store's default (chatapp/store/database.py)


def config_path() -> Path:
    if p := os.environ.get("NANOCHAT_TUI_CONFIG"):
        return Path(p).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config").expanduser()
    return base / "nanochat-tui" / "config.toml"


def load_config(path: Path | None = None) -> Config:
    """The config, or an empty one when there is no file; UserError in one line for a bad one."""
    path = path or config_path()
    if not os.path.lexists(path):
        return Config()
    try:  # the one regular-file gate: a FIFO hung here, a link to /dev/zero read 3.1 GB (issue 45)
        raw = read_bytes(path, "config file", MAX_CONFIG_BYTES)
    except UserError as e:
        raise FlagError(f"config file {e}") from None
    return parse_config(parse_toml(raw, path), path)


def parse_toml(raw: bytes, path: Path) -> dict:
    """The file's TOML, within a size and a shape cap: tomllib recurses once per nested table
    (100,000 levels: RecursionError) and its dotted keys cost the square of their parts
    (100,000 parts: over 30 s at 3.1 GB), so both are counted first, outside strings."""
    where = f"config file {path}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FlagError(f"{where}: not UTF-8 (byte {e.start})") from None
    parts, depth = toml_shape(text)
    if parts > MAX_TOML_PARTS or depth > MAX_TOML_DEPTH:
        raise FlagError(f"{where}: too many nested or dotted keys ({parts:,} key parts and brackets, "
                        f"{depth} deep; at most {MAX_TOML_PARTS:,} and {MAX_TOML_DEPTH})")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FlagError(f"{where}: {' '.join(str(e).split())}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # an integer of 4,300+ digits
        raise FlagError(f"{where}: not a usable config ({type(e).__name__}: {str(e)[:120]})") from None


def toml_shape(text: str) -> tuple[int, int]:
    """(dots and opening brackets outside strings and comments, the deepest bracket nesting):
    a real config has a few dozen and 2. One pass; a string is skipped with `find`, never a
    backtracking pattern."""
    parts = depth = deepest = 0
    i = 0
    while m := STRUCTURE.search(text, i):
        c, i = m.group(), m.end()
        if c == "#":
            i = line_end(text, i)
        elif c in "\"'":
            i = string_end(text, i, c)
        elif c in "]}":
            depth = max(depth - 1, 0)
        else:
            parts += 1
            if c != ".":
                depth += 1
                deepest = max(deepest, depth)
    return parts, deepest


def line_end(text: str, i: int) -> int:
    j = text.find("\n", i)
    return len(text) if j < 0 else j


def string_end(text: str, i: int, quote: str) -> int:
    """Where the string opened by `quote` just before `i` ends. A one-line string that does not
    close stops at its line's end (tomllib refuses it); backslashes escape in basic strings only."""
    closer = quote * 3 if text.startswith(quote * 2, i) else quote
    i += len(closer) - 1
    while True:
        j = text.find(closer, i)
        if j < 0:
            return len(text)
        if len(closer) == 1 and (nl := text.find("\n", i, j)) >= 0:
            return nl
        slashes = len(text[i:j]) - len(text[i:j].rstrip("\\"))
        if quote == "'" or slashes % 2 == 0:
            return j + len(closer)
        i = j + 1


def parse_config(data: dict, path: Path) -> Config:
    where = f"config file {path}"
    for key, value in data.items():
        if key not in TOP_KEYS:
            raise FlagError(f"{where}: unknown key {key!r} (keys: {', '.join(TOP_KEYS)})")
        if TOP_KEYS[key] is int:
            check_mib(value, f"{where}: {key}")
        elif not isinstance(value, TOP_KEYS[key]):
            kind = "a table" if TOP_KEYS[key] is dict else "a string"
            raise FlagError(f"{where}: {key} must be {kind}, got {value!r}")
    cfg = Config(path, data.get("model"), data.get("theme"), data.get("system"),
                 snapshot_budget_mib=data.get("snapshot_budget_mib"))
    sampling = data.get("sampling", {})
    for key, value in sampling.items():
        if key not in SETTINGS:
            raise FlagError(f"{where}: unknown setting [sampling] {key!r}; settings: {', '.join(SETTINGS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FlagError(f"{where}: [sampling] {key} must be a number, got {value!r}")
    try:  # one validator for the file, the flags and /set
        cfg.sampling = parse_settings(settings_text(sampling))
    except UserError as e:
        raise FlagError(f"{where}: [sampling] {e}") from None
    for name, text in data.get("presets", {}).items():
        if not isinstance(text, str) or not text.strip():
            raise FlagError(f"{where}: [presets] {name} must be a non-empty string (a system prompt)")
        cfg.presets[name] = text
    return cfg


def check_mib(value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BUDGET_MIB:
        raise FlagError(f"{where} must be a whole number of MiB from 0 to {MAX_BUDGET_MIB:,}, got {value!r}")


def with_theme(text: str, name: str) -> str:
    """The config file's `text` with its top-level `theme` set to `name` (the TUI keeps a /theme
    choice so): that one line replaced, or added before the first table; comments and the rest kept."""
    line = f"theme = {json.dumps(name)}"  # a TOML basic string: JSON's escapes are TOML's
    table = TABLE_LINE.search(text)
    top, tables = (text[:table.start()], text[table.start():]) if table else (text, "")
    if THEME_LINE.search(top):
        top = THEME_LINE.sub(lambda _: line, top, count=1)
    else:
        top = f"{top}{'' if not top or top.endswith(chr(10)) else chr(10)}{line}\n"
    return top + tables
