"""Whole replies by default (issue 44): no token cap unless the user sets one. A reply ends at the
model's end token, at the full context (closed properly, the next turn trims) or on Esc; serve's
default, a request without max_tokens, is the same."""

from __future__ import annotations

import contextlib

import openai
import pytest
from helpers import assert_invariant, assert_transcript, run, running, turn_of, user

from chatapp.chat.events import Info, Trimmed
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from chatapp.launch import settings_from
from chatapp.options import chat_parser
from chatapp.serve.flags import serve_parser

CONTEXT = 1150


@contextlib.contextmanager
def endless(lm):
    """The model's end token never comes: only a cap, Esc or the context ends a reply (the shared
    model's stop ids come back after)."""
    kept = set(lm.template.stop_ids)
    lm.template.stop_ids.clear()
    try:
        yield lm
    finally:
        lm.template.stop_ids.update(kept)


def test_the_default_reply_runs_past_a_thousand_tokens_to_the_context_and_the_chat_goes_on(tiny):
    settings = settings_from(chat_parser().parse_args(["--model", "random:tiny", "--temperature", "0"]))
    assert settings.max_new_tokens is None  # the flags' default: no cap
    with endless(tiny):
        s = Session(tiny, settings, context=CONTEXT)
        st = turn_of(run(s.send("Explain in detail how a hash table works")))
        assert st.stop == "context" and st.decode_tokens >= 1000
        closing = len(s.template.end_reply())
        assert len(s.tokens) == s.cache.seqlen + 1 + closing == CONTEXT  # the last token and the close pending, fitting
        assert_invariant(s)
        assert_transcript(s)
        s.settings.max_new_tokens = 8  # the next turn trims the full context and replies again
        events = run(s.send("Continue."))
        assert any(isinstance(e, Trimmed) for e in events)
        assert turn_of(events).stop == "length"
        assert_invariant(s)
        assert_transcript(s)


def test_a_cap_the_user_sets_still_cuts_and_none_lifts_it(tiny):
    with endless(tiny):
        k = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=5), context=300), None)
        st = turn_of(run(k.send("a story")))
        assert (st.stop, st.decode_tokens) == ("length", 5)
        (info,) = [e for e in run(k.run_command("/set max_new_tokens none")) if isinstance(e, Info)]
        assert info.data == {"max_new_tokens": None} and k.session.settings.max_new_tokens is None
        assert turn_of(run(k.send("go on"))).stop == "context"
        assert_invariant(k.session)


def test_serve_without_max_tokens_replies_up_to_the_context(tiny):
    args = serve_parser().parse_args(["--model", "random:tiny"])
    args.system, args.low_water = None, None  # as serve.main.run sets them
    defaults = settings_from(args)
    assert defaults.max_new_tokens is None
    with endless(tiny), running(tiny, context=400, max_new_tokens=None) as (server, _):
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="x", messages=[user("write a long story")])
        assert r.choices[0].finish_reason == "length"
        assert r.usage.prompt_tokens + r.usage.completion_tokens >= 400 - 4  # it stopped at the context


@pytest.mark.anyio
async def test_in_the_app_a_reply_without_a_cap_fills_the_context_and_says_so():
    from tui_pilot import endless, make_app, ready, submit

    app = make_app("--context", "200", "--no-store")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        endless(app)
        await submit(pilot, "/set max_new_tokens none")  # tui_pilot's argv caps replies at 24
        await submit(pilot, "tell me everything")
        st = app.session.turn_stats[-1]
        assert st.stop == "context" and st.decode_tokens > 24 and len(app.session.tokens) == 200
        assert app.transcript.exchanges[-1].reply.border_subtitle == "cut: the context is full"
        assert_invariant(app.session)
