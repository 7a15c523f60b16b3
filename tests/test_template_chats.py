"""Chats on real vocabularies with their own templates: llama.cpp's ggml-vocab files
(tests/llama_vocab.py) wrapped in a tiny random Llama (tests/vocab_model.py), loaded as any GGUF.
Llama 3.2, Qwen2.5 and Qwen3 take their hand-written fast paths (proven equal to the templates
in tests/test_chat_formats.py); TinyLlama's Zephyr template and Mistral's [INST] one are
rendered whole every turn (model/chat_formats/whole.py). Each turn keeps the cache for the
longest prefix it shares with the new rendering, and the cache invariant holds after every
step: sends, retry, undo, edit and a trim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from llama_vocab import vocab_dir
from test_session import assert_invariant
from vocab_model import wrap_vocab

from chatapp.chat import whole
from chatapp.chat.edit import check_edit, rewind_and_send
from chatapp.chat.events import Trimmed, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from model.chat_formats.templates import ChatML, Llama3, Qwen3
from model.chat_formats.whole import TemplateFormat
from model.loading import load_model

pytestmark = pytest.mark.slow   # llama.cpp's vocab files come once through the package index
TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
QWEN3_THINK = {151667: "<think>", 151668: "</think>"}   # where Qwen3's vocabulary adds them to Qwen2's
CHATS = {  # name: (vocab, template file, the format it takes, tokens renamed)
    "Llama 3.2": ("llama-bpe", "meta-llama-Llama-3.2-3B-Instruct", Llama3, None),
    "Qwen2.5": ("qwen2", "Qwen-Qwen2.5-7B-Instruct", ChatML, None),
    "Qwen3": ("qwen2", "Qwen-Qwen3-0.6B", Qwen3, QWEN3_THINK),
    "Zephyr": ("llama-spm", "TinyLlama-TinyLlama-1.1B-Chat-v1.0", TemplateFormat, None),
    "Mistral": ("llama-spm", "mistralai-Mistral-7B-Instruct-v0.2", TemplateFormat, None),
}
# Zephyr's generation prompt is "<|assistant|>" but its history writes "<|assistant|>\n" before a
# reply: the closed chat differs from what the model answered after, so its reply is prefilled again.
REWRITES_LAST_REPLY = {"Zephyr"}
paths: dict[str, Path] = {}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    path = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NANOCHAT_TUI_HOME", str(path))
        yield path


@pytest.fixture(scope="module")
def models(home, tmp_path_factory):
    folder, made = vocab_dir(), {}

    def get(name):
        if name not in made:
            vocab, template, _, rename = CHATS[name]
            out = tmp_path_factory.mktemp("gguf") / f"{name.replace(' ', '-')}.gguf"
            src = (TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8")
            paths[name] = wrap_vocab(folder / f"ggml-vocab-{vocab}.gguf", out, src, rename)
            made[name] = load_model(str(paths[name]))
        return made[name]
    return get


def turn_of(events) -> TurnStats:
    (st,) = [e for e in events if isinstance(e, TurnStats)]
    return st


@pytest.mark.parametrize("name", list(CHATS))
def test_turn_two_prefills_only_what_is_new(models, name):
    lm = models(name)
    assert type(lm.template) is CHATS[name][2]
    s = Session(lm, Settings(temperature=0.0, max_new_tokens=6), context=512)
    first = turn_of(s.send("Hello there, how are you?"))
    assert first.cached_before == 0
    assert_invariant(s)
    prompt1 = first.prefill_tokens
    kept, pending = s.cache.seqlen, len(s.tokens) - s.cache.seqlen
    closed = list(s.tokens)
    if isinstance(s.template, TemplateFormat):   # the tokens turn 2 adds: its prompt less the closed turn 1
        prompt2 = s.template.render(s.system, whole.pairs_of(s, s.exchanges), "Tell me more.").tokens
        assert prompt2[:len(closed)] == closed
        new = len(prompt2) - len(closed)
    else:
        new = len(s.template.user_turn("Tell me more."))
    second = turn_of(s.send("Tell me more."))
    assert second.cached_before == kept   # everything the cache held after turn 1 is reused
    assert second.prefill_tokens == pending + new   # and only the closing and the new message are prefilled
    if name in REWRITES_LAST_REPLY:
        assert kept >= prompt1
    else:
        assert kept == prompt1 + first.decode_tokens - (first.stop == "end")   # no token of turn 1 prefilled twice
    assert_invariant(s)
    stops = lm.template.stop_ids
    assert lm.tokenizer.eos_id in stops and (name != "Llama 3.2" or lm.tokenizer.token("<|eot_id|>") in stops)


def test_a_whole_template_over_retry_undo_edit_and_trim(models):
    lm = models("Zephyr")
    s = Session(lm, Settings(temperature=0.0, max_new_tokens=5), context=160)
    for text in ("first message", "second one", "third"):
        turn_of(s.send(text))
        assert_invariant(s)
    st = turn_of(ChatKeeper(s, None).run_command("/retry"))
    assert st.cached_before >= s.exchanges[-1].start and len(s.exchanges) == 3
    assert_invariant(s)
    list(ChatKeeper(s, None).run_command("/undo"))
    assert [ex.user for ex in s.exchanges] == ["first message", "second one"]
    assert_invariant(s)
    want = lm.template.render(s.system, whole.pairs_of(s, s.exchanges[:1]), None).tokens
    list(ChatKeeper(s, None).run_command("/undo"))
    assert s.tokens == want   # the first exchange closed, its reply's ids as the model wrote them
    assert_invariant(s)
    turn_of(s.send("again"))
    st = turn_of(rewind_and_send(s, *check_edit(s, "2 edited second")))   # /edit (the keeper keeps a branch)
    assert [ex.user for ex in s.exchanges][-1] == "edited second" and st.cached_before > 0
    assert_invariant(s)
    trims = []
    for i in range(12):   # a small context fills: the oldest exchanges leave, the rest is re-prefilled
        events = list(s.send(f"a longer message number {i} to fill the context up"))
        trims += [e for e in events if isinstance(e, Trimmed)]
        turn_of(events)
        assert_invariant(s)
        assert s.cache.seqlen <= s.cache.capacity
    assert trims and s.trimmed


def test_headless_two_turns_on_mistrals_template(models, home):
    models("Mistral")   # converted once into `home`: the headless process opens it from there
    cmd = [sys.executable, "-m", "chatapp.cli", "--headless", "--model", str(paths["Mistral"]), "--temperature", "0",
           "--max-new-tokens", "5"]
    p = subprocess.run(cmd, input=b"Hello there\nAnd then?\n", capture_output=True, timeout=300,
                       env={**os.environ, "NANOCHAT_TUI_HOME": str(home)})
    assert p.returncode == 0, p.stderr.decode()[-500:]
    turns = [e for e in map(json.loads, p.stdout.decode().splitlines()) if e.get("event") == "turn"]
    assert len(turns) == 2
    one, two = turns
    assert two["cached_before"] == one["cache_seqlens"] > one["prefill_tokens"]   # turn 1 stays cached
    assert two["prefill_tokens"] < one["prefill_tokens"] + 12   # its message, [INST] and the closing </s>


def test_a_whole_template_chat_reopens_with_its_ids_and_cache(models, tmp_path):
    from chatapp.keeper.keeper import ChatKeeper
    from chatapp.store.database import ChatStore

    lm = models("Mistral")
    store = ChatStore(tmp_path / "chats")
    k = ChatKeeper(Session(lm, Settings(temperature=0.0, max_new_tokens=5), context=512), store)
    for text in ("one", "two"):
        turn_of(k.send(text))
    tokens, pos = list(k.session.tokens), k.session.cache.seqlen
    again = ChatKeeper(Session(lm, Settings(temperature=0.0, max_new_tokens=5), context=512), store)
    restored, errors = again.open(k.chat_id)
    assert not errors and "re-rendered" not in restored.detail, restored
    assert again.session.tokens == tokens and again.session.cache.seqlen == pos
    assert_invariant(again.session)
    st = turn_of(again.send("three"))
    assert st.cached_before == pos   # the reopened chat goes on from its cache
    assert_invariant(again.session)
    store.close()


def test_respond_to_on_a_whole_template_reuses_the_cached_prefix(models):
    """Session.respond_to (the server's entry point) on Mistral's template: a client that sends back
    the chat plus one message prefills only that; an edited first message recomputes from it."""
    lm = models("Mistral")
    s = Session(lm, Settings(temperature=0.0, max_new_tokens=5), context=512)
    msgs = [{"role": "user", "content": "Hello there"}]
    first = turn_of(s.respond_to(msgs))
    assert first.cached_before == 0
    assert_invariant(s)
    msgs += [{"role": "assistant", "content": first.reply}, {"role": "user", "content": "And then?"}]
    pos = s.cache.seqlen
    second = turn_of(s.respond_to(msgs))
    assert second.cached_before == pos and len(s.exchanges) == 2
    assert_invariant(s)
    third = turn_of(s.respond_to([{"role": "user", "content": "Something else"}]))
    assert third.cached_before < pos and [ex.user for ex in s.exchanges] == ["Something else"]
    assert_invariant(s)


def test_a_template_without_a_system_role_refuses_one_in_one_line(models):
    """Mistral v0.2's template raises on a system message: /system and a message list with one get
    one line, and the chat stays as it was."""
    from chatapp.chat.events import Error

    s = Session(models("Mistral"), Settings(temperature=0.0, max_new_tokens=4), context=512)
    turn_of(s.send("Hello"))
    before = (list(s.tokens), s.cache.seqlen)
    events = list(ChatKeeper(s, None).run_command("/system Be brief."))
    assert [type(e) for e in events] == [Error] and "refuses this chat" in events[0].message
    events = list(s.respond_to([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]))
    assert [type(e) for e in events] == [Error] and "\n" not in events[0].message
    assert (list(s.tokens), s.cache.seqlen) == before
    assert_invariant(s)
