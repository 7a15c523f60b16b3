"""Issue 27 item 3 (and the odd paths): attachments, snapshots, exports and the database read or
write only regular files; a snapshot segment holds exactly the tensors expected or is refused
unread; a full disk leaves no partial export. Real files, FIFOs and devices."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save

from chatapp.chat.events import Error, Info
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from chatapp.keeper.models import RECENT_FILE, recent
from chatapp.store.database import ChatStore
from chatapp.store.export import ExportedChat, export
from chatapp.store.identity import Fingerprint
from chatapp.store.records import StoreError
from chatapp.store.snapshots import FORMAT, checksum, load_chain, scan, write_segment
from chatapp.store.tempfiles import write_atomic


@pytest.fixture
def session(tiny):
    return Session(tiny, Settings(temperature=0.0, max_new_tokens=4), context=256)


def one_error(events) -> str:
    events = list(events)
    assert len(events) == 1 and isinstance(events[0], Error), events
    assert "\n" not in events[0].message
    return events[0].message


def test_file_refuses_fifos_devices_and_unknown_users_in_one_line_at_once(session, tmp_path):
    os.mkfifo(tmp_path / "fifo")
    t0 = time.perf_counter()
    k = ChatKeeper(session, None)
    assert "a FIFO, not a regular file" in one_error(k.run_command(f"/file {tmp_path / 'fifo'}"))
    assert "a character device" in one_error(k.run_command("/file /dev/zero"))
    assert "not a usable path" in one_error(k.run_command("/file ~nosuchuser-27/x"))
    assert time.perf_counter() - t0 < 1.0 and not session.attached.files


def test_export_refuses_devices_and_keeps_no_partial_file_on_a_full_disk(session, tmp_path):
    t = ExportedChat("t", "m", "", [("hi", "x" * 200_000, "", [])])
    with pytest.raises(StoreError, match="not a regular file"):
        export(t, "/dev/full")
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no user namespaces here to mount a tiny tmpfs (a real ENOSPC)")
    small = tmp_path / "small"
    small.mkdir()
    script = ("import sys; from chatapp.store.export import ExportedChat, export; from chatapp.store.database "
              "import StoreError\nt = ExportedChat('t', 'm', '', [('hi', 'x' * 200_000, '', [])])\n"
              f"try:\n    export(t, {str(small / 'chat.md')!r})\nexcept StoreError as e:\n    print(e)")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {small} && "
                        f"{sys.executable} -c \"$0\"; ls -A {small}", script], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    out = r.stdout.strip().splitlines()
    assert out and "No space left on device" in out[0] and "nothing was kept" in out[0], r
    assert out[1:] == [], f"a partial file was left: {out[1:]}"


def segment_with_extra_tensor(session, folder, ident):
    seg = write_segment(folder, session.cache, 0, session.cache.seqlen, session.tokens, ident)
    tensors = {"k": session.cache.k_cache[:, :, :seg.end].contiguous(),
               "v": session.cache.v_cache[:, :, :seg.end].contiguous(), "extra": torch.zeros(1 << 16)}
    meta = {"format": FORMAT, "start": "0", "end": str(seg.end), "prefix": seg.prefix,
            "identity": ident.to_json(), "checksum": checksum(tensors)}  # a valid checksum over the extra
    write_atomic(seg.path, save(tensors, metadata=meta))
    return seg


def test_a_segment_with_an_extra_tensor_or_a_fifo_is_refused_unread(session, tmp_path):
    list(session.send("hello"))
    ident = Fingerprint(session.lm).get()
    folder = tmp_path / "snap"
    segment_with_extra_tensor(session, folder, ident)
    segments, bad = scan(folder)
    n, why = load_chain(session.cache, segments)
    assert n == 0 and "holds tensors" in why and "extra" in why
    os.mkfifo(folder / "00000000-00000001.safetensors")  # safe_open would block on it forever
    t0 = time.perf_counter()
    segments, bad = scan(folder)
    assert time.perf_counter() - t0 < 1.0 and [p.name for p in bad] == ["00000000-00000001.safetensors"]


def test_a_database_path_linked_to_a_device_is_refused(tmp_path):
    (tmp_path / "chats.db").symlink_to("/dev/null")
    with pytest.raises(StoreError, match="not a regular file"):
        ChatStore(tmp_path)


def test_a_damaged_recent_models_list_is_an_empty_one(tmp_path):
    (tmp_path / RECENT_FILE).write_text("[" * 100_000 + "]" * 100_000)
    assert recent(tmp_path) == []
    (tmp_path / RECENT_FILE).unlink()
    os.mkfifo(tmp_path / RECENT_FILE)
    assert recent(tmp_path) == []


def test_export_of_a_chat_still_works(session, tmp_path):
    list(session.send("hello"))
    from chatapp.keeper.keeper import ChatKeeper

    events = list(ChatKeeper(session, None).export(str(tmp_path / "c.md")))
    assert isinstance(events[0], Info) and (tmp_path / "c.md").read_text().count("## User") == 1


@pytest.mark.anyio
async def test_the_tui_refuses_a_fifo_at_once_and_ctrl_q_still_quits(tmp_path):
    """`/file FIFO` hung the TUI, Esc did nothing and Ctrl+Q left the process alive (issue 27)."""
    from tui_pilot import make_app, notices, ready, submit

    os.mkfifo(tmp_path / "fifo")
    app = make_app("--no-store")
    async with app.run_test() as pilot:
        await ready(pilot)
        await submit(pilot, f"/file {tmp_path / 'fifo'}", timeout=30)  # a blocked read would never finish
        assert any("a FIFO, not a regular file" in n for n in notices(app, "error"))
        await pilot.press("escape")
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert app.return_code in (0, None)
