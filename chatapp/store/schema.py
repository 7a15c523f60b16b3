"""The chats database's schema: its tables, opening the file (read-only as SQLite allows), and
upgrading a store an older version wrote. chatapp/store/database.py does the reading and writing.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from chatapp.store.records import StoreError

SCHEMA_VERSION = 2  # 2: messages.stop (a v1 store gains the column when opened writable)
# chats.cache_pos is ChatRecord.cache_seqlens: the column keeps the name it was first stored under.
SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    model TEXT NOT NULL,                 -- the spec it was made with, for people
    model_fingerprint TEXT NOT NULL,     -- config + weights + dtype + backend (snapshot key)
    tokenizer_fingerprint TEXT NOT NULL, -- stored token ids are reusable iff this matches
    settings TEXT NOT NULL,              -- JSON of the session's Settings
    system TEXT NOT NULL,                -- the system prompt as rendered
    prefix_tokens TEXT NOT NULL,         -- JSON ids: the conversation's opening (BOS, system)
    cache_pos INTEGER NOT NULL,          -- cache_seqlens at save: how far a re-prefill goes
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    token_ids TEXT NOT NULL,             -- JSON ids of this message's span of the token list
    tool_calls TEXT NOT NULL DEFAULT '[]',
    stop TEXT NOT NULL DEFAULT '',       -- why a reply ended: end | length | context | cancel | error ('' = not known)
    PRIMARY KEY (chat_id, seq)
);
CREATE INDEX IF NOT EXISTS chats_by_update ON chats(updated);
"""


def connect(path: Path, timeout: float, read_only: bool) -> sqlite3.Connection:
    """Read-only: `mode=ro` sees a live writer's commits, but SQLite cannot open a WAL database
    that way without a -shm file it can use (a clean exit deletes it, and we cannot create
    one in a folder we cannot write, nor recover a stale one we cannot write), so it falls
    back to `immutable=1`: the file as it is now."""
    uri = path.resolve().as_uri()

    def open_uri(query: str) -> sqlite3.Connection:
        # check_same_thread off: every use goes through ChatStore.lock instead.
        return sqlite3.connect(uri + query, timeout=timeout, isolation_level=None, check_same_thread=False,
                               uri=True)
    if not read_only:
        return open_uri("")
    db = open_uri("?mode=ro")
    try:
        db.execute("PRAGMA user_version").fetchone()
        return db
    except sqlite3.OperationalError:
        db.close()
        return open_uri("?immutable=1")


def init(db: sqlite3.Connection, path: Path, read_only: bool) -> None:
    """Create the tables, or check and upgrade a store an older version wrote."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path} was written by a newer nanochat-tui (schema {version})")
    if version == SCHEMA_VERSION:
        try_wal(db)
        return
    try_wal(db)
    if version == 1:
        if not read_only:
            upgrade_v1(db)
        return
    # IF NOT EXISTS inside one transaction: two processes creating the store at once both win.
    db.executescript(f"BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")


def upgrade_v1(db: sqlite3.Connection) -> None:
    """A v1 store gains messages.stop (its rows: '', not known). A read-only one is read as it
    is (`stop_column` says so) and saving says why it cannot write."""
    try:
        db.executescript("BEGIN IMMEDIATE; ALTER TABLE messages ADD COLUMN stop TEXT NOT NULL DEFAULT '';"
                         f" PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")
    except sqlite3.OperationalError as e:
        if db.in_transaction:
            db.execute("ROLLBACK")
        if "duplicate column" in str(e):  # another process upgraded it between our two reads
            return
        if "readonly" not in str(e) and "read-only" not in str(e) and "locked" not in str(e):
            raise


def stop_column(db: sqlite3.Connection) -> str:
    """`stop`, or '' for a v1 store that could not be upgraded (read-only)."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(messages)").fetchall()}
    return "stop" if "stop" in cols else "''"


def try_wal(db: sqlite3.Connection) -> None:
    try:
        db.execute("PRAGMA journal_mode = WAL")
    except sqlite3.OperationalError:
        pass  # a read-only database still reads; saving will say why it cannot write
    # FULL: a turn reported as saved survives a power cut too, not only a killed process.
    db.execute("PRAGMA synchronous = FULL")
