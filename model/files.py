"""The one gate every file the app reads goes through: a regular file, under a size cap.

A FIFO blocks an open or a read forever, /dev/zero never ends and /dev/full fills memory
(issues 27 and 45): a model's weights, config and tokenizer (JSON, safetensors, GGUF, a PyTorch
checkpoint, nanochat's tokenizer.pkl), the config file, the store's database, KV snapshots,
presets, the recent-models list and attachments are all checked here before a byte is read.
A root leaf module: model/ loaders, the tokenizers and the app (chatapp/) all use it.

`open_regular` is the gate itself: it stats the path (a device is never opened), opens it
without blocking (a FIFO swapped in after the stat cannot hang the open) and checks the
descriptor again (what is read is what was checked). Readers that need a path rather than a
file object (safetensors, torch.load, SQLite, mmap) call `regular_file`, the same check.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from model.errors import ModelLoadError

MAX_JSON_BYTES = 1 << 28    # tokenizer.json, config.json and friends (Gemma 3's tokenizer.json: 33 MB)
MAX_MODEL_BYTES = 1 << 42   # weights: no cap but the disk's


def refusal(path: Path | str, what: str, st: os.stat_result, cap: int) -> ModelLoadError | None:
    """Why a file of this stat is refused, or None."""
    if stat.S_ISDIR(st.st_mode):
        return ModelLoadError(f"{path}: a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        return ModelLoadError(f"{path}: {kind(st.st_mode)}, not a regular file")
    if st.st_size > cap:
        return ModelLoadError(f"{path}: too large for a {what} ({st.st_size:,} bytes; at most {cap:,})")
    return None


def unreadable(path: Path | str, e: OSError) -> ModelLoadError:
    return ModelLoadError(f"{path}: cannot read it ({e.strerror or e})")


def open_regular(path: Path | str, what: str, cap: int = MAX_JSON_BYTES) -> BinaryIO:
    """`path` open for reading; ModelLoadError unless it is a regular file of at most `cap` bytes."""
    try:
        if err := refusal(path, what, os.stat(path), cap):
            raise err
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise unreadable(path, e) from None
    except ValueError as e:  # a NUL byte in the path
        raise ModelLoadError(f"{path!r}: not a usable path ({e})") from None
    try:
        if err := refusal(path, what, os.fstat(fd), cap):
            raise err
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def regular_file(path: Path | str, what: str, cap: int = MAX_MODEL_BYTES) -> int:
    """The file's size, once `open_regular` has let it through: for readers that take a path."""
    with open_regular(path, what, cap) as f:
        return os.fstat(f.fileno()).st_size


def read_bytes(path: Path | str, what: str, cap: int = MAX_JSON_BYTES) -> bytes:
    """The whole file, through the gate; never more than `cap` bytes read."""
    with open_regular(path, what, cap) as f:
        data = f.read(cap + 1)
    if len(data) > cap:  # grew while we read it
        raise ModelLoadError(f"{path}: too large for a {what} (it grew past {cap:,} bytes while read)")
    return data


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a plain file"
