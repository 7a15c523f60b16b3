"""Headless mode through a real subprocess: the JSON-lines contract, bad input, context limits."""

import io
import json
import os
import subprocess
import sys

import pytest
from helpers import BASE, headless

from chatapp.chat.events import Info
from chatapp.headless import play


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
                "backend", "rss_bytes"):
        assert key in t1
    assert "unknown command /nope" in events[2]["message"]
    assert "UTF-8" in events[4]["message"]
    assert events[6]["cache_seqlens"] == 0
    assert b"Traceback" not in p.stderr


def test_a_doubled_slash_sends_a_message_that_starts_with_one():
    p, events = headless(b"//usr/bin/env crashes, why?\n/stats\n")
    assert p.returncode == 0, p.stderr.decode()
    assert [e["event"] for e in events] == ["ready", "turn", "info"]
    assert events[1]["user"] == "/usr/bin/env crashes, why?"


def test_jsonl_multiline_messages():
    stdin = (json.dumps({"user": "line one\nline two"}) + "\n" + "{not json\n"
             + json.dumps({"command": "/stats"}) + "\n").encode()
    p, events = headless(stdin, "--jsonl")
    assert p.returncode == 0
    assert [e["event"] for e in events] == ["ready", "turn", "error", "info"]
    assert events[1]["user"] == "line one\nline two"
    assert events[3]["data"]["cache_seqlens"] == events[1]["cache_seqlens"]


def test_what_a_script_reads_is_whole_sentences_with_plurals_and_aligned_stats(tmp_path):
    """Issue 44: --jsonl errors were cut mid-sentence ("Unterminated string starting at"),
    /export said "exported 1 exchanges", and /stats was one dense key=value block."""
    out = tmp_path / "chat.md"
    stdin = "\n".join(['{"user": "hi', '{"user": "hi"} {}', json.dumps({"user": "hello"}),
                       json.dumps({"command": f"/export {out}"}), json.dumps({"command": "/stats"})]) + "\n"
    p, events = headless(stdin.encode(), "--jsonl")
    assert p.returncode == 0, p.stderr.decode()
    assert [e["message"] for e in events if e["event"] == "error"] == [
        "line 1: not valid JSON: unterminated string starting at column 10; line skipped",
        "line 2: not valid JSON: extra data at column 16; line skipped"]
    export, stats = [e for e in events if e["event"] == "info"]
    assert export["text"] == f"exported 1 exchange to {out}"
    head, *rows = stats["text"].splitlines()
    assert head == "cache" and rows[0].split() == ["model", "random:tiny"]
    assert f"cache_seqlens {stats['data']['cache_seqlens']}" in " ".join(stats["text"].split())
    assert head == "cache" and {"settings", "last turn"} <= {r for r in rows if not r.startswith("  ")}
    named = [(r, *r.split(None, 1)) for r in rows if r.startswith("  ")]
    assert len({r.index(value, len(name) + 2) for r, name, value in named}) == 1  # every value in one column


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


def test_unusable_home_is_one_line_error(tmp_path):
    """An OS refusal (here a data home under a plain file) is the machine's answer, not a bug."""
    (tmp_path / "file").write_text("")
    env = {**os.environ, "NANOCHAT_TUI_HOME": str(tmp_path / "file" / "home")}
    p = subprocess.run([sys.executable, "-m", "chatapp.cli", "pull"], capture_output=True, timeout=60, env=env)
    err = p.stderr.decode().strip()
    assert p.returncode == 1 and err == f"nanochat-tui: error: Not a directory: {tmp_path / 'file' / 'home'}"


@pytest.mark.parametrize("args, error", [
    ([b"--headless", b"--system", b"ab\xffcd"], "--system is not valid UTF-8 text"),
    (["--headless", "--device", "foo"], "--device 'foo' is not a device (try cpu, cuda or cuda:1)"),
    (["--headless", "--device", "meta"], "--device meta: only cpu and cuda devices are supported"),
    (["--headless", "--device", "cpu", "--attn", "fa3"], "--attn fa3 is not available here"),
    (["--headless", "--model", ""], "--model is empty; leave it out for the default model"),
    (["tokenize", "--device", "foo"], "--device 'foo' is not a device"),
    (["--model", "random:tiny"], "the chat screen needs a terminal on stdin and stdout"),  # stdin is a pipe
    (["--headless", "--step", "5"], "--step: only for nanochat checkpoints, and random:tiny is not one"),
], ids=["system-bytes", "device", "meta", "attn", "empty-model", "tokenize", "no-terminal", "step"])
def test_bad_flags_are_one_line_errors(args, error):
    model = [] if "--model" in args else ["--model", "random:tiny"]
    p = subprocess.run([sys.executable, "-m", "chatapp.cli", *args, *model], input=b"hi\n", capture_output=True,
                       timeout=60)
    err = p.stderr.decode().strip()
    assert p.returncode == 1 and p.stdout == b"" and "\n" not in err, err
    assert err.startswith(f"nanochat-tui: error: {error}"), err


@pytest.mark.parametrize("redirect", ["<&-", ">&-"])
def test_closed_stdin_or_stdout_is_one_line_error(redirect):
    cmd = f"{sys.executable} -m chatapp.cli --headless --model random:tiny {redirect}"
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=60)
    assert p.returncode == 1 and p.stderr.decode() == (
        "nanochat-tui: error: stdin or stdout is closed; a chat reads one and writes the other\n")


def test_a_context_above_the_models_says_what_it_uses():
    p, events = headless(b"", "--context", "99999")
    assert p.stderr.decode().strip().splitlines()[-1] == (
        "nanochat-tui: --context 99999 is more than random:tiny takes; using its 2048")
    assert events[0]["capacity"] == 2048


def test_jsonl_alone_means_headless():
    p = subprocess.run([*BASE[:3], *BASE[4:], "--jsonl"], input=b'{"user": "hi"}\n', capture_output=True,
                       timeout=60)
    assert [json.loads(line)["event"] for line in p.stdout.decode().splitlines()] == ["ready", "turn"]


def test_awkward_json_lines_are_skipped_and_the_chat_goes_on():
    stdin = b"\xef\xbb\xbf" + b"[" * 100_000 + b'\n{"user": "hi", "n": ' + b"9" * 5000 + b'}\n{"user": "hi"}\n'
    p, events = headless(stdin, "--jsonl")
    assert [e["event"] for e in events] == ["ready", "error", "error", "turn"], events
    assert "too deeply nested or with too large a number" in events[1]["message"]


def test_hostile_input_gets_one_line_errors_and_the_chat_goes_on(tmp_path):
    lines = [
        json.dumps({"user": "hello"}),
        json.dumps({"command": "/set seed=99999999999999999999999"}),    # past torch's 64-bit seeds
        json.dumps({"command": "/set temperature=1e-300"}),               # valid, and must still sample
        '{"user": "\\ud800 lone surrogate"}',                              # valid JSON, not valid text
        json.dumps({"user": "again"}),
        json.dumps({"command": "/load 99999999999999999999999"}),         # past SQLite's integers
        json.dumps({"command": "/load 1_0"}),                             # int() would read 10
        json.dumps({"command": "/export " + str(tmp_path / "a\x00b.md")}),  # a NUL byte in the path
        json.dumps({"command": "/system " + "long " * 100}),              # leaves no room in 200 tokens
        json.dumps({"user": "third"}),
    ]
    p, events = headless(("\n".join(lines) + "\n").encode(), "--jsonl", "--context", "200")
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr.decode()[-2000:]
    assert [e["event"] for e in events] == ["ready", "turn", "error", "info", "error", "turn",
                                            "error", "error", "error", "error", "turn"]
    messages = [e["message"] for e in events if e["event"] == "error"]
    assert "seed must be an integer from 0 to 2**64 - 1" in messages[0]
    assert "lone surrogate" in messages[1]
    assert "no stored chat 99999999999999999999999" in messages[2]
    assert "a chat id is a number" in messages[3]
    assert messages[4].startswith("/export: not a usable path")
    assert "system prompt leaves no room" in messages[5]
    assert all("\n" not in m for m in messages)
    again, third = events[5], events[10]
    assert third["cached_before"] == again["cache_seqlens"]  # none of it disturbed the conversation
    assert third["turn"] == again["turn"] + 1


def test_a_system_prompt_that_cannot_fit_is_refused_at_start():
    p, events = headless(b"hello\n", "--context", "40")
    assert p.returncode == 1 and events == []
    err = p.stderr.decode().strip()
    assert err.startswith("nanochat-tui: error: the system prompt leaves no room") and "\n" not in err


def test_a_reader_that_goes_away_ends_the_run_quietly():
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    p = subprocess.Popen(BASE + ["--no-store"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    assert json.loads(p.stdout.readline())["event"] == "ready"
    p.stdout.close()  # like `| head -1`
    _, err = p.communicate(b"hello\nhello again\n", timeout=120)
    assert p.returncode == 1
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_a_cpu_without_simd_gets_one_note_and_errors_stay_one_line():
    """The portable build (what a CPU without AVX2 compiles) says so once, when the chat is ready;
    an error before that is still the only line on stderr."""
    env = {**os.environ, "NANOCHAT_NATIVE": "portable", "PYTHONIOENCODING": "utf-8"}
    p = subprocess.run(BASE + ["--max-new-tokens", "4"], input=b"hi\n", capture_output=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stderr.decode() == ("nanochat-tui: note: CPU kernels built without SIMD (NANOCHAT_NATIVE=portable); "
                                 "decode runs the portable C path (slower)\n")
    assert [json.loads(line)["event"] for line in p.stdout.decode().splitlines()] == ["ready", "turn"]
    p = subprocess.run(BASE + ["--context", "40"], input=b"hi\n", capture_output=True, timeout=300, env=env)
    err = p.stderr.decode().strip()
    assert p.returncode == 1 and err.startswith("nanochat-tui: error: the system prompt leaves no room"), err
    assert "\n" not in err


PROMPT = b"Review this function:\n\n    def add(a, b):\n        return a + b\n\nIs it right?\n"


def test_a_piped_multiline_prompt_is_one_message():
    """Issue 44: `cat prompt.txt | nanochat-tui --headless` made a turn of each line."""
    p, events = headless(PROMPT, "--multiline")
    assert p.returncode == 0, p.stderr.decode()
    assert [e["event"] for e in events] == ["ready", "turn"]
    assert events[1]["user"] == PROMPT.decode().rstrip("\n")  # indentation and the blank lines kept
    p, events = headless(PROMPT)
    assert [e["event"] for e in events].count("turn") == 4  # without it: a turn per non-blank line


def test_multiline_messages_end_at_a_lone_dot():
    stdin = (b"\nfirst line\nsecond line\n\n.\n/stats\n .  \n" + b"bad \xff\nstill the bad one\n.\n"
             + b"//etc is a path\nnot a command\n.\n\n.\nlast message, no dot\n")
    p, events = headless(stdin, "--multiline")
    assert p.returncode == 0, p.stderr.decode()
    assert [e["event"] for e in events] == ["ready", "turn", "info", "error", "turn", "turn"]
    assert events[1]["user"] == "first line\nsecond line"   # blank first and last lines dropped
    assert events[2]["data"]["turns"] == 1                    # a one-line /... message is the command
    assert events[3]["message"].startswith("line 8: not valid UTF-8") and "its message skipped" in events[3]["message"]
    assert events[4]["user"] == "/etc is a path\nnot a command" and events[5]["user"] == "last message, no dot"


def test_multiline_alone_is_headless_and_refuses_jsonl():
    p = subprocess.run([*BASE[:3], *BASE[4:], "--multiline"], input=b"hi\nthere\n", capture_output=True, timeout=120)
    events = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert p.returncode == 0 and [e["event"] for e in events] == ["ready", "turn"]
    p, _ = headless(b"hi\n", "--multiline", "--jsonl")
    assert p.returncode != 0 and "--multiline cannot be combined with --jsonl" in p.stderr.decode()
    assert len(p.stderr.decode().strip().splitlines()) == 1


def test_an_exception_that_reaches_headless_mode_is_one_line_naming_where_and_input_goes_on():
    """Issue 45 finding 4: the last resort. Whatever a keeper's events raise is one error line
    naming module:function, and `play` returns to read the next input (it returns True only to quit)."""
    def events():
        yield Info("before")
        raise ZeroDivisionError("integer division or modulo by zero")

    out = io.StringIO()
    assert play(events(), out) is False
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == [{"event": "info", "text": "before", "data": {}},
                     {"event": "error", "message": "internal error in tests.test_headless:events: "
                                                   "ZeroDivisionError: integer division or modulo by zero"}]
