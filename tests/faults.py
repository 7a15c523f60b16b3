"""Failure injection for the crash campaign's fault trials (tests/crash_faults.py), in the app's
own process: `python -m tests.faults ARGS` is `python -m chatapp.cli ARGS` with two faults wired
to flag files in `$NANOCHAT_TUI_TEST_FAULTS`, which the campaign creates and removes between lines:

- `disk-full`: every write transaction fails as SQLite fails on a full disk (SQLITE_FULL,
  "database or disk is full"), the error a real ENOSPC gives the store;
- `adopt`: the first step after `Session.adopt` raises, as an out-of-memory prefill would.

A held lock needs no injection: the campaign holds the real database lock itself.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

FLAGS = Path(os.environ.get("NANOCHAT_TUI_TEST_FAULTS", "/nonexistent"))
real_connect = sqlite3.connect


class FullDisk(sqlite3.Connection):
    def execute(self, sql, *args):
        if sql.lstrip().upper().startswith("BEGIN IMMEDIATE") and (FLAGS / "disk-full").exists():
            raise sqlite3.OperationalError("database or disk is full")
        return super().execute(sql, *args)


def connect(*args, **kwargs):
    kwargs.setdefault("factory", FullDisk)
    return real_connect(*args, **kwargs)


def install() -> None:
    sqlite3.connect = connect
    from chatapp.chat.session import Session

    adopt = Session.adopt

    def failing_adopt(self, *args, **kwargs):
        adopt(self, *args, **kwargs)
        if (FLAGS / "adopt").exists():
            raise RuntimeError("out of memory in prefill (injected after the adopt step)")
    Session.adopt = failing_adopt


if __name__ == "__main__":
    install()
    from chatapp.cli import main

    sys.exit(main())
