"""The chats database: one SQLite file (stdlib sqlite3, WAL) of chats and their messages.

A chat is saved whole, in one transaction: the chat row and every message row with its token
ids. A crash (even `kill -9`) mid-save leaves the previous version intact, and saving the
whole chat each time means a save that failed (a locked or read-only database) is simply
caught up by the next one. KV snapshots live next to the database, one folder per chat
(chatapp/store/snapshots.py); this module only names and deletes those folders.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from chatapp.store import guard, schema
from chatapp.store.records import ChatChanged, ChatRecord, ChatSummary, StoredMessage, StoreError, describe
from chatapp.store.tempfiles import sweep
from chatapp.store.validate import DAMAGED_SQL, chat_row
from model.paths import tui_home

SNAPSHOT_BUDGET = 4 << 30  # the default: past it, older chats lose their snapshots (they re-prefill)
CHAT = ["id", "title", "model", "model_fingerprint", "tokenizer_fingerprint", "settings", "system",
        "prefix_tokens", "cache_pos", "created", "updated"]


def shown(cell) -> str:
    return "(too large to show)" if cell is guard.TOO_BIG else str(cell)


def writable(path: Path) -> bool:
    """A store we can write: the file and its folder (SQLite makes its WAL side files there)."""
    folder = path if path.is_dir() else path.parent
    return os.access(folder, os.W_OK) and (path.is_dir() or os.access(path, os.W_OK))


def data_home() -> Path:
    """`$NANOCHAT_TUI_HOME`, else `$XDG_DATA_HOME/nanochat-tui`, else ~/.local/share/nanochat-tui."""
    if home := tui_home():
        return home
    return Path(os.environ.get("XDG_DATA_HOME") or "~/.local/share").expanduser() / "nanochat-tui"


def chats_dir() -> Path:
    """Where chats live: `$NANOCHAT_TUI_CHATS` (tests point it at a temp dir), else <home>/chats."""
    if d := os.environ.get("NANOCHAT_TUI_CHATS"):
        return Path(d).expanduser()
    return data_home() / "chats"


class ChatStore:
    def __init__(self, root: Path | None = None, timeout: float = 2.0, read_only: bool | None = None,
                 snapshot_budget: int = SNAPSHOT_BUDGET):
        """`read_only` None: read-only when this process cannot write the database or its folder
        (chats still list and open; the keeper says once that nothing will be saved). A store
        opened for writing first removes what a killed process left (`tidy`). `snapshot_budget`:
        bytes of KV snapshots kept on disk, all chats together (`prune_snapshots`)."""
        self.root = Path(root) if root is not None else chats_dir()
        self.snapshot_budget = snapshot_budget
        self.path = self.root / "chats.db"
        self.lock = threading.Lock()  # the TUI saves from its turn worker, lists from the UI thread
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            guard.check_files(self.path)  # a link: SQLite would write through it, over another file
            if read_only is None:
                read_only = self.path.exists() and not writable(self.path)
            self.read_only = read_only
            self.db = schema.connect(self.path, timeout, read_only)
            guard.check_schema(self.db, self.path)  # before any statement runs a trigger or a view
            guard.check_size(self.db, self.path)
            self.db.execute("PRAGMA foreign_keys = ON")
            schema.init(self.db, self.path, read_only)
            self._stop = schema.stop_column(self.db)
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"cannot open the chats database {self.path}: {describe(e)}") from None
        if not read_only:
            self.tidy()

    def tidy(self) -> None:
        """Remove what a process killed mid-write left: snapshot temp files of dead writers, and
        the snapshot folders of chats deleted before their folder went."""
        base = self.root / "snapshots"
        sweep(base)
        # folders first, then ids: a chat is committed before its folder is made, so a folder
        # listed here whose id is not stored belongs to a deleted chat
        folders = [d for d in base.iterdir() if d.is_dir() and d.name.isdigit()] if base.is_dir() else []
        if not folders:
            return
        try:
            with self._guard("read the chats") as db:
                ids = {r[0] for r in db.execute("SELECT id FROM chats")}
        except StoreError:
            return  # the store's trouble shows at the first save
        for d in folders:
            if int(d.name) not in ids:
                shutil.rmtree(d, ignore_errors=True)

    def stop_column(self) -> str:
        """messages.stop, read at open: a column once there stays. A v1 store this process could not
        upgrade (read-only, or locked at open) is asked again, as another process may upgrade it."""
        if self._stop != "stop":
            self._stop = schema.stop_column(self.db)
        return self._stop

    @contextmanager
    def _guard(self, action: str) -> Iterator[sqlite3.Connection]:
        with self.lock:
            try:
                yield self.db
            except (sqlite3.Error, OSError, UnicodeError) as e:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise StoreError(f"could not {action}: {describe(e)}") from None
            except BaseException:
                if self.db.in_transaction:  # never leave the write lock held behind an error
                    self.db.execute("ROLLBACK")
                raise

    # --- writing ------------------------------------------------------------
    def save(self, record: ChatRecord, expect: list[tuple[str, str]] | None = None) -> int:
        """Insert or replace the whole chat in one transaction; returns its id. With `expect`
        (the (role, content) of its messages when we last read or wrote it): ChatChanged if the
        store holds other messages now. Another window wrote them, and replacing the chat
        would lose that window's turns."""
        now = time.time()
        row = (record.title, record.model, record.model_fingerprint, record.tokenizer_fingerprint,
               json.dumps(record.settings), record.system, json.dumps(record.prefix_tokens), record.cache_seqlens)
        with self._guard("save the chat") as db:
            db.execute("BEGIN IMMEDIATE")
            cur = None
            if record.id is not None and expect is not None:
                self._check_unchanged(db, record.id, expect)
            if record.id is not None:
                cur = db.execute("UPDATE chats SET title=?, model=?, model_fingerprint=?, tokenizer_fingerprint=?,"
                                 " settings=?, system=?, prefix_tokens=?, cache_pos=?, updated=? WHERE id=?",
                                 (*row, now, record.id))
            if cur is None or cur.rowcount == 0:
                # New, or deleted meanwhile from another window: (re)insert, so nothing is lost.
                cur = db.execute("INSERT INTO chats (title, model, model_fingerprint, tokenizer_fingerprint,"
                                 " settings, system, prefix_tokens, cache_pos, created, updated, id)"
                                 " VALUES (?,?,?,?,?,?,?,?,?,?,?)", (*row, record.created or now, now, record.id))
                record.id, record.created = cur.lastrowid, record.created or now
            db.execute("DELETE FROM messages WHERE chat_id = ?", (record.id,))
            rows = [(record.id, i, m.role, m.content, json.dumps(m.token_ids), json.dumps(m.tool_calls), m.stop)
                    for i, m in enumerate(record.messages)]
            if self.stop_column() == "stop":
                db.executemany("INSERT INTO messages (chat_id, seq, role, content, token_ids, tool_calls, stop)"
                               " VALUES (?,?,?,?,?,?,?)", rows)
            else:  # a v1 store that stayed v1 (locked at open): saved as v1 saves, without the stops
                db.executemany("INSERT INTO messages (chat_id, seq, role, content, token_ids, tool_calls)"
                               " VALUES (?,?,?,?,?,?)", [r[:6] for r in rows])
            db.execute("COMMIT")
        record.updated = now
        return record.id

    @staticmethod
    def _check_unchanged(db: sqlite3.Connection, chat_id: int, expect: list[tuple[str, str]]) -> None:
        held = db.execute("SELECT role, content FROM messages WHERE chat_id = ? ORDER BY seq",
                          (chat_id,)).fetchall()
        if [tuple(r) for r in held] != expect:
            raise ChatChanged(f"chat {chat_id} was changed or deleted in another window")

    def rename(self, chat_id: int, title: str) -> str:
        """The title as stored (whitespace runs made one space)."""
        title = " ".join(title.split())
        if not title:
            raise StoreError("a chat title cannot be empty")
        with self._guard("rename the chat") as db:
            if db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id)).rowcount == 0:
                raise StoreError(f"no chat {chat_id}")
        return title

    def delete(self, chat_id: int, expect: list[tuple[str, str]] | None = None) -> None:
        """With `expect` (as for `save`): ChatChanged, and nothing deleted, if the store holds
        other messages now: another window's turns are not ours to delete."""
        with self._guard("delete the chat") as db:
            db.execute("BEGIN IMMEDIATE")
            if expect is not None:
                self._check_unchanged(db, chat_id, expect)
            db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
            db.execute("COMMIT")
        shutil.rmtree(self.snapshot_dir(chat_id), ignore_errors=True)

    # --- reading ------------------------------------------------------------
    def get(self, chat_id: int) -> ChatRecord | None:
        if not 0 < chat_id < 2**63:  # SQLite integers are signed 64-bit: no such row, not an OverflowError
            return None
        message = ["role", "content", "token_ids", "tool_calls", self.stop_column()]
        with self._guard("read the chat") as db:
            try:
                row = db.execute(f"SELECT {', '.join(CHAT)} FROM chats WHERE id = ?", (chat_id,)).fetchone()
                msgs = db.execute(f"SELECT {', '.join(message)} FROM messages WHERE chat_id = ? ORDER BY seq",
                                  (chat_id,)).fetchall() if row else []
            except sqlite3.DataError:  # a cell past the cap: each read alone, the large one never loaded
                row, msgs = guard.chat_cells(db, chat_id, CHAT, message)
            if row is None:
                return None
        return chat_row(row, msgs, ChatRecord, StoredMessage)  # every cell checked: a corrupt one noted, never raised

    def list(self, limit: int = 500) -> list[ChatSummary]:
        """Most recently updated first."""
        # messages as /edit N and the transcript number them: the user's (each with its reply)
        columns = ["c.id", "c.title", "c.model", "c.updated", "COUNT(CASE m.role WHEN 'user' THEN 1 END)", DAMAGED_SQL]
        joined = "FROM chats c LEFT JOIN messages m ON m.chat_id = c.id"
        with self._guard("list the chats") as db:
            try:
                rows = db.execute(f"SELECT {', '.join(columns)} {joined} GROUP BY c.id"
                                  " ORDER BY c.updated DESC, c.id DESC LIMIT ?", (limit,)).fetchall()
            except sqlite3.DataError:  # a cell past the cap: each chat's cells read alone
                rows = guard.listing_cells(db, columns, f"{joined} WHERE c.id = ? GROUP BY c.id", limit)
        return [ChatSummary(i, shown(t), shown(m), u if isinstance(u, float | int) else 0.0,
                            n if isinstance(n, int) else 0, d is guard.TOO_BIG or bool(d))
                for i, t, m, u, n, d in rows]

    def search(self, query: str) -> set[int]:
        """The chats whose title or any message holds `query` (case-insensitive for ASCII)."""
        like = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._guard("search the chats") as db:
            rows = db.execute("SELECT DISTINCT c.id FROM chats c LEFT JOIN messages m ON m.chat_id = c.id"
                              " WHERE c.title LIKE ?1 ESCAPE '\\' OR m.content LIKE ?1 ESCAPE '\\'",
                              (like,)).fetchall()
        return {r[0] for r in rows}

    def latest_id(self, exclude: int | None = None) -> int | None:
        with self._guard("read the chats") as db:
            row = db.execute("SELECT id FROM chats WHERE id IS NOT ? ORDER BY updated DESC, id DESC LIMIT 1",
                             (exclude,)).fetchone()
        return row[0] if row else None

    def integrity_check(self) -> str:
        with self._guard("check the database") as db:
            return db.execute("PRAGMA integrity_check").fetchone()[0]

    # --- snapshots' home ----------------------------------------------------
    def snapshot_dir(self, chat_id: int) -> Path:
        return self.root / "snapshots" / str(chat_id)

    def prune_snapshots(self, keep: int, budget_bytes: int) -> list[int]:
        """Drop the snapshots of the least recently updated chats until the rest fit the budget.
        Their chats stay; reopening them re-prefills. Returns the chat ids pruned."""
        base = self.root / "snapshots"
        if not base.is_dir():
            return []
        sizes = {int(d.name): sum(f.stat().st_size for f in d.iterdir() if f.is_file())
                 for d in base.iterdir() if d.is_dir() and d.name.isdigit()}
        order = [c.id for c in self.list(limit=1 << 30) if c.id in sizes]
        order += [cid for cid in sizes if cid not in order]  # orphans (chat deleted) go first
        pruned, total = [], sum(sizes.values())
        for cid in reversed(order):
            if total <= budget_bytes:
                break
            if cid != keep:
                shutil.rmtree(base / str(cid), ignore_errors=True)
                total -= sizes[cid]
                pruned.append(cid)
        return pruned

    def close(self) -> None:
        with self.lock:
            self.db.close()
