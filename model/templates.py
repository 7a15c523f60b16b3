"""Chat templates: how a conversation becomes tokens, one piece at a time.

A template never renders the whole history. The session asks for just the tokens a new
turn adds, which is what lets each turn cost only its new tokens. Rendering piece by
piece must equal rendering the whole transcript at once; tests check that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model.tokenizer import Tokenizer


@dataclass
class ChatTemplate:
    """Token pieces of a family's chat format. Subclasses fill in the pieces."""

    tok: Tokenizer
    default_system: str = ""
    stop_ids: set[int] = field(default_factory=set)

    def start(self, system: str) -> list[int]:
        """Tokens that open a conversation (BOS, system prompt)."""
        raise NotImplementedError

    def user_turn(self, text: str, system: str = "") -> list[int]:
        """A user message followed by the assistant header: what the model answers after.
        `system` comes with the conversation's first user message only: a family with no
        system role (nanochat) folds it into that message; the others have it in start()."""
        raise NotImplementedError

    def end_reply(self) -> list[int]:
        """Tokens that close an assistant reply. The stop token the model sampled is never
        kept as is: the reply is always closed with these, so a reply cut short (length,
        Esc) and one that ended on EOS leave the same well-formed transcript."""
        raise NotImplementedError

    # nanochat's calculator; None for families without tools.
    tool_tokens: dict[str, int] | None = None


@dataclass
class ChatML(ChatTemplate):
    """<|im_start|>role\\ntext<|im_end|>\\n — SmolLM2, Qwen and most HF chat models."""

    bos: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.im_start = self.tok.token("<|im_start|>")
        self.im_end = self.tok.token("<|im_end|>")
        self.stop_ids = {self.im_end} | ({self.tok.eos_id} if self.tok.eos_id is not None else set())
        self.nl = self.tok.encode("\n")

    def _message(self, role: str, text: str) -> list[int]:
        return [self.im_start, *self.tok.encode(f"{role}\n{text}"), self.im_end, *self.nl]

    def start(self, system: str) -> list[int]:
        return list(self.bos) + (self._message("system", system) if system else [])

    def user_turn(self, text: str, system: str = "") -> list[int]:
        return self._message("user", text) + [self.im_start, *self.tok.encode("assistant\n")]

    def end_reply(self) -> list[int]:
        return [self.im_end, *self.nl]


@dataclass
class NanochatFormat(ChatTemplate):
    """<|bos|><|user_start|>…<|user_end|><|assistant_start|>…<|assistant_end|>."""

    def __post_init__(self):
        t = self.tok.token
        self.bos_id, self.user_start, self.user_end = t("<|bos|>"), t("<|user_start|>"), t("<|user_end|>")
        self.assistant_start, self.assistant_end = t("<|assistant_start|>"), t("<|assistant_end|>")
        self.stop_ids = {self.assistant_end, self.bos_id}
        self.tool_tokens = {name: t(f"<|{name}|>") for name in
                            ("python_start", "python_end", "output_start", "output_end")}

    def start(self, system: str) -> list[int]:
        return [self.bos_id]

    def user_turn(self, text: str, system: str = "") -> list[int]:
        # nanochat has no system role: its render_conversation prepends a system message to
        # the first user message as "system\n\nuser", encoded as one text.
        text = f"{system}\n\n{text}" if system else text
        return [self.user_start, *self.tok.encode(text), self.user_end, self.assistant_start]

    def end_reply(self) -> list[int]:
        return [self.assistant_end]


@dataclass
class Llama3(ChatTemplate):
    """<|start_header_id|>role<|end_header_id|>\\n\\ntext<|eot_id|> — Llama 3.x instruct models."""

    def __post_init__(self):
        t = self.tok.token
        self.bot, self.sh, self.eh, self.eot = (t("<|begin_of_text|>"), t("<|start_header_id|>"),
                                                t("<|end_header_id|>"), t("<|eot_id|>"))
        self.stop_ids = {self.eot} | ({self.tok.eos_id} if self.tok.eos_id is not None else set())

    def _header(self, role: str) -> list[int]:
        return [self.sh, *self.tok.encode(role), self.eh, *self.tok.encode("\n\n")]

    def start(self, system: str) -> list[int]:
        return [self.bot] + ([*self._header("system"), *self.tok.encode(system), self.eot] if system else [])

    def user_turn(self, text: str, system: str = "") -> list[int]:
        return [*self._header("user"), *self.tok.encode(text), self.eot, *self._header("assistant")]

    def end_reply(self) -> list[int]:
        return [self.eot]


def template_for(tok: Tokenizer, chat_template: str | None, default_system: str = "") -> ChatTemplate:
    """Pick the family's format from a Jinja chat template's markers (we never run the Jinja)."""
    src = chat_template or ""
    if "<|start_header_id|>" in src:
        return Llama3(tok, default_system=default_system)
    if "<|im_start|>" in src or (not src and "<|im_start|>" in tok.special):
        return ChatML(tok, default_system=default_system)
    raise ValueError("unsupported chat template (supported: ChatML, Llama 3)")
