"""A base model's completion mode: the chat is one document that the model continues.

A pretrained model (no chat template, not known to be instruction-tuned) has never seen chat
markers; given ChatML or "User:/Assistant:" turns it echoes them (issue 26: Gemma 3 270M answered
`Hello! Who are you? mendatanguser Hello! …`). So the conversation is plain text: BOS, the
system prompt if the user set one (there is no default), then each turn's text, which the model
continues. A format like the others (`start`, `user_turn`, `end_reply`), so the session, the cache
invariant, /retry, /undo, /edit and the store work unchanged: a reply is closed by a newline, so
the next turn's text starts on a line of its own (docs/chat-formats.md, "Completion mode").
"""

from __future__ import annotations

from dataclasses import dataclass

from model.chat_formats.templates import ChatTemplate
from model.tokenizers.tokenizer import Tokenizer

# Words in a model's name or `general.finetune` that mean it was tuned to follow instructions.
TUNED = ("instruct", "chat", "sft", "dpo", "rlhf", "assistant", "it")
MODE = "completion (base model)"


def words(text: str) -> list[str]:
    return "".join(c if c.isalnum() else " " for c in text.lower()).split()


def gguf_tuning(meta: dict) -> str:
    """'base' when a GGUF's own metadata names a pretrained model (a name, no fine-tune, nothing
    in its names or tags saying instruct/chat/it), 'tuned' when they say it was tuned, '' when the
    file does not say (no general.name: e.g. the random files tests write)."""
    names = [meta.get(k) for k in ("general.name", "general.basename", "general.finetune")]
    tags = meta.get("general.tags") or []
    text = [t for t in [*names, *(tags if isinstance(tags, list) else [])] if isinstance(t, str)]
    if any(w in TUNED for t in text for w in words(t)):
        return "tuned"
    if meta.get("general.finetune") or not isinstance(meta.get("general.name"), str):
        return ""
    return "base" if meta.get("general.type", "model") == "model" else ""


def text_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """User text going on in a document: special-token strings stay text, and a SentencePiece
    vocabulary with a dummy prefix adds no space inside the document."""
    if getattr(tokenizer, "prefix_space", False):
        return tokenizer.hf_unprefixed().encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text)


@dataclass
class CompletionFormat(ChatTemplate):
    """The document: BOS, the system prompt as its opening paragraph, then each turn's text and
    the model's continuation; a newline after each continuation. No markers, no default system."""

    completion = True   # the faces say "mode: completion (base model)"

    def __post_init__(self):
        self.default_system = ""   # a base model has none; a /system the user sets opens the document
        self.stop_ids = {self.tokenizer.eos_id} if self.tokenizer.eos_id is not None else set()
        self.bos = [self.tokenizer.bos_id] if self.tokenizer.bos_id is not None else []
        self.newline = text_ids(self.tokenizer, "\n")

    def start(self, system: str) -> list[int]:
        return self.bos + (text_ids(self.tokenizer, system + "\n\n") if system else [])

    def user_turn(self, text: str, system: str = "") -> list[int]:
        return text_ids(self.tokenizer, text)

    def end_reply(self) -> list[int]:
        return list(self.newline)


def mode(template: ChatTemplate) -> str:
    return MODE if getattr(template, "completion", False) else "chat"
