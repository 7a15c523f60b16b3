"""Atomic files that a crash cannot leave behind: temp names with the writer's pid, and the sweep
that removes a killed writer's temp files when the store opens.

Snapshot bytes are written here (from `safetensors.torch.save`), not by safetensors' `save_file`:
that one writes its own `.tmpXXXXXX` in the target's folder (tempfile crate; no pid), so a kill
mid-write leaves a file nobody can tell from a live writer's. Those names are still swept, for
what older versions left. Imports nothing heavy: the store opens (and sweeps) before torch loads.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

TMP = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.tmp")  # ours: .<segment name>.<pid>.tmp
SAFETENSORS_TMP = re.compile(r"\.tmp[A-Za-z0-9]{6}")  # what save_file (tempfile crate) leaves
# A temp file untouched this long has no live writer: ours after an hour whatever its pid says
# (the pid may be reused), a pid-less safetensors one after a minute (a segment takes seconds).
STALE_S, SAFETENSORS_STALE_S = 3600, 60


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | Iterable) -> None:
    """`path` holds `data` (bytes, or buffers written one after another) or stays as it was,
    whenever the process dies: the only file a crash can leave is the pid-named temp file, which
    `sweep` removes once that pid is gone."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:  # the pid in the name: no other live process writes this file
            for chunk in [data] if isinstance(data, bytes) else data:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)  # the rename itself is durable only once the folder is synced


def is_temp(name: str) -> bool:
    return bool(TMP.fullmatch(name) or SAFETENSORS_TMP.fullmatch(name))


def writer_alive(name: str, age: float, opening: bool = False) -> bool:
    """Whether a live process may still be writing this temp file. A safetensors temp name
    carries no pid (only this code's older versions wrote those): its age alone decides.
    `opening`: the store is being opened, so this process writes nothing yet: a file with its
    pid is an earlier process's that had the same pid (in a container that is common)."""
    m = TMP.fullmatch(name)
    if m is None:
        return age < SAFETENSORS_STALE_S
    if age >= STALE_S or (opening and int(m["pid"]) == os.getpid()):
        return False
    try:
        os.kill(int(m["pid"]), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it runs, as another user
    return True


def remove_orphan_tmp(p: Path, opening: bool = False) -> bool:
    """Remove a temp file no live process is writing; True if it went."""
    try:
        if writer_alive(p.name, time.time() - p.stat().st_mtime, opening):
            return False
        p.unlink()
        return True
    except OSError:  # gone already, or not ours to remove (a read-only store)
        return False


def sweep(base: Path) -> int:
    """Remove every orphan temp file under `base` (the snapshots folder) as the store opens;
    returns how many went."""
    if not base.is_dir():
        return 0
    n = 0
    for folder in base.iterdir():
        if folder.is_dir():
            n += sum(remove_orphan_tmp(p, opening=True) for p in folder.iterdir() if is_temp(p.name))
    return n


