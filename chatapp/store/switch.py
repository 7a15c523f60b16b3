"""`/model SPEC`: go on with the same chat on another model.

The conversation carries over as text: user messages, replies and tool calls are rendered again
through the new model's chat template and tokenizer (reopen.py's `rendered_conversation`, the
same path as reopening a chat made by another tokenizer), trimmed oldest first if the new context
is smaller, and re-prefilled a chunk at a time with `Prefilling` events. The new model is loaded
and filled before anything is swapped: a model that fails to load, or a conversation it cannot
take, leaves the old model and the chat exactly as they were. On success the keeper takes the new
session, the stored chat keeps its id and is saved again at once under the new model's name and
identity, so its next KV snapshot is the new model's (the old segments fail the identity check
and are removed by the next sync).
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from chatapp.chat.events import Event, Info, ModelSwitched
from chatapp.chat.session import Session
from chatapp.chat.trim import reprefill
from chatapp.pull.fetch import DEFAULT as DEFAULT_MODEL
from chatapp.pull.fetch import ensure_default_model
from chatapp.pull.resolve import resolve
from chatapp.store.database import ChatData
from chatapp.store.identity import Fingerprint
from chatapp.store.models import DEFAULT, choices, remember
from chatapp.store.reopen import archived, rendered_conversation, stored_messages
from model.errors import UserError
from model.loading import LoadedModel, LoadOptions, load_model

if TYPE_CHECKING:  # keeper.py imports this module
    from chatapp.store.keeper import ChatKeeper

Loader = Callable[[str], LoadedModel]


def same_options(lm: LoadedModel) -> Loader:
    """For a keeper made without launch's loader (tests, tools): the old model's device and dtype."""
    opts = LoadOptions(device=str(lm_device(lm)), dtype=next(lm.model.parameters()).dtype)
    return lambda spec: load_model(spec, opts)


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())[:300]
    return text if isinstance(e, UserError) else f"{type(e).__name__}: {text}"


def conversation_text(s: Session, system: str) -> ChatData:
    """The chat as text for `rendered_conversation` / `archived`: what the store would hold."""
    return ChatData("", s.lm.name, "", "", {}, system, [], 0, stored_messages(s))


def carried(old: Session, lm: LoadedModel, spec: str | None = None) -> tuple[Session, int]:
    """A session on `lm` holding `old`'s conversation, nothing of it cached yet, and how many
    exchanges left the context to make it fit. UserError: the system prompt leaves no room.
    An explicit system prompt is kept; a default one (settings.system None) follows the new model."""
    new = Session(lm, dataclasses.replace(old.settings, model=spec), context=old.context)
    text = conversation_text(old, new.system)
    tokens, exchanges = rendered_conversation(new, text)
    new.adopt(tokens, exchanges, archived(text))
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


def list_models(keeper: ChatKeeper) -> Iterator[Event]:
    """`/model` alone (headless; the TUI opens its picker): what it can switch to."""
    found = choices(keeper.store.root if keeper.store else None)
    lines = [f"{c.spec}  {c.note}" for c in found]
    yield Info(f"model: {keeper.session.lm.name}; /model SPEC switches to: " + "; ".join(lines),
               {"model": keeper.session.lm.name, "models": [dataclasses.asdict(c) for c in found]})


def load(keeper: ChatKeeper, spec: str) -> tuple[LoadedModel, str]:
    """The new model and the spec the chat records (chatapp/pull/resolve.py), or UserError in one
    line. A pullable model is pulled first if need be (quietly: a progress bar on stderr would
    tear the TUI's screen)."""
    try:
        if spec == DEFAULT:
            path, named = str(ensure_default_model(progress=lambda _p: None)), DEFAULT_MODEL
        else:
            r = resolve(spec, progress=lambda _p: None)
            path, named = r.path, r.spec
        return (keeper.loader or same_options(keeper.session.lm))(path), named
    except Exception as e:  # whatever the loader raises, the chat stays on the old model
        raise UserError(f"/model: could not load {spec} ({one_line(e)}); still on {keeper.session.lm.name}") \
            from None


def switch(keeper: ChatKeeper, spec: str) -> Iterator[Event]:
    """The `/model` handler: load, carry, prefill, and only then swap and store."""
    if not spec:
        yield from list_models(keeper)
        return
    previous = keeper.session.lm.name
    yield Info(f"loading {spec}…", {"loading": spec})
    t0 = time.perf_counter()
    lm, named = load(keeper, spec)
    t1 = time.perf_counter()
    new, failure = None, ""
    try:
        new, dropped = carried(keeper.session, lm, named)
        yield from reprefill(new.gen, new.tokens[new.cache.pos:], "model", new.lm.name)
    except Exception as e:  # too long a system prompt, out of memory: the old chat is untouched
        failure = f"/model: {spec} cannot take this chat ({one_line(e)}); still on {previous}"
    if failure:
        device = lm_device(lm)
        del lm, new
        release_memory(device)
        raise UserError(failure)
    t2 = time.perf_counter()
    device = lm_device(keeper.session.lm)
    adopt(keeper, new)
    del lm, new  # the keeper's reference is the one left: the old session can go
    release_memory(device)
    if keeper.store is not None and not keeper.store.read_only:
        remember(keeper.store.root, named)
    yield from keeper.commit()
    s = keeper.session
    yield ModelSwitched(s.lm.name, previous, len(s.exchanges), dropped, s.cache.pos, s.cache.pos,
                        s.cache.capacity, t1 - t0, t2 - t1, s.system)
    yield from keeper.write_snapshot()


def adopt(keeper: ChatKeeper, new: Session) -> None:
    """The keeper continues on `new`: same chat id and title, the new model's identity. The saved
    signature is dropped so the next commit stores the new model's name, identity and tokens even
    when the token ids came out the same; the snapshot starts again from position 0."""
    keeper.session = new
    keeper.fingerprint = Fingerprint(new.lm) if keeper.store else None
    keeper._tokenizer_fp = None
    keeper.writer, keeper.saved_sig, keeper.clean_upto = None, None, 0
    keeper.restored = None  # its line described the old model's cache
