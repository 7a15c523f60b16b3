"""Reading a model's files: regular files only, with a size cap.

A FIFO blocks a read forever, /dev/zero never ends and /dev/full fills memory (issue 27), so
every model, tokenizer, config, attachment or snapshot file is checked with `os.stat` before it
is opened: a regular file, no larger than the cap for its kind. A root leaf module: model/
loaders, the tokenizers and the app's store all use it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from model.errors import ModelLoadError

MAX_JSON_BYTES = 1 << 28    # tokenizer.json, config.json and friends (Gemma 3's tokenizer.json: 33 MB)


def regular_file(path: Path, what: str, cap: int = 1 << 42) -> int:
    """The file's size; ModelLoadError unless it is a regular file (never a FIFO, a device or
    /dev/zero behind a link: those block or never end) of at most `cap` bytes."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file") from None
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read the {what} ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelLoadError(f"{path}: the {what} is not a regular file ({kind(st.st_mode)})")
    if st.st_size > cap:
        raise ModelLoadError(f"{path}: the {what} is {st.st_size:,} bytes, more than the {cap:,} accepted")
    return st.st_size


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a plain file"


def read_bytes(path: Path, what: str, cap: int = MAX_JSON_BYTES) -> bytes:
    """The whole file, checked as `regular_file` first; never more than `cap` bytes read."""
    regular_file(path, what, cap)
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:  # grew while we read it
        raise ModelLoadError(f"{path}: the {what} is more than the {cap:,} bytes accepted")
    return data
