"""Issue 45 finding 4: a chat template that raises on a later turn (here a division by zero
whenever a message says "boom") costs that turn only. Headless mode answers it with one error line
and reads the next input; the TUI shows one line and keeps the chat; the conversation and the
cache are as they were before the turn, so the turn after it reuses the whole cache."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from helpers import save_variant
from tui_pilot import make_app, notices, ready, replies, submit

from chatapp.chat.events import Error, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.tui.transcript import UserMessage
from model.chat_formats.recognize import template_for
from model.loading import load_model

BOOM = ("{% for m in messages %}{% if 'boom' in m['content'] %}{{ 1 // 0 }}{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}")


# Issue 45 finding 12: a template that renders a chat as nothing said "cannot rewind to -1".
QUIET = "{% if 'quiet' not in messages[-1]['content'] %}" + BOOM + "{% endif %}"


def folder_with(d, template: str):
    """A tiny Qwen2 folder whose own template is `template` (rendered whole: no format of ours is it)."""
    save_variant(d, "qwen2-tied")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
    return d


@pytest.fixture(scope="module")
def boom_dir(tmp_path_factory):
    return folder_with(tmp_path_factory.mktemp("boom"), BOOM)


def test_a_template_that_renders_a_chat_as_nothing_refuses_the_turn_in_one_line(tmp_path):
    s = Session(load_model(str(folder_with(tmp_path, QUIET))), Settings(temperature=0.0, max_new_tokens=4))
    assert any(isinstance(e, TurnStats) for e in s.send("hello"))
    before = (list(s.tokens), s.cache.seqlen, [ex.reply for ex in s.exchanges])
    errors = [e.message for e in s.send("be quiet") if isinstance(e, Error)]
    assert errors == ["the model's chat template renders this chat as no tokens; nothing was sent; "
                      "the chat is as it was before this message"]
    assert (list(s.tokens), s.cache.seqlen, [ex.reply for ex in s.exchanges]) == before


def test_headless_reports_a_template_failure_on_turn_two_and_reads_on(boom_dir, tmp_path):
    cmd = [sys.executable, "-m", "chatapp.cli", "--headless", "--model", str(boom_dir), "--temperature", "0",
           "--max-new-tokens", "4"]
    p = subprocess.run(cmd, input=b"hello\nboom now\nand then?\n", capture_output=True, timeout=300,
                       env={**os.environ, "NANOCHAT_TUI_HOME": str(tmp_path), "PYTHONIOENCODING": "utf-8"})
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr.decode()[-800:]
    events = [json.loads(line) for line in p.stdout.decode().splitlines()]
    turns = [e for e in events if e["event"] == "turn"]
    (error,) = [e for e in events if e["event"] == "error"]
    assert "ZeroDivisionError" in error["message"] and "\n" not in error["message"]
    assert [t["user"] for t in turns] == ["hello", "and then?"]   # the third input was read and answered
    one, three = turns
    assert three["turn"] == 2 and three["cached_before"] > 0   # turn 1 was kept, in the chat and the cache


@pytest.mark.anyio
async def test_the_tui_reports_a_template_failure_in_one_line_and_keeps_the_chat(boom_dir, home):
    app = make_app("--model", str(boom_dir), "--temperature", "0", "--max-new-tokens", "4")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await submit(pilot, "hello", timeout=120)
        s = app.session
        before = (list(s.tokens), [ex.reply for ex in s.exchanges], s.cache.seqlen, replies(app))
        await submit(pilot, "boom now", timeout=120)
        await pilot.pause()
        (line,) = [n for n in notices(app, "error") if "ZeroDivisionError" in n]
        assert "\n" not in line
        assert (list(s.tokens), [ex.reply for ex in s.exchanges], s.cache.seqlen, replies(app)) == before
        assert [w.text for w in app.transcript.query(UserMessage)] == ["hello"]
        assert app.input.text == "boom now"   # the message is handed back, as for any failed turn
        app.input.clear()
        await submit(pilot, "and then?", timeout=120)
        assert s.turns == 2 and s.turn_stats[-1].cached_before >= before[2]


# The private-use characters whole.py marks reply places with, written by a template or typed in
# a message, were read as a reply number: IndexError at load, or on the turn that held them.
MARKS = ("\ue000" + "99" + "\ue001{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>{% endfor %}"
         "{% if add_generation_prompt %}assistant:{% endif %}")


def test_reply_placeholders_written_by_a_template_or_typed_are_text(tiny):
    s = Session(dataclasses.replace(tiny, template=template_for(tiny.tokenizer, MARKS)),
                Settings(temperature=0.0, max_new_tokens=4))
    assert s.template.whole
    for message in ("hello", "typed \ue0000\ue001 and \ue00077\ue001", "and then?"):
        events = list(s.send(message))
        assert not [e for e in events if isinstance(e, Error)] and [e for e in events if isinstance(e, TurnStats)]
    assert "\ue00077\ue001" in s.tokenizer.decode(s.tokens)
