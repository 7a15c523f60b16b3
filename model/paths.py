"""Where nanochat-tui keeps what it makes: converted models, chats, built kernels."""

from __future__ import annotations

import os
from pathlib import Path


def tui_home() -> Path | None:
    """`$NANOCHAT_TUI_HOME` when set (one folder for everything: converted models, chats, kernels),
    else None. The one reader of it: the cache and the chats fall back to their own XDG homes."""
    home = os.environ.get("NANOCHAT_TUI_HOME")
    return Path(home).expanduser() if home else None


def cache_root() -> Path:
    """`$NANOCHAT_TUI_HOME`, else `$XDG_CACHE_HOME/nanochat-tui`, else ~/.cache/nanochat-tui."""
    if home := tui_home():
        return home
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "nanochat-tui"
