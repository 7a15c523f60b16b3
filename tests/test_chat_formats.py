"""Our chat formats give, token for token, what the vendors' own templates give a 3-turn chat
(tests/data/chat_templates/, rendered by transformers' renderer, tokenized by `tokenizers`);
a model's template is recognised by rendering it, and one we cannot reproduce is refused in
one line."""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path

import pytest
from helpers import LLAMA3_SPLIT, VENDORS, corpus, messages, official, source
from tokenizers import Regex, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from model.chat_formats.jinja_env import render
from model.chat_formats.recognize import marker, template_for
from model.chat_formats.templates import Llama3, strftime_now
from model.chat_formats.whole import PLAIN_CHAT, TemplateFormat
from model.tokenizers.bpe import tokenizer_from_json
from model.tokenizers.tokenizer import Tokenizer

reference = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template

SYSTEM = "You are a terse assistant.  Answer in one line."
USERS = ["Hi, who are you?", "Name three colours.", "Which is warmest?"]
REPLIES = ["I am a small model.", "Red, green and blue."]
THOUGHTS = ["<think>\nThey ask who I am.\n</think>\n\nI am a small model.",
            "<think>\nList three.\n</think>\n\nRed, green and blue."]




@cache
def trained(name: str) -> tuple[Tokenizer, HFTokenizer]:
    """Our tokenizer and the reference (`tokenizers`) for one vendor's special tokens."""
    specials, bos, eos, _ = VENDORS[name]
    ref = HFTokenizer(models.BPE())
    ref.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    ref.train_from_iterator(corpus()[:150] + USERS + REPLIES + [SYSTEM], trainer)
    path = Path(tempfile.mkdtemp(prefix="chat-formats-")) / "tokenizer.json"
    path.write_text(ref.to_str(), encoding="utf-8")
    return tokenizer_from_json(path, {"bos_token": bos, "eos_token": eos}), ref


@pytest.fixture(params=list(VENDORS))
def vendor(request):
    """(name, template, our tokenizer, the reference tokenizer) for one vendor template."""
    return request.param, source(request.param), *trained(request.param)






@pytest.mark.parametrize("system", [None, SYSTEM, ""])
def test_our_renderer_is_transformers(vendor, system):
    name, src, _, _ = vendor
    for msgs in (messages(system, USERS, REPLIES), messages(system, USERS, THOUGHTS)):
        ours = render(src, msgs, strftime_now, bos_token=VENDORS[name][1], eos_token=VENDORS[name][2])
        assert ours == official(name, msgs)


@pytest.mark.parametrize("system", [None, SYSTEM])
def test_three_turns_token_for_token(vendor, system):
    """Each turn of the session's incremental rendering (start, user_turn, the reply as
    generated, end_reply, and the reply's history form once a user message follows) equals
    the official template over the whole chat, with the generation prompt."""
    name, _, tok, ref = vendor
    fmt = template_for(tok, source(name))
    assert type(fmt) is VENDORS[name][3]
    for replies in (REPLIES, THOUGHTS):
        for k in range(3):
            want = ref.encode(official(name, messages(system, USERS[:k + 1], replies[:k]))).ids
            turns = [(u, ref.encode(r).ids) for u, r in zip(USERS, replies[:k], strict=False)]
            got = fmt.conversation(fmt.default_system if system is None else system, turns, USERS[k])
            assert tok.decode(got) == tok.decode(want)
            assert got == want


def test_what_each_format_reads_off_its_template(vendor):
    name, src, tok, _ = vendor
    fmt = template_for(tok, src)
    expect = {"Qwen-Qwen2.5-7B-Instruct": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
              "HuggingFaceTB-SmolLM2-135M-Instruct": "You are a helpful AI assistant named SmolLM, trained by "
                                                     "Hugging Face"}
    assert fmt.default_system == expect.get(name, "")
    assert fmt.system_always == (name != "Qwen-Qwen3-0.6B")  # Llama 3.2 writes the dated system block always
    if isinstance(fmt, Llama3):
        assert fmt.preamble == f"Cutting Knowledge Date: December 2023\nToday Date: {marker('%d %b %Y')}\n\n"
        assert strftime_now("%d %b %Y") in tok.decode(fmt.start(""))


def test_a_llama_chat_keeps_the_date_it_started_on():
    tok = trained("meta-llama-Llama-3.2-3B-Instruct")[0]
    today = template_for(tok, source("meta-llama-Llama-3.2-3B-Instruct"))
    started = Llama3(tok, preamble=today.preamble, system_always=True, strftime=lambda f: "01 Jan 2020")
    assert today.fits_start(started.start(SYSTEM), SYSTEM)
    assert not today.fits_start(started.start(SYSTEM), "another prompt")


QWEN3 = source("Qwen-Qwen3-0.6B")
QWEN3, SMOL, LLAMA32 = "Qwen-Qwen3-0.6B", "HuggingFaceTB-SmolLM2-135M-Instruct", "meta-llama-Llama-3.2-3B-Instruct"
WHOLE = {  # name: (the vendor whose tokenizer it is for, a template none of our formats reproduces)
    # A variant in circulation that keeps every reply's thinking in the history.
    "keeps history thinking": (QWEN3, source(QWEN3).replace(
        "loop.index0 > ns.last_query_index %}", "loop.index0 > ns.last_query_index or reasoning_content %}")),
    "thinking off": (QWEN3, source(QWEN3).replace("enable_thinking is defined and enable_thinking is false", "true")),
    "trims messages": (SMOL, source(SMOL).replace("message['content']", "message['content'] | trim")),
    "Llama 3 without BOS": (LLAMA32, source(LLAMA32).replace("{{- bos_token }}", "")),
    "Mistral": (LLAMA32, "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} "
                         "[/INST]{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"),
}


@pytest.mark.parametrize("name", list(WHOLE))
@pytest.mark.parametrize("thinking", [False, True])
def test_a_template_no_format_reproduces_is_rendered_whole_as_transformers_does(name, thinking):
    vendor, src = WHOLE[name]
    tok, ref = trained(vendor)
    fmt = template_for(tok, src)
    assert isinstance(fmt, TemplateFormat)
    _, bos, eos, _ = VENDORS[vendor]
    replies = THOUGHTS if thinking and vendor == QWEN3 else REPLIES
    for system in (None, SYSTEM):
        for n in range(3):
            msgs = messages(system, USERS, replies[:n])
            want, _ = reference([msgs], chat_template=src, add_generation_prompt=True, bos_token=bos, eos_token=eos)
            # replies the model wrote keep their ids: here, what the reference tokenizer gives them
            pairs = [(u, r, ref.encode(r, add_special_tokens=False).ids)
                     for u, r in zip(USERS, replies[:n], strict=False)]
            got = fmt.render("" if system is None else system, pairs, USERS[n]).tokens
            assert got == ref.encode(want[0], add_special_tokens=False).ids, (name, system, n)


def test_a_template_that_raises_is_refused_in_one_line():
    with pytest.raises(ValueError) as e:
        template_for(trained(SMOL)[0], "{{ raise_exception('no system role') }}<|im_start|>")
    msg = str(e.value)
    assert msg.startswith("chat template not supported: it fails on a plain chat (no system role)")
    assert "\n" not in msg and len(msg) < 300, msg


def test_no_template_and_no_chatml_tokens_is_the_plain_format():
    tok = trained(LLAMA32)[0]
    fmt = template_for(tok, None)
    assert isinstance(fmt, TemplateFormat) and fmt.source == PLAIN_CHAT
    text = tok.decode(fmt.render("", [("Hi", "Hello.", None)], "Bye").tokens)
    assert text == "<|begin_of_text|>User: Hi\n\nAssistant: Hello.<|eot_id|>\n\nUser: Bye\n\nAssistant:"
    assert tok.token("<|eot_id|>") in fmt.stop_ids
