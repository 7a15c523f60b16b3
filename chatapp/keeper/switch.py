"""`/model SPEC`: go on with the same chat on another model.

The conversation carries over as text: user messages, replies and tool calls are rendered again
through the new model's chat template and tokenizer (reopen.py's `rendered_conversation`, the
same path as reopening a chat made by another tokenizer), trimmed oldest first if the new context
is smaller, and re-prefilled a chunk at a time with `Prefilling` events. The new model is loaded
and filled before anything is swapped: a model that fails to load, or a conversation it cannot
take, leaves the old model and the chat exactly as they were. `switch` returns a `Switched`; the
keeper takes its session (`ChatKeeper.adopt`), the stored chat keeps its id and is saved again at
once under the new model's name and identity, so its next KV snapshot is the new model's (the old
segments fail the identity check and are removed by the next sync).
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import time
from collections.abc import Callable
from collections.abc import Generator as Yields
from dataclasses import dataclass

import torch

from chatapp.chat.events import Event, Info
from chatapp.chat.session import Session
from chatapp.chat.trim import reprefill
from chatapp.keeper.models import DEFAULT
from chatapp.keeper.reopen import rendered_conversation, stored_messages, trimmed_exchanges
from chatapp.pull.fetch import DEFAULT as DEFAULT_MODEL
from chatapp.pull.fetch import ensure_default_model
from chatapp.pull.resolve import resolve
from chatapp.store.records import ChatRecord
from model.errors import UserError
from model.loading import LoadedModel, LoadOptions, load_model

Loader = Callable[[str], LoadedModel]


def same_options(lm: LoadedModel) -> Loader:
    """For a keeper made without launch's loader (tests, tools): the old model's device and dtype."""
    opts = LoadOptions(device=str(lm_device(lm)), dtype=next(lm.model.parameters()).dtype)
    return lambda spec: load_model(spec, opts)


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())[:300]
    return text if isinstance(e, UserError) else f"{type(e).__name__}: {text}"


def conversation_text(s: Session, system: str) -> ChatRecord:
    """The chat as text for `rendered_conversation` / `trimmed_exchanges`: what the store would hold."""
    return ChatRecord("", s.lm.name, "", "", {}, system, [], 0, stored_messages(s))


def carried(old: Session, lm: LoadedModel, spec: str | None = None) -> tuple[Session, int]:
    """A session on `lm` holding `old`'s conversation, nothing of it cached yet, and how many
    exchanges left the context to make it fit. UserError: the system prompt leaves no room.
    An explicit system prompt is kept; a default one (settings.system None) follows the new model."""
    new = Session(lm, dataclasses.replace(old.settings, model=spec), context=old.context)
    text = conversation_text(old, new.system)
    tokens, exchanges = rendered_conversation(new, text)
    new.adopt(tokens, exchanges, trimmed_exchanges(text))
    return new, sum(t.dropped_exchanges for t in new.fit())


def lm_device(lm: LoadedModel) -> torch.device:
    return next(lm.model.parameters()).device


def release_memory(device: torch.device) -> None:
    """The old model's weights, cache and CUDA graphs go once nothing refers to them. glibc keeps
    freed heap pages for reuse: a second switch away from a 135M model left RSS 450 MiB high
    until malloc_trim gave them back (measured on the CPU, random presets)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator returns pages itself
        pass


@dataclass
class Switched:
    """What `switch` made, for the keeper to take (`ChatKeeper.adopt`): the new session with the
    chat carried and prefilled, the spec the chat records, and the figures `ModelSwitched` reports."""
    session: Session
    named: str
    previous: str
    trimmed: int   # exchanges the smaller context could not carry (Session.trimmed)
    load_s: float
    prefill_s: float


def load(spec: str, loader: Loader, current: str) -> tuple[LoadedModel, str]:
    """The new model and the spec the chat records (chatapp/pull/resolve.py), or UserError in one
    line naming the `current` model the chat stays on. A pullable model is pulled first if need
    be (quietly: a progress bar on stderr would tear the TUI's screen)."""
    try:
        if spec == DEFAULT:
            path, named = str(ensure_default_model(progress=lambda _p: None)), DEFAULT_MODEL
        else:
            r = resolve(spec, progress=lambda _p: None)
            path, named = r.path, r.spec
        return loader(path), named
    except Exception as e:  # whatever the loader raises, the chat stays on the old model
        raise UserError(f"/model: could not load {spec} ({one_line(e)}); still on {current}") from None


def switch(old: Session, spec: str, loader: Loader) -> Yields[Event, None, Switched]:
    """Load `spec`, carry `old`'s chat over and prefill it; `old` is never touched. Yields the
    progress events and returns the result; UserError (the new model's memory given back) if the
    model does not load or cannot take the chat."""
    previous = old.lm.name
    yield Info(f"loading {spec}…", {"loading": spec})
    t0 = time.perf_counter()
    lm, named = load(spec, loader, previous)
    t1 = time.perf_counter()
    new, failure = None, ""
    try:
        new, trimmed = carried(old, lm, named)
        yield from reprefill(new.gen, new.tokens[new.cache.seqlen:], "model", new.lm.name)
    except Exception as e:  # too long a system prompt, out of memory: the old chat is untouched
        failure = f"/model: {spec} cannot take this chat ({one_line(e)}); still on {previous}"
    if failure:
        device = lm_device(lm)
        del lm, new
        release_memory(device)
        raise UserError(failure)
    return Switched(new, named, previous, trimmed, t1 - t0, time.perf_counter() - t1)
