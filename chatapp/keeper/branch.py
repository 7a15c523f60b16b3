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

import dataclasses
import os
from pathlib import Path

from chatapp.chat.events import Branched
from chatapp.store.database import ChatStore
from chatapp.store.records import ChatRecord, StoreError
from chatapp.store.snapshots import scan
from chatapp.store.tempfiles import fsync_path, write_atomic
from model.errors import UserError
from model.files import MAX_MODEL_BYTES, read_bytes


def keep_branch(store: ChatStore, record: ChatRecord, clean_upto: int, n: int, text: str) -> Branched:
    """Store `record` (the keeper's chat as it is, before /edit's rewind to message `n`) as a new
    chat sharing the snapshot of `record.id` up to `clean_upto` (how far that snapshot is known to
    match the cache). UserError, nothing stored, if it cannot be: an edit never loses a
    continuation the store does not have."""
    title = branch_title(record.title, record.id, n)
    try:
        branch = store.save(dataclasses.replace(record, id=None, created=0.0, title=title))
    except StoreError as e:
        raise UserError(f"/edit: nothing changed: the old continuation could not be kept ({e}); "
                        "/export keeps a copy") from None
    shared = 0
    if record.id is not None:
        try:  # a branch without its snapshot is still whole: reopening it re-prefills
            shared = share_snapshot(store.snapshot_dir(record.id), store.snapshot_dir(branch), clean_upto)
        except OSError:
            pass
    return Branched(record.id, branch, title, n, text, shared)


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
            write_atomic(target, read_bytes(seg.path, "snapshot", MAX_MODEL_BYTES))
    fsync_path(dst)
    end = 0
    for seg in shared:
        end = seg.end if seg.start == end else end
    return end
