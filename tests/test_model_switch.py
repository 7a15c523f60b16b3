"""/model SPEC: the same chat on another model, carried as text, re-rendered for the new template,
re-prefilled; the store keeps the chat's id under the new model; a failure changes nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_invariant, assert_transcript, reopen, talk

from chatapp.chat.events import Error, ModelSwitched, Prefilling, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from chatapp.keeper.models import DEFAULT, RECENT_FILE, choices, remember
from chatapp.keeper.reopen import rendered_conversation, trimmed_exchanges
from chatapp.store.database import ChatStore
from chatapp.store.identity import Fingerprint
from chatapp.store.snapshots import scan
from model.loading import LoadOptions, load_model

FIX = Path(__file__).parent / "fixtures" / "nanochat"
SETTINGS = dict(temperature=0.0, max_new_tokens=8)


@pytest.fixture
def store(tmp_path):
    return ChatStore(tmp_path / "chats")


@pytest.fixture(scope="module")
def qwen3():
    return load_model("random:tiny-qwen3")


def keeper_on(lm, store, context=None, **settings) -> ChatKeeper:
    return ChatKeeper(Session(lm, Settings(**{**SETTINGS, **settings}), context=context), store)


def switch(k: ChatKeeper, spec: str) -> list:
    events = list(k.run_command(f"/model {spec}"))
    assert not [e for e in events if isinstance(e, Error)], events
    return events


def fresh_reply(lm, chat, message: str, context=None) -> str:
    """A session that never saw the old model: the stored chat's text rendered and prefilled on `lm`."""
    s = Session(lm, Settings(**SETTINGS), context=context)
    tokens, exchanges = rendered_conversation(s, chat)
    s.adopt(tokens, exchanges, trimmed_exchanges(chat))
    s.gen.prefill(tokens)
    return next(e for e in s.send(message) if isinstance(e, TurnStats)).reply


def test_the_chat_carries_over_and_the_next_reply_is_a_fresh_sessions(tiny, qwen3, store):
    k = keeper_on(tiny, store)
    k.loader = lambda spec: qwen3 if spec == "random:tiny-qwen3" else load_model(spec)
    talk(k, "hello there", "and a second message")
    chat_id, before = k.chat_id, store.get(k.chat_id)
    users = [ex.user for ex in k.session.exchanges]

    events = switch(k, "random:tiny-qwen3")
    done = next(e for e in events if isinstance(e, ModelSwitched))
    progress = [e for e in events if isinstance(e, Prefilling)]
    s = k.session
    assert s.lm is qwen3 and done.previous == "random:tiny" and done.exchanges == 2
    assert progress[0].done == 0 and progress[-1].done == progress[-1].total == len(s.tokens) == s.cache.seqlen
    assert [ex.user for ex in s.exchanges] == users and s.system == qwen3.template.default_system
    assert_invariant(s)
    assert_transcript(s)
    assert k.chat_id == chat_id and store.get(chat_id).model == "random:tiny-qwen3"
    assert [c.model for c in store.list()] == ["random:tiny-qwen3"]
    # the snapshot is the new model's now: the old one's segments are gone
    segments, _ = scan(store.snapshot_dir(chat_id))
    assert segments and {seg.identity for seg in segments} == {Fingerprint(qwen3).get()}

    want = fresh_reply(qwen3, before, "what next?")
    talk(k, "what next?")
    assert s.exchanges[-1].reply == want
    assert_invariant(s)

    k2, r = reopen(qwen3, store, chat_id)  # reopened on the new model: from its snapshot
    assert r.restored_tokens == s.cache.seqlen and r.reprefilled_tokens == 0
    k3, r = reopen(tiny, store, chat_id)  # a window on the old model: the chat brings its own model back
    assert k3.session.lm.name == "random:tiny-qwen3" and k3.session.settings.model == "random:tiny-qwen3"
    assert r.restored_tokens == s.cache.seqlen and r.reprefilled_tokens == 0


def test_a_model_that_fails_leaves_the_model_and_the_chat_as_they_were(tiny, store):
    k = keeper_on(tiny, store, context=512, system="x " * 200)
    talk(k, "keep me")
    s, tokens, pos, stored = k.session, list(k.session.tokens), k.session.cache.seqlen, store.get(k.chat_id)
    for spec, why in (("no/such/model", "could not load no/such/model (model not found"),
                      ("random:nope", "could not load random:nope (unknown random preset"),
                      ("random:tiny-qwen3", "random:tiny-qwen3 cannot take this chat (the system prompt")):
        if spec == "random:tiny-qwen3":  # loads, but the long system prompt cannot fit its context
            k.loader = lambda spec: load_model(spec)
            s.context = 300
        errors = [e for e in k.run_command(f"/model {spec}") if isinstance(e, Error)]
        assert len(errors) == 1 and why in errors[0].message and errors[0].message.endswith("still on random:tiny")
        assert k.session is s and s.tokens == tokens and s.cache.seqlen == pos
        assert store.get(k.chat_id).messages == stored.messages and store.get(k.chat_id).model == "random:tiny"
    assert_invariant(s)
    talk(k, "still here")


@pytest.mark.skipif(not (FIX / "head").is_dir(), reason="nanochat fixtures not present")
def test_another_tokenizer_template_and_a_smaller_context_trim_the_oldest(tiny, store):
    nano = load_model(str(FIX / "head"), LoadOptions(tokenizer=str(FIX / "tokenizer" / "tokenizer.pkl"), attn="sdpa"))
    k = keeper_on(tiny, store, system="Be brief.")
    k.loader = lambda spec: nano
    talk(k, *(f"message {i}: " + "some words to fill the context " * 3 for i in range(6)))
    before = store.get(k.chat_id)
    assert len(k.session.tokens) > nano.context_length
    # nanochat has no system role: a re-rendered chat carries the prompt in its first user turn
    tokens, exchanges = rendered_conversation(Session(nano, Settings()), before)
    assert tokens[exchanges[0].start:exchanges[0].reply_start] == nano.template.user_turn(exchanges[0].user,
                                                                                          "Be brief.")

    done = next(e for e in switch(k, str(FIX / "head")) if isinstance(e, ModelSwitched))
    s = k.session
    assert done.dropped_exchanges > 0 and len(s.trimmed) == done.dropped_exchanges
    assert done.exchanges == len(s.exchanges) == 6 - done.dropped_exchanges
    assert s.system == "Be brief." and s.cache.capacity == nano.context_length
    assert s.tokens[s.exchanges[0].start:s.exchanges[0].reply_start] == s.template.user_turn(s.exchanges[0].user,
                                                                                             "Be brief.")
    assert_invariant(s)
    assert [ex.user for ex in s.trimmed + s.exchanges] == [m.content for m in before.messages[::2]]
    talk(k, "and now?")
    assert_invariant(s)
    assert store.get(k.chat_id).model == nano.name


def test_the_list_names_the_default_the_cache_and_recent_specs(monkeypatch, tmp_path):
    home = tmp_path / "home"
    for folder in ("models/my-model", "gguf/other-1234"):
        (home / folder).mkdir(parents=True)
        (home / folder / "config.json").write_text("{}")
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(home))
    root = tmp_path / "chats"
    root.mkdir()
    remember(root, "random:tiny")
    remember(root, "random:tiny-qwen3")
    remember(root, "random:tiny")
    got = [(c.spec, c.note) for c in choices(root)]
    assert got[0][0] == DEFAULT and got[0][1].startswith("not pulled yet")
    assert got[1:] == [(str(home / "models/my-model"), "pulled"),
                       (str(home / "gguf/other-1234"), "converted from GGUF"),
                       ("random:tiny", "used recently"), ("random:tiny-qwen3", "used recently")]
    (root / RECENT_FILE).write_text("not json")
    assert len(choices(root)) == 3  # a damaged list is an empty one


def test_headless_switch_prints_progress_and_the_new_model(tmp_path):
    chats = tmp_path / "chats"
    cmd = [sys.executable, "-m", "chatapp.cli", "--headless", "--model", "random:tiny", "--temperature", "0",
           "--max-new-tokens", "6"]
    stdin = "hello\n/model random:nope\n/model random:tiny-qwen3\nagain\n/model\n"
    # Its own model cache: the picker lists the user's converted GGUFs between the default and the recents.
    env = {**os.environ, "NANOCHAT_TUI_CHATS": str(chats), "NANOCHAT_TUI_HOME": str(tmp_path / "home")}
    p = subprocess.run(cmd, input=stdin.encode(), capture_output=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    ev = [json.loads(line) for line in p.stdout.decode().splitlines()]
    kinds = [e["event"] for e in ev]
    assert kinds == ["ready", "turn", "info", "error", "info", "model", "turn", "info"]  # progress is for screens
    model = ev[5]
    assert model["model"] == "random:tiny-qwen3" and model["previous"] == "random:tiny"
    assert model["cache_seqlens"] == model["reprefilled_tokens"] > ev[1]["cache_seqlens"]  # the closing too
    assert ev[6]["cached_before"] == model["cache_seqlens"]  # the next turn reuses the re-prefilled cache
    listed = [m["spec"] for m in ev[7]["data"]["models"]]
    assert ev[7]["data"]["model"] == "random:tiny-qwen3" and listed[0] == DEFAULT
    assert listed[1:3] == ["random:tiny-qwen3", "random:tiny"]  # recent, the last first
    assert [c.model for c in ChatStore(chats).list()] == ["random:tiny-qwen3"]


def test_model_default_pulls_quietly_first(tiny, qwen3, store, monkeypatch):
    pulls = []
    monkeypatch.setattr("chatapp.keeper.switch.ensure_default_model",
                        lambda progress: (pulls.append(progress), "the/default/dir")[1])
    k = keeper_on(tiny, store)
    k.loader = lambda spec: qwen3 if spec == "the/default/dir" else pytest.fail(spec)
    talk(k, "hi")
    switch(k, DEFAULT)
    assert k.session.lm is qwen3 and len(pulls) == 1 and pulls[0]("50%") is None  # no bar on the TUI's screen
