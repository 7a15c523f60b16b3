"""Qwen3's thinking end to end: a real (tiny) Llama steered to reply <think>Plan</think>Hi!
goes through the real session, headless mode, the store and the Textual app. The reply text
leaves the thinking out, the thinking travels apart, and the history the model sees next turn
is what the official template renders: earlier thinking dropped (docs/chat-formats.md).
"""

from __future__ import annotations

import io
import json

import pytest
from helpers import assert_invariant, messages, official, scripted_qwen3
from tui_pilot import make_app, ready, replies, submit

from chatapp.chat.events import TextDelta, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.headless import run_headless
from chatapp.keeper.keeper import ChatKeeper
from chatapp.store.database import ChatStore
from chatapp.tui.transcript import Thinking
from model.chat_formats.templates import encode_rendered
from model.loading import LoadedModel

pytestmark = pytest.mark.anyio
USERS = ["Hi, who are you?", "Name three colours.", "Which is warmest?"]




@pytest.fixture(scope="module")
def qwen3():
    return scripted_qwen3()


def session(lm: LoadedModel) -> Session:
    return Session(lm, Settings(temperature=0.0, max_new_tokens=20), context=512)


def test_the_session_splits_thinking_and_shows_the_model_the_official_history(qwen3):
    s = session(qwen3)
    for k, user in enumerate(USERS):
        events = list(s.send(user))
        (st,) = [e for e in events if isinstance(e, TurnStats)]
        deltas = [e for e in events if isinstance(e, TextDelta)]
        assert "".join(d.text for d in deltas if d.kind == "thinking") == "Plan"
        assert "".join(d.text for d in deltas if d.kind == "answer") == "Hi!"
        assert (st.reply, st.thinking, st.stop) == ("Hi!", "Plan", "end")
        # What the model read before this reply: the official template over the chat so far.
        prompt = s.tokens[:s.exchanges[-1].reply_start]
        want = official("Qwen-Qwen3-0.6B", messages(None, USERS[:k + 1], ["<think>Plan</think>Hi!"] * k))
        assert prompt == encode_rendered(s.tokenizer, want)
        if k:  # the last reply lost its thinking: re-prefilled from its start, and no further
            assert st.cached_before == s.exchanges[-2].reply_start
    assert s.exchanges[0].reply == "<think>Plan</think>Hi!"  # the store's text keeps it
    assert_invariant(s)


def test_headless_turns_carry_thinking_apart(qwen3):
    out = io.StringIO()
    run_headless(ChatKeeper(session(qwen3), None), io.BytesIO("\n".join(USERS[:2]).encode() + b"\n"), out=out)
    turns = [e for e in map(json.loads, out.getvalue().splitlines()) if e["event"] == "turn"]
    assert [(t["reply"], t["thinking"]) for t in turns] == [("Hi!", "Plan")] * 2


def test_a_stored_chat_reopens_with_its_thinking(qwen3, tmp_path):
    k = ChatKeeper(session(qwen3), ChatStore(tmp_path))
    for user in USERS[:2]:
        list(k.send(user))
    tokens, chat = list(k.session.tokens), k.chat_id
    k2 = ChatKeeper(session(qwen3), ChatStore(tmp_path))
    list(k2.run_command(f"/load {chat}"))
    s2 = k2.session
    assert s2.tokens == tokens
    assert [s2.template.split_thinking(ex.reply) for ex in s2.exchanges] == [("Plan", "Hi!")] * 2
    (st,) = [e for e in s2.send(USERS[2]) if isinstance(e, TurnStats)]
    assert st.thinking == "Plan" and st.cached_before == s2.exchanges[-2].reply_start


async def test_the_app_shows_thinking_dimmed_and_folds_it_once_the_answer_starts(qwen3):
    app = make_app(opener=lambda args, progress: ChatKeeper(session(qwen3), None))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await submit(pilot, USERS[0])
        reply = app.transcript.exchanges[0].reply
        (view,) = reply.query(Thinking)
        assert view.text == "Plan" and view.collapsed and view.body.has_class("thinking")
        assert replies(app) == ["Hi!"]
        await app.redraw()  # a restored chat is drawn the same way
        (view,) = app.transcript.exchanges[0].reply.query(Thinking)
        assert view.text == "Plan" and replies(app) == ["Hi!"]


def test_an_export_folds_the_thinking_apart_from_the_answer(qwen3, tmp_path):
    k = ChatKeeper(session(qwen3), None)
    list(k.send(USERS[0]))
    (info,) = list(k.run_command(f"/export {tmp_path / 'chat.md'}"))
    text = (tmp_path / "chat.md").read_text()
    assert "<details><summary>thinking</summary>\n\nPlan\n\n</details>\n\nHi!\n" in text
    assert "<think>" not in text and info.data["exchanges"] == 1
