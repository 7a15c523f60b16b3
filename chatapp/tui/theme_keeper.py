"""A theme chosen is a theme kept: `/theme NAME` and the theme picker write `theme = "NAME"` into
the config file (chatapp/config.py: read at start, the one place it lives), through the store's
atomic write, so a crash leaves the old file or the new one. The rest of the file stays as the
user wrote it (comments included); a file that does not parse is left alone and says why.
"""

from __future__ import annotations

import os
from pathlib import Path

from chatapp.config import MAX_CONFIG_BYTES, config_path, parse_config, parse_toml, with_theme
from chatapp.store.tempfiles import write_atomic
from model.errors import UserError
from model.files import read_bytes


def keep_theme(name: str, path: Path | None = None) -> tuple[str, bool | None]:
    """Write `name` as the config file's theme: the notice, and whether it was kept (None: the
    file had it already, as at start, when the app applies the file's own theme)."""
    path = path or config_path()
    try:
        raw = read_bytes(path, "config file", MAX_CONFIG_BYTES) if os.path.lexists(path) else b""
        if parse_config(parse_toml(raw, path), path).theme == name:
            return f"Theme {name} (kept in {path})", None
        text = with_theme(raw.decode("utf-8"), name)
        if parse_config(parse_toml(text.encode(), path), path).theme != name:  # never write a file we misread
            raise UserError(f"{path}: its theme line could not be found to change; set theme = \"{name}\" by hand")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode())
    except UserError as e:
        return f"Theme {name} for this session only: {e}", False
    except OSError as e:
        return f"Theme {name} for this session only: cannot write {path} ({e.strerror or e})", False
    return f"Theme {name}, kept in {path}", True
