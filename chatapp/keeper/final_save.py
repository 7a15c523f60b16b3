"""At exit: the last save, retried, and one line when turns are still not on disk.

A save fails while another program holds the database lock or the disk is full; the keeper
reports each failure and the next save writes the whole chat. Exiting is the one moment no next
save comes, so the faces call `final_save` before they go: it retries a few times, and if the
chat still differs from what the store holds it writes a Markdown copy (the store's folder, else
the temp folder) and returns the line to print, saying what was kept where.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from chatapp.chat.events import Info
from chatapp.chat.figures import counted
from chatapp.keeper.base import Keeper
from chatapp.store.records import StoreError

ATTEMPTS = 3
PAUSE_S = 0.5


def final_save(keeper: Keeper, attempts: int = ATTEMPTS, pause_s: float = PAUSE_S) -> str | None:
    """None when everything this window holds is stored (or nothing is stored, as the user
    was told: --no-store, a read-only store); else the one line for the user."""
    store = keeper.store
    # a read-only store said at the first change that nothing will be saved: the user knows
    if store is None or store.read_only or not keeper.unsaved():
        return None
    for i in range(attempts):
        list(keeper.autosave())  # errors were shown as they came; the line below says the outcome
        if not keeper.unsaved():
            return None
        if i + 1 < attempts:
            time.sleep(pause_s)
    why = keeper.last_error or "the save failed"
    return f"nanochat-tui: {exchanges(keeper)} not saved ({why}, {attempts} tries); {rescue(keeper)}"


def exchanges(keeper: Keeper) -> str:
    n = keeper.session.turns
    name = f"chat #{keeper.chat_id}" if keeper.chat_id is not None else "this new chat"
    return f"{name} ({counted(n, 'exchange')})"


def rescue(keeper: Keeper) -> str:
    """A Markdown copy where one can be written: what the user keeps when the store said no."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for folder in (keeper.store.root, Path(tempfile.gettempdir())):
        try:
            path = export_to(keeper, folder / f"nanochat-unsaved-{stamp}.md")
        except StoreError:
            continue
        return f"a copy of the whole chat is in {path}"
    return "no copy could be written either (the disk is full?)"


def export_to(keeper: Keeper, path: Path) -> Path:
    for ev in keeper.export(str(path)):
        if isinstance(ev, Info):
            return Path(ev.data["path"])
    raise StoreError(f"cannot write {path}")
