"""Where nanochat-tui keeps what it makes: converted models, chats, built kernels."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$NANOCHAT_TUI_HOME`, else `$XDG_CACHE_HOME/nanochat-tui`, else ~/.cache/nanochat-tui."""
    if os.environ.get("NANOCHAT_TUI_HOME"):
        return Path(os.environ["NANOCHAT_TUI_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "nanochat-tui"
