"""Stored chats in headless mode, through real subprocesses: --resume, --chat, /save, /load,
restored_tokens in the JSON, --no-store, and a chats dir that cannot be written."""

import json
import os
import subprocess
import sys
from pathlib import Path

BASE = [sys.executable, "-m", "chatapp.cli", "--headless", "--model", "random:tiny", "--temperature", "0",
        "--max-new-tokens", "6"]


def headless(stdin: str, *extra: str, chats: Path):
    env = {**os.environ, "NANOCHAT_TUI_CHATS": str(chats)}
    p = subprocess.run(BASE + list(extra), input=stdin.encode(), capture_output=True, timeout=120, env=env)
    return p, [json.loads(line) for line in p.stdout.decode().splitlines()]


def test_resume_continues_from_the_snapshot_and_reports_restored_tokens(tmp_path):
    p, ev = headless("hello\n/save Greeting\nsecond\n", chats=tmp_path)
    assert p.returncode == 0, p.stderr.decode()
    assert [e["event"] for e in ev] == ["ready", "turn", "saved", "turn"]
    assert ev[0]["chat"] is None and ev[0]["restored_tokens"] == 0
    assert ev[0]["store"] == str(tmp_path / "chats.db")
    assert ev[2]["chat"] == 1 and ev[2]["title"] == "Greeting" and ev[2]["snapshot_tokens"] == ev[1]["cache_seqlens"]
    last = ev[3]

    p, ev = headless("third\n", "--resume", chats=tmp_path)
    assert p.returncode == 0, p.stderr.decode()
    ready, turn = ev
    assert (ready["chat"], ready["title"]) == (1, "Greeting")
    assert ready["restored_tokens"] == last["cache_seqlens"] and ready["reprefilled_tokens"] == 0
    assert turn["cached_before"] == last["cache_seqlens"]  # the history came from the snapshot
    assert turn["prefill_tokens"] < 40  # only the new message (and the last reply's closing tokens)

    # a new chat, then /load switches back; /load with a bad id keeps going
    p, ev = headless("/reset\nother chat\n/load 1\n/load 99\n/load abc\n", "--chat", "1", chats=tmp_path)
    kinds = [e["event"] for e in ev]
    assert kinds == ["ready", "reset", "turn", "load", "error", "error"], ev
    load = ev[3]
    assert load["chat"] == 1 and load["messages"] == 6 and load["restored_tokens"] == turn["cache_seqlens"]
    assert "no stored chat 99" in ev[4]["message"] and "is a number" in ev[5]["message"]
    chats = subprocess.run(["sqlite3", str(tmp_path / "chats.db"), "select id, title from chats"],
                           capture_output=True, text=True)
    if chats.returncode == 0:  # the sqlite3 shell is optional
        assert chats.stdout.splitlines() == ["1|Greeting", "2|other chat"]


def test_no_store_writes_nothing_and_flags_are_checked(tmp_path):
    chats = tmp_path / "chats"
    p, ev = headless("hello\n/save\n", "--no-store", chats=chats)
    assert p.returncode == 0 and not chats.exists()
    assert ev[0]["store"] is None and ev[2]["event"] == "error" and "--no-store" in ev[2]["message"]
    p, ev = headless("", "--no-store", "--resume", chats=chats)
    assert p.returncode == 1 and ev == []
    assert p.stderr.decode().strip() == "nanochat-tui: error: --no-store cannot be combined with --chat or --resume"
    p, _ = headless("", "--chat", "5", chats=chats)
    assert p.returncode == 1 and p.stderr.decode().strip() == "nanochat-tui: error: no stored chat 5"


def test_unwritable_chats_dir_warns_and_the_chat_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    p, ev = headless("hello\n", chats=blocker / "chats")
    assert p.returncode == 0 and [e["event"] for e in ev] == ["ready", "turn"]
    err = p.stderr.decode()
    assert "warning: chats will not be saved: cannot open the chats database" in err and "Traceback" not in err
    p, ev = headless("", "--resume", chats=blocker / "chats")
    assert p.returncode == 1 and "Traceback" not in p.stderr.decode()


def test_a_trim_keeps_the_dropped_exchanges_in_the_stored_chat(tmp_path):
    """Trimmed exchanges leave the context, not the chat: the store, --resume and /export keep them."""
    msgs = [f"important fact number {i} to remember" for i in range(8)]
    p, ev = headless("\n".join(msgs) + "\n", "--context", "160", chats=tmp_path)
    assert p.returncode == 0, p.stderr.decode()
    assert "trim" in [e["event"] for e in ev]
    turns = [e for e in ev if e["event"] == "turn"]
    assert [t["turn"] for t in turns] == list(range(1, 9))

    out = tmp_path / "chat.md"
    p, ev = headless(f"/export {out}\none more\n", "--resume", "--context", "400", chats=tmp_path)
    assert p.returncode == 0, p.stderr.decode()
    ready, exported, turn = ev[0], ev[1], ev[-1]
    assert ready["turns"] == 8  # all 8 exchanges came back, trimmed or not
    assert exported["data"]["exchanges"] == 8
    text = out.read_text()
    assert all(m in text for m in msgs)
    assert turn["turn"] == 9 and turn["cached_before"] == ready["cache_seqlens"]  # the context came back as it was


def test_a_typed_flag_overrides_the_stored_chat_even_at_its_default_value(tmp_path):
    from chatapp.store.database import ChatStore

    cmd = [sys.executable, "-m", "chatapp.cli", "--headless", "--model", "random:tiny", "--max-new-tokens", "4"]
    env = {**os.environ, "NANOCHAT_TUI_CHATS": str(tmp_path)}

    def stored_temperature(*flags: str) -> float:
        """Run one turn, then read the chat's settings back from the database."""
        p = subprocess.run(cmd + list(flags), input=b"hello\n", capture_output=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr.decode()
        store = ChatStore(tmp_path)
        try:
            return store.get(store.latest_id()).settings["temperature"]
        finally:
            store.close()

    assert stored_temperature("--temperature", "0.7") == 0.7
    assert stored_temperature("--resume") == 0.7  # nothing typed: the stored chat's value
    # 0.2 is the default: before, a flag equal to the default counted as not given
    assert stored_temperature("--resume", "--temperature", "0.2") == 0.2
    assert stored_temperature("--resume") == 0.2  # and the chat keeps it


LEGACY = Path(__file__).parent / "data" / "legacy_store"


def test_chats_stored_before_the_redesign_still_open(tmp_path):
    """tests/data/legacy_store was written by the code before the chatapp/ redesign (two chats, the first
    with /set temperature=0.5 and /save "legacy chat", KV snapshots for both)."""
    import shutil

    snap, replayed = tmp_path / "snap", tmp_path / "replayed"
    shutil.copytree(LEGACY, snap)
    shutil.copytree(LEGACY, replayed)
    shutil.rmtree(replayed / "snapshots")  # the same chat, re-prefilled from its stored tokens
    script = "/set\nNext one\n"
    runs = {}
    for name, root in (("snap", snap), ("replayed", replayed)):
        p, ev = headless(script, "--chat", "1", "--context", "256", "--max-new-tokens", "10", chats=root)
        assert p.returncode == 0, p.stderr.decode()
        runs[name] = ev
    ready, settings, turn = runs["snap"]
    assert (ready["chat"], ready["title"], ready["turns"]) == (1, "legacy chat", 2)
    assert ready["restored_tokens"] == 125 and ready["reprefilled_tokens"] == 0
    assert runs["replayed"][0]["restored_tokens"] == 0 and runs["replayed"][0]["reprefilled_tokens"] == 125
    assert settings["data"]["temperature"] == 0.0  # --temperature 0 (BASE) was typed: it wins over the stored 0.5
    assert turn["cached_before"] == 125 and turn["reply"] == runs["replayed"][2]["reply"]
    p, ev = headless("/load 2\n", "--context", "256", chats=snap)
    assert ev[1]["event"] == "load" and ev[1]["chat"] == 2 and ev[1]["restored_tokens"] == 78
