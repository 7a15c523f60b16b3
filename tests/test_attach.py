"""/file and /copy through the real keeper and session (random:tiny, scripted Qwen3 and nanochat
models), the real store, and headless mode in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import assert_invariant, scripted, scripted_qwen3

from chatapp.chat.events import Copied, Error, Info, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from chatapp.store.database import ChatStore


def keeper(lm, store=None, context=512, max_new_tokens=8) -> ChatKeeper:
    return ChatKeeper(Session(lm, Settings(temperature=0.0, max_new_tokens=max_new_tokens), context=context), store)


def one(events) -> Info | Error | Copied:
    (ev,) = list(events)
    return ev


def test_each_file_that_cannot_be_attached_gets_one_line(tiny, tmp_path):
    k = keeper(tiny)
    (tmp_path / "nul.bin").write_bytes(b"PK\x03\x04\x00\x00data")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 ol\u00e9".encode("latin-1"))
    (tmp_path / "controls.dat").write_bytes(bytes(range(1, 32)) * 40)
    (tmp_path / "big.txt").write_text("word " * 200)
    (tmp_path / "huge.txt").write_text("x" * 100_000)
    (tmp_path / "secret.txt").write_text("no")
    (tmp_path / "secret.txt").chmod(0)
    hint = "raise --context, up to the model's 2048"
    room = k.session.message_room  # the most tokens one user turn may take
    body = f"```{tmp_path / 'big.txt'}\n{'word ' * 200}\n```\n\n"
    need = len(k.session.turn_tokens(body, first=not k.session.exchanges))
    assert need > room
    cases = {
        "missing.txt": "cannot read it (No such file or directory)",
        ".": "a directory, not a file",
        "nul.bin": "a binary file (it holds NUL bytes), not text",
        "latin1.txt": "not UTF-8 text (byte 0xe9 at offset 3 is invalid continuation byte)",
        "controls.dat": "looks binary (it is full of control characters), not text",
        "big.txt": f"too large for the context: it needs {need:,} tokens, {room:,} fit ({hint})",
        "huge.txt": f"too large for the context: 100.0 kB is far more than the {room:,} tokens a message can hold "
                    f"({hint})",
    }
    if os.geteuid() != 0:  # root reads any file
        cases["secret.txt"] = "cannot read it (Permission denied)"
    for name, why in cases.items():
        path = tmp_path / name
        assert one(k.run_command(f"/file {path}")) == Error(f"/file {path}: {why}"), name
    assert not k.session.attached.files and one(k.run_command("/file")).data == {"attached": [], "tokens": 0}


def test_a_large_paste_attaches_and_a_lone_surrogate_is_refused_in_one_line(tiny):
    k = keeper(tiny)
    assert isinstance(one(k.attach_text("a pasted text " * 10)), Info)
    err = one(k.attach_text("broken \udc80 paste"))
    assert isinstance(err, Error) and "not valid Unicode" in err.message and "\n" not in err.message
    assert len(k.session.attached.files) == 1   # the good paste is still attached, the bad one is not


def test_files_go_with_the_next_message_only_and_the_store_keeps_them(tiny, tmp_path):
    (tmp_path / "a.py").write_text("print('```')\r\n")  # a fence inside, Windows newlines
    (tmp_path / "b.md").write_text("\ufeffnotes\n")  # a byte order mark
    k = keeper(tiny, ChatStore(tmp_path / "chats.db"))
    first = one(k.run_command(f"/file '{tmp_path / 'a.py'}'"))  # quoted, as drag and drop pastes it
    second = one(k.run_command(f"/file {tmp_path / 'b.md'}"))
    assert first.text.startswith(f"attached {tmp_path / 'a.py'} (13 bytes, ")
    assert "; with it: " in second.text and second.data["attached"][1] == {"name": str(tmp_path / "b.md"),
                                                                          "characters": 6}
    listed = one(k.run_command("/file"))
    assert listed.text.endswith(f"({second.data['tokens']:,} tokens); /file --clear drops them")

    turn = [e for e in k.send("review these") if isinstance(e, TurnStats)][0]
    sent = f"````{tmp_path / 'a.py'}\nprint('```')\n````\n\n```{tmp_path / 'b.md'}\nnotes\n```\n\nreview these"
    assert turn.user == sent and k.session.exchanges[0].user == sent
    assert_invariant(k.session)
    assert k.store.get(k.chat_id).messages[0].content == sent
    assert not k.session.attached.files  # sent: the next message goes alone
    assert [e for e in k.send("and?") if isinstance(e, TurnStats)][0].user == "and?"

    one(k.run_command(f"/file {tmp_path / 'b.md'}"))
    assert one(k.run_command("/file --clear")).text == "dropped 1 attached file(s)"
    assert not k.session.attached.files


def test_copy_gives_the_answer_without_thinking_or_tool_spans():
    k = keeper(scripted_qwen3(), max_new_tokens=40)
    list(k.send("Hi, who are you?"))
    assert "<think>" in k.session.exchanges[0].reply
    assert one(k.run_command("/copy")) == Copied(1, 1, "Hi!")

    k = keeper(scripted("12*7", " ok"), max_new_tokens=40)
    list(k.send("What is 12*7?"))
    list(k.send("Again?"))
    assert one(k.run_command("/copy 1")) == Copied(1, 2, " ok") == one(k.run_command("/copy -2"))
    for arg, why in [("0", "there are 2 replies; N is 1 to 2, or -1 to -2 counting back"),
                     ("1_0", "N is a reply number (1 is the first, -1 the last), got '1_0'")]:
        assert one(k.run_command(f"/copy {arg}")) == Error(f"/copy: {why}")


def test_headless_file_then_message_then_copy(tmp_path):
    (tmp_path / "notes.txt").write_text("buy milk\n")
    stdin = f"/file {tmp_path / 'notes.txt'}\n/file {tmp_path}\nwhat does it say?\n/copy\n/copy 2\n".encode()
    p = subprocess.run([sys.executable, "-m", "chatapp.cli", "--headless", "--model", "random:tiny",
                        "--temperature", "0", "--max-new-tokens", "8"], input=stdin, capture_output=True,
                       timeout=120, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    events = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert [e["event"] for e in events] == ["ready", "info", "error", "turn", "copy", "error"], p.stderr.decode()
    assert events[1]["data"]["attached"] == [{"name": str(tmp_path / "notes.txt"), "characters": 9}]
    assert events[3]["user"] == f"```{tmp_path / 'notes.txt'}\nbuy milk\n```\n\nwhat does it say?"
    copy = events[4]
    assert copy == {"event": "copy", "reply": 1, "of": 1, "text": events[3]["reply"].strip("\n")}
