"""/edit's old continuation, kept: the chat as it was before the edit becomes a stored chat of
its own (a branch), listed and opened like any other, while the edited chat keeps its id.

The branch's KV snapshot is the chat's own segment files, hard-linked into the branch's folder:
the branch's tokens are the chat's tokens at the moment of the edit, so every segment the chat
had is exact for it, not only the ones before the edit point, and linking costs no bytes and no
time (copying is the fallback where links are not possible). Segment files are never modified
after their atomic write, only unlinked, so the two folders never disturb each other: when the
edited chat drops its segments past the edit point, the branch's links stay. Reopening checks
them as always (identity, token prefix, checksum), so a link is never trusted blindly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from chatapp.chat.events import Branched
from chatapp.store.database import StoreError
from chatapp.store.snapshots import scan
from chatapp.store.tempfiles import fsync_path, write_atomic
from model.errors import UserError

if TYPE_CHECKING:  # the keeper imports this module; only the type comes back
    from chatapp.store.keeper import ChatKeeper


def keep_branch(keeper: ChatKeeper, n: int, text: str) -> Branched:
    """Store the keeper's chat as it is (before /edit's rewind to message `n`) as a new chat
    sharing its snapshot. UserError, nothing changed, if it cannot be stored: an edit never
    loses a continuation the store does not have. No store (or a read-only one): nothing kept."""
    store = keeper.store
    if store is None or store.read_only:
        return Branched(keeper.chat_id, None, "", n, text, 0)
    data = keeper.chat_data()
    data.id, data.created, data.title = None, 0.0, branch_title(data.title, keeper.chat_id, n)
    try:
        branch = store.save(data)
    except StoreError as e:
        raise UserError(f"/edit: nothing changed: the old continuation could not be kept ({e}); "
                        "/export keeps a copy") from None
    shared = 0
    if keeper.chat_id is not None:
        try:  # a branch without its snapshot is still whole: reopening it re-prefills
            # clean_upto: how far the chat's snapshot is known to match its cache
            shared = share_snapshot(store.snapshot_dir(keeper.chat_id), store.snapshot_dir(branch),
                                    keeper.clean_upto)
        except OSError:
            pass
    return Branched(keeper.chat_id, branch, data.title, n, text, shared)


def branch_title(title: str, chat_id: int | None, message: int) -> str:
    where = f"#{chat_id}, " if chat_id is not None else ""
    return f"{title} (branch from {where}message {message})"


def share_snapshot(src: Path, dst: Path, upto: int) -> int:
    """Give `dst` the segments of `src` that end at or below `upto` (the positions the chat's
    snapshot is known to match its cache at); returns how many positions from 0 they cover.
    Called once the branch is committed: a folder is never made before its chat (ChatStore.tidy)."""
    segments, _ = scan(src)
    shared = sorted((s for s in segments if s.end <= upto), key=lambda s: s.start)
    if not shared:
        return 0
    dst.mkdir(parents=True, exist_ok=True)
    for seg in shared:
        target = dst / seg.path.name
        try:
            os.link(seg.path, target)  # one more name for the same bytes: atomic, nothing copied
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links: copy, atomically
            write_atomic(target, seg.path.read_bytes())
    fsync_path(dst)
    end = 0
    for seg in shared:
        end = seg.end if seg.start == end else end
    return end
