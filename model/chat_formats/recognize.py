"""Which of our formats a model's own chat template is: render both and compare.

The template (tokenizer_config.json's `chat_template`, or the GGUF's) runs in a sandbox over
probe conversations (one turn and three, with and without a system prompt, with thinking
in the history); each candidate format, its details (BOS, default system prompt, Llama's
dated preamble) read off the template's own output, builds the same conversations the way
the session does. The first candidate whose tokens equal the template's on every probe is
the model's format; when none does, loading stops with one line: a format we cannot
reproduce exactly is never approximated.
"""

from __future__ import annotations

import dataclasses

import jinja2

from model.chat_formats.bounded import TemplateBudgetError
from model.chat_formats.jinja_env import render
from model.chat_formats.templates import ChatML, ChatTemplate, GemmaFormat, Llama3, Qwen3, encode_rendered, strftime_now
from model.chat_formats.whole import PLAIN_CHAT, TemplateFormat
from model.errors import UserError
from model.tokenizers.tokenizer import Tokenizer

SUPPORTED = "(supported: ChatML, Qwen3, Llama 3, Gemma)"
SYSTEM = "You answer briefly."
USERS = ("Hello there.", "What is 2+2?", "Thanks, bye!")
REPLIES = ("Hi! How can I help?", "2+2 is 4.")
# Thinking as Qwen3 writes it, and untidy (the template normalises its newlines).
THINKING = ("<think>\nThe user greets me.\n</think>\n\nHi! How can I help?",
            "<think>\n\nAdd them.\n\n</think>\n\n\n2+2 is 4.")
# Whitespace a template may trim (Llama 3 does, ChatML does not). Trailing only: a reply's
# leading space can join the header's newline in one token when the text is re-tokenized
# (SmolLM2's "\n "), which the model, writing after that newline, never does: that is the
# tokenizer's doing, not the template's (docs/chat-formats.md).
UNTIDY = ("Hi! How can I help?\n", "2+2 is 4. ")


def marker(fmt: str) -> str:
    """What strftime_now gives while probing: the date's place and format, found again later."""
    return f"\x00strftime:{fmt}\x00"


def probes(system_always: bool) -> list[tuple[str | None, tuple[str, ...]]]:
    """(system prompt or None for none, replies) per probe; each ends on a user message."""
    out = [(None, ()), (SYSTEM, ()), (None, REPLIES), (SYSTEM, REPLIES), (SYSTEM, THINKING),
           (f" {SYSTEM}\n", UNTIDY)]
    return out + [("", REPLIES)] if system_always else out


def messages(system: str | None, replies: tuple[str, ...]) -> list[dict]:
    msgs = [] if system is None else [{"role": "system", "content": system}]
    for user, reply in zip(USERS, replies, strict=False):
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return msgs + [{"role": "user", "content": USERS[len(replies)]}]


class Probe:
    """The template's renderings, memoised: each probe conversation is rendered once."""

    def __init__(self, source: str, tokenizer: Tokenizer):
        self.source, self.tokenizer, self.seen = source, tokenizer, {}
        names = {i: s for s, i in tokenizer.special.items()}
        self.special = {"bos_token": names.get(tokenizer.bos_id), "eos_token": names.get(tokenizer.eos_id)}

    def text(self, system: str | None, replies: tuple[str, ...] = ()) -> str:
        key = (system, replies)
        if key not in self.seen:
            try:
                self.seen[key] = render(self.source, messages(system, replies), marker, **self.special)
            except TemplateBudgetError as e:
                raise ValueError(f"chat template refused: {e}") from None
            except jinja2.TemplateError as e:   # bounded.py makes every failure one of these
                raise ValueError(f"chat template not supported: it fails on a plain chat ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:120] if str(e) else ''}) {SUPPORTED}") from None
        return self.seen[key]

    def mismatch(self, fmt: ChatTemplate, system_always: bool) -> str | None:
        """Where fmt's tokens first differ from the template's, or None if they never do."""
        for system, replies in probes(system_always):
            want = encode_rendered(self.tokenizer, self.text(system, replies))
            turns = [(u, encode_rendered(self.tokenizer, r)) for u, r in zip(USERS, replies, strict=False)]
            got = fmt.conversation(fmt.default_system if system is None else system, turns, USERS[len(replies)])
            if got != want:
                same = (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
                at = next(same, min(len(got), len(want)))
                return (f"the template renders {shown(self.tokenizer, want[at:])} where {type(fmt).__name__} renders "
                        f"{shown(self.tokenizer, got[at:])}")
        return None


def shown(tokenizer: Tokenizer, ids: list[int]) -> str:
    return repr(tokenizer.decode(ids[:8])) if ids else "nothing more"


def block(text: str, opener: str, closer: str) -> str | None:
    """The content of the block `text` starts with, if it starts with `opener`."""
    return text[len(opener):text.find(closer)] if text.startswith(opener) and closer in text else None


def chatml_candidates(p: Probe) -> list[ChatTemplate]:
    plain = p.text(None)
    bos = plain[:max(plain.find("<|im_start|>"), 0)]
    bos_ids = [p.tokenizer.bos_id] if bos and bos == p.special["bos_token"] else []
    default = block(plain[len(bos):], "<|im_start|>system\n", "<|im_end|>")
    kinds = [Qwen3, ChatML] if "<think>" in p.tokenizer.special and "</think>" in p.source else [ChatML]
    return [k(p.tokenizer, default_system=default or "", bos=bos_ids, system_always=default is not None) for k in kinds]


def llama3_candidates(p: Probe) -> list[ChatTemplate]:
    bot, header = "<|begin_of_text|>", "<|start_header_id|>system<|end_header_id|>\n\n"
    plain, with_system = (p.text(s).removeprefix(bot) for s in (None, SYSTEM))
    content = block(with_system, header, "<|eot_id|>") or ""
    preamble = content[:-len(SYSTEM)] if content.endswith(SYSTEM) else ""
    default = block(plain, header, "<|eot_id|>")
    system = default.removeprefix(preamble) if default is not None else ""
    return [Llama3(p.tokenizer, default_system=system, preamble=preamble, system_always=default is not None,
                   strftime=marker)]


def recognize(tokenizer: Tokenizer, source: str) -> ChatTemplate:
    """The format that renders exactly as the template does; ValueError (one line) if none."""
    p = Probe(source, tokenizer)
    llama = "<|start_header_id|>" in source
    gemma = "<start_of_turn>" in source and "<start_of_turn>" in tokenizer.special
    candidates = (llama3_candidates(p) if llama else chatml_candidates(p) if "<|im_start|>" in source
                  else [GemmaFormat(tokenizer)] if gemma else [])
    if not candidates:
        raise ValueError(f"chat template not supported: no ChatML, Llama 3 or Gemma markers {SUPPORTED}")
    reasons = []
    for fmt in candidates:  # the most specific first: its difference is the one to report
        if (why := p.mismatch(fmt, fmt.system_always)) is None:
            return dataclasses.replace(fmt, strftime=strftime_now) if llama else fmt
        reasons.append(why)
    raise ValueError(f"chat template not supported: {reasons[0]} {SUPPORTED}")


def whole_format(tokenizer: Tokenizer, source: str, default_system: str = "") -> ChatTemplate:
    """The template rendered whole every turn (whole.py), when none of our formats is it; a
    template that cannot render a plain chat is refused in one line."""
    fmt = TemplateFormat(tokenizer, default_system=default_system, source=source,
                         end_names=list(getattr(tokenizer, "end_names", ())))
    try:
        chat = fmt.render("", [(USERS[0], REPLIES[0], None)], USERS[1])   # no system prompt: some have no system role
        fmt.render("", [(USERS[0], REPLIES[0], None)], None)
    except UserError as e:
        why = str(e).removeprefix("the model's chat template refuses this chat: ")
        raise ValueError(f"chat template not supported: it fails on a plain chat ({why})") from None
    if not chat.tokens:   # the model would have nothing to answer (it was "cannot rewind to -1")
        raise ValueError(f"chat template not supported: it renders a chat as nothing {SUPPORTED}")
    return fmt


def recognize_or_whole(tokenizer: Tokenizer, source: str, default_system: str = "") -> ChatTemplate:
    """A hand-written format where one renders exactly as the template does (the fast path),
    else the template itself, rendered whole."""
    try:
        return recognize(tokenizer, source)
    except ValueError:
        return whole_format(tokenizer, source, default_system)


def gemma_template_for(tokenizer: Tokenizer, chat_template: str | None, default_system: str = "") -> ChatTemplate:
    """Gemma's format: the official one when the model's own template renders as it does, else
    that template rendered whole; with no template, Gemma's as its template renders it."""
    if chat_template:
        return recognize_or_whole(tokenizer, chat_template)
    return GemmaFormat(tokenizer, default_system=default_system)


def template_for(tokenizer: Tokenizer, chat_template: str | None, default_system: str = "") -> ChatTemplate:
    """The model's format: recognised from its own template (or that template rendered whole);
    with none, ChatML when its tokenizer has ChatML's tokens (a model directory without a
    template), else the plain fallback format (whole.PLAIN_CHAT)."""
    if chat_template:
        return recognize_or_whole(tokenizer, chat_template, default_system)
    if "<|im_start|>" in tokenizer.special:
        return ChatML(tokenizer, default_system=default_system)
    return whole_format(tokenizer, PLAIN_CHAT, default_system)
