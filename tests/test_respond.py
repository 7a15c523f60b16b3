"""Session.respond_to: a whole message list in, the longest cached token prefix reused."""

import pytest
from test_session import assert_invariant, assert_transcript

from chatapp.chat.events import Error, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings


def turn_of(events) -> TurnStats:
    (st,) = [e for e in events if isinstance(e, TurnStats)]
    return st


@pytest.fixture
def session(tiny):
    return Session(tiny, Settings(temperature=0.0, max_new_tokens=8), context=1024)


def test_a_client_sending_back_the_chat_prefills_only_the_new_message(session):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    first = turn_of(session.respond_to(msgs))
    assert first.cached_before == 0 and first.prefill_tokens == len(session.tokens) - first.decode_tokens - len(
        session.template.end_reply())
    assert session.system == "Be brief." and len(session.exchanges) == 1
    assert_invariant(session)
    assert_transcript(session)
    for i in range(3):
        msgs += [{"role": "assistant", "content": session.turn_stats[-1].reply}, {"role": "user", "content": f"q{i}"}]
        pos, pending = session.cache.seqlen, len(session.tokens) - session.cache.seqlen
        st = turn_of(session.respond_to(msgs))
        assert st.cached_before == pos  # the whole history reused
        assert st.prefill_tokens == pending + len(session.template.user_turn(f"q{i}"))
        assert_invariant(session)
        assert_transcript(session)
    # a following send continues the same chat
    pos = session.cache.seqlen
    st = turn_of(session.send("and now?"))
    assert st.cached_before == pos and len(session.exchanges) == 5
    assert_invariant(session)
    assert_transcript(session)


def test_an_edited_message_reuses_the_prefix_before_it(session):
    for text in ("one", "two", "three"):
        turn_of(session.send(text))
    replies = [ex.reply for ex in session.exchanges]
    second_start = session.exchanges[1].start
    msgs = [{"role": "user", "content": "one"}, {"role": "assistant", "content": replies[0]},
            {"role": "user", "content": "TWO, edited"}]
    st = turn_of(session.respond_to(msgs))
    assert st.cached_before == second_start  # everything before the edited message stays cached
    assert [ex.user for ex in session.exchanges] == ["one", "TWO, edited"]
    assert_invariant(session)
    assert_transcript(session)
    # a reply the session did not write is encoded from its text, and the cache stays exact
    msgs = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "a reply from elsewhere"},
            {"role": "user", "content": "next"}]
    st = turn_of(session.respond_to(msgs))
    assert st.cached_before == session.exchanges[0].reply_start
    assert session.exchanges[0].reply == "a reply from elsewhere"
    assert_invariant(session)
    assert_transcript(session)


def test_a_new_system_prompt_recomputes_from_the_start(session):
    turn_of(session.send("hello"))
    st = turn_of(session.respond_to([{"role": "system", "content": "Other."}, {"role": "user", "content": "hello"}]))
    assert st.cached_before < len(session.template.start("Other.")) and session.system == "Other."
    assert_invariant(session)
    assert_transcript(session)


@pytest.mark.parametrize("messages, why", [
    ([], "non-empty list"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "last message must be a user"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "messages[1]: expected a assistant"),
    ([{"role": "tool", "content": "a"}], "messages[0]: expected"),
    ([{"role": "user", "content": 3}], "messages[0]: expected"),
    ([{"role": "user", "content": "   "}], "empty message"),
])
def test_bad_message_lists_are_one_line_errors_and_change_nothing(session, messages, why):
    turn_of(session.send("hello"))
    before = (list(session.tokens), session.cache.seqlen, [ex.user for ex in session.exchanges], session.system)
    events = list(session.respond_to(messages))
    assert len(events) == 1 and isinstance(events[0], Error) and why in events[0].message
    assert (list(session.tokens), session.cache.seqlen, [ex.user for ex in session.exchanges],
            session.system) == before
    assert_invariant(session)
