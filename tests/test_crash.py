"""Crash safety: `kill -9` the headless process at random points, mid-reply, many times.

Every turn the process reported (and every turn before it) must be in the database, which must
pass `PRAGMA integrity_check`; the next process resumes the chat from whatever is on disk.
CRASH_ROUNDS / CRASH_SEED make it a longer soak: `CRASH_ROUNDS=100 pytest tests/test_crash.py`.
"""

import json
import os
import random
import subprocess
import sys
import time

from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.store.database import ChatStore
from chatapp.store.reopen import pairs
from tests.test_session import assert_invariant

ROUNDS = int(os.environ.get("CRASH_ROUNDS", "8"))
SEED = int(os.environ.get("CRASH_SEED", "7"))


def stored_turns(root) -> tuple[list[tuple[str, str]], int]:
    store = ChatStore(root)
    try:
        assert store.integrity_check() == "ok"
        chat_id = store.latest_id()
        chat = store.get(chat_id) if chat_id else None
        return ([(u.content, a.content) for u, a in pairs(chat.messages)] if chat else []), (chat_id or 0)
    finally:
        store.close()


def turn_events(raw: bytes) -> list[tuple[str, str]]:
    out = []
    for line in raw.decode(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the kill was never a reported turn
        if ev.get("event") == "turn":
            out.append((ev["user"], ev["reply"]))
    return out


def one_round(r: int, rng: random.Random, env: dict, resume: bool) -> tuple[list[tuple[str, str]], dict]:
    """Start, send messages, read a few turns, then kill -9 somewhere in the next reply."""
    cmd = [sys.executable, "-m", "chatapp.cli", "--headless", "--model", "random:tiny", "--temperature", "1",
           "--seed", str(r), "--max-new-tokens", "80", *(["--resume"] if resume else [])]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    p.stdin.write("".join(f"round {r} message {i}\n" for i in range(8)).encode())
    p.stdin.flush()
    ready = json.loads(p.stdout.readline())
    seen, wanted = [], rng.randint(0, 2)
    while len(seen) < wanted:
        seen += turn_events(p.stdout.readline())
    time.sleep(rng.uniform(0.0, 0.3))  # somewhere in the next reply, its commit or its snapshot
    p.kill()
    p.wait()
    seen += turn_events(p.stdout.read())  # reported before the kill, still in the pipe
    return seen, ready


def test_kill_9_mid_reply_never_loses_a_reported_turn(tmp_path, tiny):
    rng = random.Random(SEED)
    env = {**os.environ, "NANOCHAT_TUI_CHATS": str(tmp_path)}
    before: list[tuple[str, str]] = []
    prev_id = 0
    for r in range(ROUNDS):
        resume = 0 < len(before) < 5  # resume the chat a few times, then start another (context stays small)
        seen, ready = one_round(r, rng, env, resume)
        now, chat_id = stored_turns(tmp_path)
        if resume:
            assert ready["chat"] == prev_id and ready["restored_tokens"] + ready["reprefilled_tokens"] > 0
        else:
            before = []
            if chat_id == prev_id:  # killed before its first turn was committed: no new chat yet
                now = []
        assert now[:len(before)] == before, f"round {r}: an earlier turn was lost"
        assert now[len(before):len(before) + len(seen)] == seen, f"round {r}: a reported turn is missing"
        # at most one more: committed, then killed before its event was written
        assert len(now) - len(before) - len(seen) <= 1
        before, prev_id = now, chat_id
    # whatever the kills left on disk opens into a correct cache
    from chatapp.store.keeper import ChatKeeper

    last, chat_id = stored_turns(tmp_path)
    if chat_id:
        k = ChatKeeper(Session(tiny, Settings(), context=tiny.context_length), ChatStore(tmp_path))
        k.open(chat_id)
        assert_invariant(k.session)
        assert [(ex.user, ex.reply) for ex in k.session.exchanges] == last
