"""Headless mode through a real subprocess: the JSON-lines contract, bad input, context limits."""

import json
import os
import subprocess
import sys

BASE = [sys.executable, "-m", "chatapp.cli", "--headless", "--model", "random:tiny", "--temperature", "0",
        "--max-new-tokens", "8"]


def headless(stdin: bytes, *extra: str, timeout=120):
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    p = subprocess.run(BASE + list(extra), input=stdin, capture_output=True, timeout=timeout, env=env)
    lines = p.stdout.decode().splitlines()
    return p, [json.loads(line) for line in lines]  # every stdout line must be JSON


def test_turns_commands_and_errors_keep_the_conversation():
    stdin = b"hello\n/nope\nsecond message\n" + b"\xff\xfe broken\n" + b"/set top_k=x\n/reset\nthird\n"
    p, events = headless(stdin)
    assert p.returncode == 0, p.stderr.decode()
    kinds = [e["event"] for e in events]
    assert kinds == ["ready", "turn", "error", "turn", "error", "error", "reset", "turn"]
    t1, t2 = events[1], events[3]
    assert t2["cached_before"] == t1["cache_seqlens"]  # the error did not disturb the cache
    assert t2["prefill_tokens"] < t1["prefill_tokens"]
    for key in ("turn", "user", "reply", "prefill_tokens", "cached_before", "cache_seqlens", "capacity",
                "decode_tokens", "ttft_ms", "tokens_per_s", "stop", "kv_bytes_used", "kv_bytes_allocated",
                "backend"):
        assert key in t1
    assert "unknown command /nope" in events[2]["message"]
    assert "UTF-8" in events[4]["message"]
    assert events[6]["cache_seqlens"] == 0
    assert b"Traceback" not in p.stderr


def test_jsonl_multiline_messages():
    stdin = (json.dumps({"user": "line one\nline two"}) + "\n" + "{not json\n"
             + json.dumps({"command": "/stats"}) + "\n").encode()
    p, events = headless(stdin, "--jsonl")
    assert p.returncode == 0
    assert [e["event"] for e in events] == ["ready", "turn", "error", "info"]
    assert events[1]["user"] == "line one\nline two"
    assert events[3]["data"]["cache_seqlens"] == events[1]["cache_seqlens"]


def test_context_overflow_trims_and_too_long_message_errors():
    msgs = "".join(f"message {i} with some padding text\n" for i in range(12))
    p, events = headless(("x" * 400 + "\n" + msgs).encode(), "--context", "160", "--max-new-tokens", "20")
    assert p.returncode == 0 and b"Traceback" not in p.stderr
    kinds = [e["event"] for e in events]
    assert kinds[1] == "error" and "too long" in events[1]["message"]
    assert "trim" in kinds and kinds.count("turn") == 12
    assert all(e["cache_seqlens"] <= 160 for e in events if e["event"] == "turn")


def test_bad_model_is_one_line_error():
    p = subprocess.run([sys.executable, "-m", "chatapp.cli", "--headless", "--model", "/no/such/model"],
                       input=b"", capture_output=True, timeout=60)
    assert p.returncode != 0 and p.stdout == b""
    err = p.stderr.decode().strip()
    assert err.startswith("nanochat-tui: error: model not found") and "\n" not in err
