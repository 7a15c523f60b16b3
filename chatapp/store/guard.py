"""The store defends its own file (issue 45 item 10): whoever can write the data directory can
put any SQLite file there, and the app must not make that worse (docs/hostile-input.md, "The
store's own file").

At open, before any statement that could run the file's code: the database and its side files
must be regular files and not links (a `chats.db` linked to another file had SQLite overwrite
that file), the schema holds only what this app creates (a `BEFORE INSERT` trigger with a
recursive CTE hung every save, a `chats` view hung --resume, a trigger deleting other chats'
rows lost data while the save was reported), and the header's page count fits in the bytes on
disk. Every cell read is capped (`SQLITE_LIMIT_LENGTH`): SQLite refuses a larger one before
loading it (600-900 MB cells made --resume take over 60 s at 2-2.8 GB), and `cells` reads a
row cell by cell to name the one that is too large.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

from chatapp.store.records import StoreError
from model.errors import UserError
from model.files import regular_file

MAX_CELL_BYTES = 64 << 20   # no message holds more: an attachment is at most 64 MiB (chat/attach.py)
SIDE_FILES = ("", "-wal", "-shm", "-journal")
TABLES = {"chats": {"id", "title", "model", "model_fingerprint", "tokenizer_fingerprint", "settings", "system",
                    "prefix_tokens", "cache_pos", "created", "updated"},
          "messages": {"chat_id", "seq", "role", "content", "token_ids", "tool_calls", "stop"}}
INDEXES = {"chats_by_update": "CREATE INDEX chats_by_update ON chats(updated)"}
OURS = {"sqlite_sequence", "sqlite_stat1", "sqlite_stat4"}  # SQLite's own (AUTOINCREMENT, ANALYZE)
ROLE_CHECK = "CHECK (role IN ('user', 'assistant'))"


class TooBig:
    """A cell larger than MAX_CELL_BYTES, never read (validate.py notes it as damage)."""


TOO_BIG = TooBig()


def refuse(path: Path, why: str) -> StoreError:
    return StoreError(f"cannot open the chats database {path}: {why}; refused (move it away to start a new store)")


def check_files(path: Path) -> None:
    """The database and its side files: no links, and the database a regular file."""
    for suffix in SIDE_FILES:
        p = path.with_name(path.name + suffix)
        if p.is_symlink():
            raise refuse(path, f"{p.name} is a symbolic link, not a regular file (to {os.readlink(p)}): "
                               "SQLite would write through it")
    if os.path.lexists(path):
        try:
            regular_file(path, "chats database")
        except UserError as e:
            raise refuse(path, str(e).removeprefix(f"{path}: ")) from None


def check_schema(db: sqlite3.Connection, path: Path) -> None:
    """Only the tables, columns, index and CHECK this app creates: no trigger, view, virtual or
    generated thing of anyone else's ever runs in our statements."""
    for kind, name, table, sql in db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"):
        if kind == "table" and name in TABLES:
            check_table(db, path, name, sql or "")
        elif kind == "index" and (name.startswith("sqlite_autoindex_") or plain(sql) == INDEXES.get(name)):
            continue
        elif not (kind == "table" and name in OURS):
            raise refuse(path, f"it holds {kind} {name!r} (on {table}), which this app did not create")
    db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_CELL_BYTES)


def check_table(db: sqlite3.Connection, path: Path, name: str, sql: str) -> None:
    text = plain(sql)
    checks = re.findall(r"\bCHECK\b", text, re.I)
    if not text.startswith(f"CREATE TABLE {name}") or len(checks) != (name == "messages") or \
            (checks and ROLE_CHECK not in text):
        raise refuse(path, f"its table {name} is not the one this app creates ({text[:80]}...)")
    cols = db.execute(f"PRAGMA table_xinfo({name})").fetchall()
    if {c[1] for c in cols} - TABLES[name] or any(c[6] for c in cols):  # c[6]: hidden or generated
        raise refuse(path, f"its table {name} has columns this app did not create")


def plain(sql: str | None) -> str:
    """SQL without comments, its whitespace one space."""
    return " ".join(re.sub(r"--[^\n]*", "", sql or "").split()).replace("IF NOT EXISTS ", "")


def check_size(db: sqlite3.Connection, path: Path) -> None:
    """The header's page count in the bytes on disk (the WAL's included): a truncated file is
    said at open, not as a read error mid-chat."""
    pages = db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    held = sum(os.stat(p).st_size for s in SIDE_FILES[:2] if (p := path.with_name(path.name + s)).exists())
    if pages > held:
        raise refuse(path, f"truncated: it claims {pages:,} bytes of pages and holds {held:,}")


def cells(db: sqlite3.Connection, columns: list[str], rest: str, params: tuple) -> tuple | None:
    """One row of `SELECT columns rest`, read a cell at a time: a cell past the cap is TOO_BIG
    instead of an error for the whole row. None if there is no row."""
    row = []
    for column in columns:
        try:
            found = db.execute(f"SELECT {column} {rest}", params).fetchone()
        except sqlite3.DataError:  # string or blob too big: refused before it was loaded
            row.append(TOO_BIG)
            continue
        if found is None:
            return None
        row.append(found[0])
    return tuple(row)


def chat_cells(db: sqlite3.Connection, chat_id: int, chat: list[str], message: list[str]) -> tuple:
    """A chat's row and its messages' rows, each cell read alone (a cell was past the cap)."""
    seqs = [s for (s,) in db.execute("SELECT seq FROM messages WHERE chat_id = ? ORDER BY seq", (chat_id,))]
    return (cells(db, chat, "FROM chats WHERE id = ?", (chat_id,)),
            [cells(db, message, "FROM messages WHERE chat_id = ? AND seq = ?", (chat_id, s)) for s in seqs])


def listing_cells(db: sqlite3.Connection, columns: list[str], rest: str, limit: int) -> list[tuple]:
    """The chats list's rows, each chat's cells read alone (a cell was past the cap)."""
    ids = [i for (i,) in db.execute("SELECT id FROM chats ORDER BY updated DESC, id DESC LIMIT ?", (limit,))]
    return [row for i in ids if (row := cells(db, columns, rest, (i,))) is not None]
