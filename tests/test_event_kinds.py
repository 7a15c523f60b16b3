"""Text deltas carry their kind (answer, thinking, tool call, tool result), decided by the session
from the token ids of tiny real models scripted to think (Qwen3's format) and to call
nanochat's calculator; a reply known only as text (a reopened chat) gets the same parts, and a
`--backend` session reports the same kinds as the in-process one it talks to."""

from __future__ import annotations

import pytest
from helpers import running, scripted, scripted_qwen3

from chatapp.chat.events import Ready, TextDelta, ToolCall, TurnStats, to_json
from chatapp.chat.kinds import Part, answer_text, stored_parts
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.remote.client import OpenAIClient
from chatapp.remote.session import RemoteSession


@pytest.fixture(scope="module")
def qwen3():
    return scripted_qwen3()


@pytest.fixture(scope="module")
def calc():
    return scripted("12*7", " ok")


def kinds(events) -> list[tuple[str, str]]:
    """(kind, text) of the deltas, runs of one kind joined; a ToolCall shows as ("call", expr)."""
    out: list[tuple[str, str]] = []
    for ev in events:
        if isinstance(ev, TextDelta):
            if out and out[-1][0] == ev.kind:
                out[-1] = (ev.kind, out[-1][1] + ev.text)
            else:
                out.append((ev.kind, ev.text))
        elif isinstance(ev, ToolCall):
            out.append(("call", ev.expr))
    return out


def test_thinking_arrives_as_thinking_without_its_markers(qwen3):
    s = Session(qwen3, Settings(temperature=0.0, max_new_tokens=20), context=512)
    events = list(s.send("Hi"))
    assert kinds(events) == [("thinking", "Plan"), ("answer", "Hi!")]
    ex = s.exchanges[0]
    assert ex.parts == [Part("thinking", "Plan"), Part("answer", "Hi!")]
    assert stored_parts(s.template, s.tokenizer, ex.reply) == ex.parts  # the stored text, parsed, says the same


def test_a_calculator_call_and_its_output_arrive_as_tool_kinds(calc):
    s = Session(calc, Settings(temperature=0.0, max_new_tokens=40))
    events = list(s.send("What is 12*7?"))
    assert kinds(events) == [("tool_call", "<|python_start|>12*7<|python_end|>"), ("call", "12*7"),
                             ("tool_result", "<|output_start|>84<|output_end|>"), ("answer", " ok")]
    (st,) = [e for e in events if isinstance(e, TurnStats)]
    assert st.reply == "<|python_start|>12*7<|python_end|><|output_start|>84<|output_end|> ok"  # as before
    ex = s.exchanges[0]
    assert stored_parts(s.template, s.tokenizer, ex.reply) == ex.parts
    assert answer_text(s.reply_parts(ex)) == " ok"
    ex.parts = []  # as a reopened chat's exchange: known only as text
    assert answer_text(s.reply_parts(ex)) == " ok"


def test_the_backend_session_reports_the_servers_thinking_as_thinking(qwen3):
    with running(qwen3, max_new_tokens=20) as (server, _):
        r = RemoteSession(OpenAIClient(server.url, None, 30.0), "scripted", Settings(temperature=0.0), 512)
        events = list(r.send("Hi"))
    assert kinds(events) == [("thinking", "Plan"), ("answer", "Hi!")]
    assert r.exchanges[0].reply == "Hi!" and r.reply_parts(r.exchanges[0])[0] == Part("thinking", "Plan")


def test_the_ready_line_is_a_declared_event_printed_flat():
    ev = Ready({"model": "m", "capacity": 8}, {"chat": None})
    assert list(to_json(ev).items()) == [("event", "ready"), ("model", "m"), ("capacity", 8), ("chat", None)]
