"""The config file: `$XDG_CONFIG_HOME/nanochat-tui/config.toml` (else ~/.config/...), or the
file `$NANOCHAT_TUI_CONFIG` names. Defaults for the model, sampling, theme and system-prompt
presets; a flag on the command line wins over it. Every value goes through the same validator
as the flags and `/set`, and a bad one is one line naming the file, the key and what it takes.

    model = "gemma3-270m"
    theme = "nord"
    [sampling]
    temperature = 0.7
    min_p = 0.05
    repetition_penalty = 1.1
    [presets]
    brief = "Answer in one short paragraph."

Imports no torch: the CLI and the TUI's first frame read it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from chatapp.chat.settings import SETTINGS, parse_settings, settings_text
from chatapp.options import FlagError
from model.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package (pyproject.toml's conditional dependency)
    import tomli as tomllib

TOP_KEYS = {"model": str, "theme": str, "system": str, "sampling": dict, "presets": dict}


@dataclass
class Config:
    path: Path | None = None
    model: str | None = None
    theme: str | None = None
    system: str | None = None
    sampling: dict = field(default_factory=dict)   # validated Settings values
    presets: dict[str, str] = field(default_factory=dict)


def config_path() -> Path:
    if p := os.environ.get("NANOCHAT_TUI_CONFIG"):
        return Path(p).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config").expanduser()
    return base / "nanochat-tui" / "config.toml"


def load_config(path: Path | None = None) -> Config:
    """The config, or an empty one when there is no file; UserError in one line for a bad one."""
    path = path or config_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Config()
    except OSError as e:
        raise FlagError(f"config file {path}: cannot read it ({e.strerror or e})") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise FlagError(f"config file {path}: not UTF-8 (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise FlagError(f"config file {path}: {' '.join(str(e).split())}") from None
    return parse_config(data, path)


def parse_config(data: dict, path: Path) -> Config:
    where = f"config file {path}"
    for key, value in data.items():
        if key not in TOP_KEYS:
            raise FlagError(f"{where}: unknown key {key!r} (keys: {', '.join(TOP_KEYS)})")
        if not isinstance(value, TOP_KEYS[key]):
            kind = "a table" if TOP_KEYS[key] is dict else "a string"
            raise FlagError(f"{where}: {key} must be {kind}, got {value!r}")
    cfg = Config(path, data.get("model"), data.get("theme"), data.get("system"))
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
