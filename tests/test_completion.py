"""A base model's completion mode (issue 26): a GGUF with no chat template whose metadata names a
pretrained model continues one document, with the persistent cache; a tuned one keeps a chat
format. The real forward passes of a tiny random GGUF, the session, and the app."""

from __future__ import annotations

import pytest
from base_gguf import write_named_gguf
from helpers import assert_invariant
from tui_pilot import endless, ready, submit

from chatapp.chat.events import Error, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.cli import chat_parser
from chatapp.keeper.keeper import ChatKeeper
from chatapp.tui.app import ChatApp
from chatapp.tui.cache_panel import COMPLETION_LABEL, LABEL_WIDTH
from model.chat_formats.completion import CompletionFormat, gguf_tuning
from model.loading import LoadOptions, load_model


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("base")
    write_named_gguf(d / "tiny-base.gguf", "Tiny Base")
    write_named_gguf(d / "tiny-tuned.gguf", "Tiny", finetune="Instruct")
    return d


@pytest.fixture
def home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path_factory.mktemp("home")))


def test_what_a_gguf_says_about_its_tuning():
    gemma = {"general.type": "model", "general.name": "Gemma 3 270m", "general.basename": "gemma-3",
             "general.tags": ["gemma3", "gemma", "google", "text-generation"]}  # the pulled file's own
    assert gguf_tuning(gemma) == "base"
    assert gguf_tuning({**gemma, "general.name": "Gemma 3 270m It"}) == "tuned"
    assert gguf_tuning({"general.name": "SmolLM2 135M Instruct"}) == "tuned"
    assert gguf_tuning({"general.name": "Qwen2.5 0.5B", "general.finetune": "Chat"}) == "tuned"
    assert gguf_tuning({"general.name": "Some Model", "general.finetune": "custom"}) == ""  # tuned to what?
    assert gguf_tuning({}) == ""  # the file does not say: a chat format, as before


def test_a_base_model_continues_one_document_with_the_cache_kept(gguf_dir, home):
    lm = load_model(str(gguf_dir / "tiny-base.gguf"), LoadOptions())
    assert isinstance(lm.template, CompletionFormat)
    s = Session(lm, Settings(temperature=0.0, max_new_tokens=6), context=256)
    assert s.system == "" and s.tokens == [lm.tokenizer.bos_id]  # no default system prompt, no markers
    nl = lm.tokenizer.encode("\n")
    texts = ["hello world, what is", "the capital of France?"]
    for text in texts:
        before = s.cache.seqlen
        (st,) = [e for e in s.send(text) if isinstance(e, TurnStats)]
        assert_invariant(s)
        ex = s.exchanges[-1]
        assert s.tokens[ex.start:ex.reply_start] == lm.tokenizer.encode(text)  # the text itself, nothing around it
        assert s.tokens[ex.end - len(nl):ex.end] == nl  # a continuation ends its line
        assert st.cached_before == before  # the document so far stays cached: only what is new is prefilled
    doc = lm.tokenizer.decode(s.tokens[1:])
    assert doc == f"{texts[0]}{s.exchanges[0].reply}\n{texts[1]}{s.exchanges[1].reply}\n"
    assert s.cache.seqlen > len(lm.tokenizer.encode(texts[0]))
    list(ChatKeeper(s, None).run_command("/retry"))
    assert_invariant(s)
    assert doc.startswith(lm.tokenizer.decode(s.tokens[1:s.exchanges[-1].reply_start]))
    list(ChatKeeper(s, None).run_command("/undo"))
    assert_invariant(s)
    assert len(s.exchanges) == 1 and lm.tokenizer.decode(s.tokens[1:]) == f"{texts[0]}{s.exchanges[0].reply}\n"
    events = list(ChatKeeper(s, None).run_command("/edit 1 def f(x): return"))  # back to the start, continued
    assert not [e for e in events if isinstance(e, Error)]
    assert_invariant(s)
    assert lm.tokenizer.decode(s.tokens[1:]) == f"def f(x): return{s.exchanges[0].reply}\n"
    assert s.stats()["mode"] == "completion (base model)"


def test_a_tuned_model_without_a_template_stays_a_chat(gguf_dir, home):
    lm = load_model(str(gguf_dir / "tiny-tuned.gguf"), LoadOptions())
    assert not isinstance(lm.template, CompletionFormat)
    assert "mode" not in Session(lm, Settings(), context=64).stats()


@pytest.mark.anyio
async def test_the_panel_and_the_picker_say_completion_mode(gguf_dir, home):
    from chatapp.keeper.models import choices

    app = ChatApp(chat_parser().parse_args(["--model", str(gguf_dir / "tiny-base.gguf"), "--temperature", "0",
                                            "--max-new-tokens", "4"]))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        endless(app)
        mode = app.panel.row("mode")
        assert mode.display and mode.value == COMPLETION_LABEL
        assert mode.region.height == 1 and LABEL_WIDTH + len(mode.value) <= app.panel.content_region.width  # no wrap
        await submit(pilot, "hello world")
        await submit(pilot, "/retry")
        assert_invariant(app.session)
        assert app.transcript.exchanges[-1].reply is not None
        pos, chat_id, root = app.session.cache.seqlen, app.keeper.chat_id, app.keeper.store.root

    again = ChatApp(chat_parser().parse_args(["--model", str(gguf_dir / "tiny-base.gguf"), "--chat", str(chat_id),
                                              "--temperature", "0", "--max-new-tokens", "4"]))
    async with again.run_test(size=(120, 40)) as pilot:  # the store keeps a document like a chat
        await ready(pilot)
        s = again.session
        assert again.keeper.restored.line == f"restored {pos} tokens from snapshot" and s.cache.seqlen == pos
        assert again.panel.row("mode").value == COMPLETION_LABEL
        assert_invariant(s)
        await submit(pilot, " and more")
        assert s.turn_stats[-1].cached_before == pos
        await submit(pilot, "/undo")
        assert_invariant(s)
    notes = {c.label: c.note for c in choices(root)}   # opened in place: listed as used recently
    assert any("base model" in n and "completion" in n for label, n in notes.items() if "tiny-base" in label)
    assert not any("base model" in n for label, n in notes.items() if "tiny-tuned" in label)
