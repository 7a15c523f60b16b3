"""Any chat template, rendered whole for every turn (docs/chat-formats.md).

A template none of our hand-written formats reproduces (Zephyr's, Mistral's [INST], Llama 2's
<<SYS>>, ...) is rendered over the whole conversation each turn, in the sandbox of
jinja_env.py, and the session keeps the cache for the longest token prefix the new rendering
shares with it (chatapp/chat/session.py). A template that rewrites earlier turns (a date line,
dropped thinking) costs more prefill, never a wrong cache.

Replies keep the ids the model wrote. Re-tokenizing a reply's text can give other ids (the
model may write "a"+"b" where the tokenizer would make "ab"), which would re-prefill every reply
for nothing; so each reply is rendered as a placeholder, and the rendered text is cut there and
the reply's ids put in. That is exact only where the template puts the reply's text in as it is:
it is checked per reply (the placeholder text replaced by the reply must give the real
rendering), and a reply the template changes (trims, drops thinking from) is rendered as text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import jinja2

from model.chat_formats.jinja_env import render
from model.chat_formats.templates import ChatTemplate, strftime_now
from model.errors import UserError

HOLE = "\ue000{}\ue001"   # private-use characters: rare in a template or a chat, and checked where met


def holes_of(indices: list[int]) -> re.Pattern:
    """The placeholders of these replies only: the same characters written by a template or typed
    in a message are text (issue 45: a template writing one for reply 99 was an IndexError)."""
    return re.compile("\ue000(" + "|".join(map(str, indices)) + ")\ue001" if indices else "(?!)")


Pair = tuple[str, str, list[int] | None]   # (user text, reply text, the reply's ids when the model wrote it)


@dataclass
class Rendered:
    tokens: list[int]
    replies: list[tuple[int, int]]   # each reply's (start, end) in tokens; (-1, -1) when rendered as text


@dataclass
class TemplateFormat(ChatTemplate):
    """The model's own template, rendered over the whole chat (`whole = True` tells the session)."""

    source: str = ""
    end_names: list[str] = field(default_factory=list)   # the file's end tokens (eos, eot, eom)
    whole: bool = field(default=True, init=False)

    def __post_init__(self):
        names = {i: s for s, i in self.tokenizer.special.items()}
        self.special = {"bos_token": names.get(self.tokenizer.bos_id), "eos_token": names.get(self.tokenizer.eos_id)}
        self.stop_ids = {self.tokenizer.special[n] for n in self.end_names if n in self.tokenizer.special}
        if self.tokenizer.eos_id is not None:
            self.stop_ids.add(self.tokenizer.eos_id)
        self.end_ids = self._end_marker()
        self.stop_ids |= set(self.end_ids[:1])

    def _text(self, system: str | None, pairs: list[tuple[str, str]], user: str | None) -> str:
        msgs = [] if system is None or (system == "" and not self.default_system) else [
            {"role": "system", "content": system}]
        for u, r in pairs:
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": r}]
        if user is not None:
            msgs.append({"role": "user", "content": user})
        try:
            return render(self.source, msgs, strftime_now, add_generation_prompt=user is not None, **self.special)
        except jinja2.TemplateError as e:   # the template's own refusal (no system role, roles out of turn)
            first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            raise UserError(f"the model's chat template refuses this chat: {first}") from None

    def _end_marker(self) -> list[int]:
        """The special tokens the template writes right after a reply (its end-of-turn marker)."""
        try:
            text = self._text(None, [("hi", HOLE.format(0))], None)
        except UserError:
            return []
        after = text.split(HOLE.format(0), 1)[-1]
        ids = self.tokenizer.encode_rendered(after, continuing=True) if HOLE.format(0) in text else []
        specials = set(self.tokenizer.special.values())
        return [i for i in ids[:1] if i in specials]

    def render(self, system: str, pairs: list[Pair], user: str | None) -> Rendered:
        """The chat's tokens: with `user`, up to where the model answers it (the generation
        prompt); without, every pair closed as the template closes a reply."""
        plain = [(u, r) for u, r, _ in pairs]
        real = self._text(system, plain, user)
        spliced = [i for i, (_, _, ids) in enumerate(pairs) if ids is not None]
        text = self._with_holes(system, plain, user, spliced, real)
        if text is None:   # some reply is changed by the template: find which, one at a time
            spliced = [i for i in spliced if self._with_holes(system, plain, user, [i], real) is not None]
            text = self._with_holes(system, plain, user, spliced, real) if spliced else real
        tokens: list[int] = []
        replies = [(-1, -1)] * len(pairs)
        parts = holes_of(spliced).split(text)
        for k, part in enumerate(parts):
            if k % 2:
                i = int(part)
                replies[i] = (len(tokens), len(tokens) + len(pairs[i][2]))
                tokens += pairs[i][2]
            elif part:
                tokens += self.tokenizer.encode_rendered(part, continuing=k > 0)
        return Rendered(tokens, replies)

    def _with_holes(self, system, plain, user, holes: list[int], real: str) -> str | None:
        """The rendering with those replies as placeholders, if putting their text back gives
        the real rendering (the template copied each of them in unchanged, once)."""
        if not holes:
            return real
        marked = [(u, HOLE.format(i) if i in holes else r) for i, (u, r) in enumerate(plain)]
        text = self._text(system, marked, user)
        if any(text.count(HOLE.format(i)) != 1 for i in holes):
            return None
        back = holes_of(holes).sub(lambda m: plain[int(m.group(1))][1], text)
        return text if back == real else None

    # --- the piece-by-piece interface, for the budgets and checks that use it ----------------
    def start(self, system: str) -> list[int]:
        """The opening before the first user message, as far as the template renders it alone."""
        first = self.render(system, [], "\ue002").tokens
        try:
            alone = self.tokenizer.encode_rendered(self._text(system, [], None))
        except UserError:
            return []
        n = next((i for i, (a, b) in enumerate(zip(alone, first, strict=False)) if a != b), min(len(alone),
                                                                                             len(first)))
        return first[:n]

    def user_turn(self, text: str, system: str = "") -> list[int]:
        """A first user message with its generation prompt, less the opening (for sizes)."""
        return self.render(system, [], text).tokens[len(self.start(system)):]

    def end_reply(self) -> list[int]:
        return list(self.end_ids)


# The plain format for a model with no template and no ChatML tokens (docs/chat-formats.md):
# "User: ...\n\nAssistant: ..." turns, BOS first when the vocabulary has one, EOS closing each
# reply (so the model's own end-of-text ends a turn). A format of its own, named as such: a base
# model's document-continuation mode (issue 26) is a different thing.
PLAIN_CHAT = ("{{ bos_token or '' }}{% for m in messages %}"
              "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
              "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n\n"
              "{% else %}Assistant: {{ m['content'] }}{{ eos_token or '' }}\n\n{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}Assistant:{% endif %}")
