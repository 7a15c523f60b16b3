"""/edit N TEXT: the rewind reuses the cache up to message N, the turn prefills only the new
message, the invariant holds after it in every family shape, and the old continuation is kept
in the real store as a branch that opens like any other chat (its snapshot shared)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import (
    Poison,
    assert_invariant,
    assert_transcript,
    fail_mid_reply,
    headless,
    messages,
    official,
    scripted_qwen3,
    turn_of,
)

from chatapp.chat.events import Branched, CacheState, Error, Progress, TextDelta, Trimmed
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from chatapp.store.database import ChatStore
from model.chat_formats.templates import encode_rendered
from model.loading import LoadOptions, load_model

FX = Path(__file__).parent / "fixtures" / "nanochat"


def chat_of(lm, store=None, context=512, **settings) -> ChatKeeper:
    settings = {"temperature": 0.0, "max_new_tokens": 8, **settings}
    return ChatKeeper(Session(lm, Settings(**settings), context=context), store)


def talk(k: ChatKeeper, *users: str) -> None:
    for u in users:
        turn_of(list(k.send(u)))


def edit(k: ChatKeeper, line: str) -> list:
    return [e for e in k.run_command(line) if not isinstance(e, TextDelta | Progress)]  # the stream's live parts


@pytest.fixture
def store(tmp_path):
    s = ChatStore(tmp_path / "chats")
    yield s
    s.close()


def test_an_edit_rewinds_to_the_message_and_prefills_only_it(tiny):
    k = chat_of(tiny)
    talk(k, "one", "two", "three", "four")
    s = k.session
    start = s.exchanges[1].start
    events = edit(k, "/edit 2 deux")
    assert [type(e).__name__ for e in events] == ["Branched", "CacheState", "TurnStats"]
    assert events[0].branch is None and events[0].from_message == 2  # no store: nothing kept
    assert events[1].event == "edit" and events[1].cache_seqlens == start == events[1].tokens
    st = events[2]
    assert st.cached_before == start  # everything before message 2 came from the cache
    assert st.prefill_tokens == len(s.template.user_turn("deux")) and st.turn == 2 and st.user == "deux"
    assert [ex.user for ex in s.exchanges] == ["one", "deux"]
    assert_invariant(s)
    assert_transcript(s)
    # the last message, and then the first
    start = s.exchanges[1].start
    assert turn_of(edit(k, "/edit 2 zwei")).cached_before == start
    assert_invariant(s)
    assert_transcript(s)
    st = turn_of(edit(k, "/edit 1 eins"))
    assert st.cached_before == len(s.template.start(s.system)) and st.turn == 1 and s.turns == 1
    assert_invariant(s)
    assert_transcript(s)
    talk(k, "and on")  # the chat goes on from the cache as usual
    assert_invariant(s)
    assert_transcript(s)


def test_editing_the_first_message_keeps_a_folded_system_prompt():
    """nanochat has no system role: its first user turn carries the prompt, and so must the
    edited first message."""
    lm = load_model(str(FX / "head"), LoadOptions(tokenizer=str(FX / "tokenizer" / "tokenizer.pkl")))
    k = chat_of(lm, system="Be brief.")
    talk(k, "first question", "second question")
    s = k.session
    st = turn_of(edit(k, "/edit 1 another first question"))
    first = s.exchanges[0]
    assert s.tokens[first.start:first.reply_start] == s.template.user_turn("another first question", "Be brief.")
    assert st.cached_before == first.start == len(s.template.start("Be brief."))
    assert_invariant(s)
    turn_of(edit(k, "/edit 1 a third first question"))
    talk(k, "then more")
    second = s.exchanges[1]
    assert s.tokens[second.start:second.reply_start] == s.template.user_turn("then more")  # no prompt there
    assert_invariant(s)


def test_a_qwen3_edit_keeps_the_replies_before_it_in_their_history_form():
    """Earlier replies lost their thinking when the next message came; after the edit the model
    reads exactly what the official template renders, and nothing before message N is redone."""
    k = chat_of(scripted_qwen3(), max_new_tokens=20)
    talk(k, "Hi, who are you?", "Name three colours.", "Which is warmest?")
    s = k.session
    for n, text in ((3, "Which is coldest?"), (2, "Name two shapes.")):
        start = s.exchanges[n - 1].start
        st = turn_of(edit(k, f"/edit {n} {text}"))
        assert st.cached_before == start and st.prefill_tokens == len(s.template.user_turn(text))
        users = ["Hi, who are you?", "Name three colours."][:n - 1] + [text]
        want = official("Qwen-Qwen3-0.6B", messages(None, users, ["<think>Plan</think>Hi!"] * (n - 1)))
        assert s.tokens[:s.exchanges[-1].reply_start] == encode_rendered(s.tokenizer, want)
        assert_invariant(s)


def test_refusals_say_why_in_one_line_and_change_nothing(tiny, store):
    k = chat_of(tiny, store)
    assert edit(k, "/edit 1 hi") == [Error("/edit: no message to edit yet")]
    talk(k, "one", "two")
    s = k.session
    before = (list(s.tokens), s.cache.seqlen, [c.id for c in store.list()])
    cases = {"/edit": "/edit needs an argument: /edit N TEXT",
             "/edit 3 hi": "/edit: no message 3; this chat has messages 1-2",
             "/edit 0 hi": "/edit: no message 0; this chat has messages 1-2",
             "/edit two hi": "/edit: N is the number of the message to edit (as shown), got 'two': /edit N TEXT",
             "/edit 2": "/edit: give the new text after the number: /edit N TEXT",
             "/edit 2 \ud800": "command is not valid Unicode (it holds a lone surrogate)"}
    for line, message in cases.items():
        assert edit(k, line) == [Error(message)], line
    (err,) = edit(k, "/edit 1 " + "long " * 200)
    assert err.message.startswith("message too long: ")
    assert (list(s.tokens), s.cache.seqlen, [c.id for c in store.list()]) == before  # no branch either


def test_a_message_trimmed_out_of_the_context_is_refused(tiny):
    k = chat_of(tiny, context=160)
    trims = []
    for i in range(6):
        trims += [e for e in k.send(f"message {i} says something") if isinstance(e, Trimmed)]
    s = k.session
    assert trims and s.trimmed
    a = len(s.trimmed)
    assert edit(k, "/edit 1 new") == [Error(f"/edit: message 1 was trimmed out of the context, so it cannot be "
                                            f"edited in place; messages {a + 1}-{s.turns} can")]
    st = turn_of(edit(k, f"/edit {a + 1} the oldest kept one"))
    assert st.turn == a + 1 and st.cached_before == s.prefix_len
    assert_invariant(s)


def test_a_model_failure_during_an_edit_puts_the_chat_back_as_before_the_edit(tiny):
    k = chat_of(tiny, temperature=1.0, seed=3, max_new_tokens=16)
    talk(k, "one", "two", "three")
    s = k.session
    tokens, users = list(s.tokens), [ex.user for ex in s.exchanges]
    events = fail_mid_reply(k.run_command("/edit 2 deux"), Poison(tiny))
    assert isinstance(events[-2], CacheState) and events[-2].event == "undone"
    assert s.tokens == tokens and [ex.user for ex in s.exchanges] == users
    assert_invariant(s)
    assert_transcript(s)


def test_the_old_continuation_is_a_stored_chat_that_opens_from_its_shared_snapshot(tiny, store):
    k = chat_of(tiny, store)
    talk(k, "one", "two", "three")
    old = [(ex.user, ex.reply) for ex in k.session.exchanges]
    chat_id, old_pos = k.chat_id, k.session.cache.seqlen
    branched, state, st = edit(k, "/edit 2 deux")
    assert isinstance(branched, Branched) and branched.chat == chat_id and branched.branch != chat_id
    assert branched.title == "one (branch from #1, message 2)" == store.get(branched.branch).title
    assert branched.snapshot_tokens == old_pos  # the whole old cache, shared
    assert branched.line == f"Edited message 2; the old continuation is kept as chat #{branched.branch}"
    # both committed before they were reported: the branch, then the rewound chat
    assert [m.content for m in store.get(chat_id).messages][:2] == ["one", old[0][1]]
    assert k.chat_id == chat_id and {c.id for c in store.list()} == {chat_id, branched.branch}
    stored = store.get(chat_id)
    assert [(m.role, m.content) for m in stored.messages] == [("user", "one"), ("assistant", old[0][1]),
                                                              ("user", "deux"), ("assistant", st.reply)]
    linked = sorted(p.name for p in store.snapshot_dir(branched.branch).iterdir())  # the chat's segments
    assert linked[0].startswith("00000000-") and linked[-1].endswith(f"-{old_pos:08d}.safetensors")
    talk(k, "four")  # the edited chat rewrites its snapshot past the edit point; the branch's stays
    events = edit(k, f"/load {branched.branch}")
    (restored,) = [e for e in events if e.__class__.__name__ == "Restored"]
    assert (restored.restored_tokens, restored.reprefilled_tokens) == (old_pos, 0)
    assert [(ex.user, ex.reply) for ex in k.session.exchanges] == old
    assert_invariant(k.session)
    assert_transcript(k.session)
    # an edit of the branch branches again, and the first chat still opens with the edit
    turn_of(edit(k, "/edit 3 drei")[1:])
    edit(k, f"/load {chat_id}")
    assert [ex.user for ex in k.session.exchanges] == ["one", "deux", "four"]
    assert_invariant(k.session)


def test_a_branch_without_its_snapshot_reprefills(tiny, store):
    k = chat_of(tiny, store)
    talk(k, "one", "two")
    (branched, *_) = edit(k, "/edit 1 uno")
    for p in store.snapshot_dir(branched.branch).iterdir():
        p.unlink()
    (restored,) = [e for e in edit(k, f"/load {branched.branch}") if e.__class__.__name__ == "Restored"]
    assert restored.restored_tokens == 0 and restored.reprefilled_tokens > 0 and restored.detail == "no snapshot"
    assert [ex.user for ex in k.session.exchanges] == ["one", "two"]
    assert_invariant(k.session)


def test_headless_edit_prints_the_branch_the_rewind_and_the_turn():
    p, events = headless(b"hello\nsecond message\n/edit 1 new text\n")
    assert p.returncode == 0, p.stderr.decode()
    assert [e["event"] for e in events] == ["ready", "turn", "turn", "branch", "edit", "turn"]
    branch, state, turn = events[3:]
    assert branch["from_message"] == 1 and branch["chat"] == 1 and branch["branch"] == 2
    assert branch["text"] == "new text" and branch["title"] == "hello (branch from #1, message 1)"
    assert turn["turn"] == 1 and turn["user"] == "new text"
    assert turn["cached_before"] == state["cache_seqlens"] > 0
    assert turn["cached_before"] + turn["prefill_tokens"] < events[2]["cache_seqlens"]  # reused, not rebuilt
