"""A store this user cannot write is opened read-only: its chats list, open and continue in
memory, and the app says once that nothing will be saved.

Run as root (CI), the app runs as `nobody` through setpriv, keeping only CAP_DAC_READ_SEARCH so
it can read the venv under /root but write nothing it does not own: another user on a store
they may read. Run as a plain user, the store is made read-only with chmod instead. The store is
left as a clean exit leaves it, without its WAL side files: opening it `mode=ro` fails then.
"""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import NOBODY, as_other_user

from chatapp.store.database import ChatStore

CLI = [sys.executable, "-m", "chatapp.cli", "--headless", "--model", "random:tiny", "--temperature", "0",
       "--max-new-tokens", "12"]




def headless(root: Path, home: Path, lines: list[str], *flags: str, prefix=()) -> list[dict]:
    env = {**os.environ, "NANOCHAT_TUI_CHATS": str(root), "NANOCHAT_TUI_HOME": str(home), "HOME": str(home)}
    r = subprocess.run([*prefix, *CLI, *flags], input="".join(f"{x}\n" for x in lines), capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return [json.loads(x) for x in r.stdout.splitlines()]


def chmod_tree(root: Path, writable: bool) -> None:
    for d, _dirs, files in os.walk(root):
        os.chmod(d, 0o755 if writable else 0o555)
        for f in files:
            os.chmod(Path(d) / f, 0o644 if writable else 0o444)


def stored(root: Path) -> list[tuple[int, str, int]]:
    """The chats as this (writing) user reads them. Opened for writing on purpose: a read-only
    connection would leave WAL side files, and the point is a store without them."""
    store = ChatStore(root)
    try:
        assert store.integrity_check() == "ok"
        return [(c.id, c.title, c.messages) for c in store.list()]
    finally:
        store.close()


@pytest.fixture(scope="module")
def readonly_store(tmp_path_factory):
    """Two stored chats, written by this user, then made read-only for the app's user."""
    tmp_path = tmp_path_factory.mktemp("readonly")
    root, home = tmp_path / "chats", tmp_path / "home"
    home.mkdir()
    headless(root, home, ["one", "two", "/reset", "three"])
    before = stored(root)
    assert not list(root.glob("chats.db-*")), "a clean exit removes the WAL side files"
    prefix = as_other_user()
    os.chown(home, NOBODY, NOBODY) if prefix else None
    tmp_path.chmod(tmp_path.stat().st_mode | stat.S_IXOTH)
    chmod_tree(root, writable=False)
    yield root, home, prefix, before
    chmod_tree(root, writable=True)
    assert stored(root) == before, "a read-only session changed the store"


def test_read_only_store_opens_lists_and_continues_in_memory(readonly_store):
    root, home, prefix, before = readonly_store
    events = headless(root, home, ["hello", "again", "/load 1", "more", "/save x"], prefix=prefix)
    ready, *rest = events
    assert ready["read_only"] and ready["store"] == str(root / "chats.db") and ready["chat"] is None
    kinds = [e["event"] for e in rest]
    # the notice once at the first change, again when /load leaves unsaved turns, never per turn
    assert kinds == ["turn", "info", "turn", "info", "load", "turn", "error"], rest
    notices = [e for e in rest if e["event"] == "info"]
    assert all(e["data"] == {"read_only": True} and "nothing will be saved" in e["text"] for e in notices)
    load = rest[kinds.index("load")]
    assert load["chat"] == 1 and load["messages"] == 4 and load["restored_tokens"] > 0
    assert "read-only" in rest[-1]["message"]
    listed = subprocess.run([*prefix, sys.executable, "-c", "from chatapp.store.database import ChatStore; "
                             "s = ChatStore(); print(s.read_only, [c.id for c in s.list()])"],
                            capture_output=True, text=True, env={**os.environ, "NANOCHAT_TUI_CHATS": str(root)})
    assert listed.stdout.split(None, 1) == ["True", "[2, 1]\n"], listed.stderr[-2000:]


def test_resume_on_a_read_only_store(readonly_store):
    root, home, prefix, before = readonly_store
    ready, *rest = headless(root, home, ["next"], "--resume", prefix=prefix)
    assert ready["read_only"] and ready["chat"] == before[0][0] == 2
    assert ready["restored_tokens"] > 0 and ready["reprefilled_tokens"] == 0
    assert [e["event"] for e in rest] == ["turn", "info"]
