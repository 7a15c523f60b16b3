"""A chat's model is part of the chat: reopening it (`--resume`, `--chat`, `/load`, the chats
list) loads the model it was made with when that model is here (pulled, cached, or at its
recorded path), and says which one is missing otherwise, opening it on the current model.

The chat records its model as chatapp/pull/resolve.py names it (`Settings.model`); a chat saved
before that has only the model's display name, which still finds a pulled model by its folder.
"""

from __future__ import annotations

import dataclasses

from chatapp.chat.session import Session
from chatapp.keeper.switch import Loader, lm_device, load, release_memory
from chatapp.pull.resolve import available, pullable
from chatapp.store.records import ChatRecord
from model.errors import UserError


def recorded_model(record: ChatRecord) -> str | None:
    spec = record.settings.get("model")
    if isinstance(spec, str) and spec:
        return spec
    return pullable(record.model)  # an older chat: its display name, if it is a pulled model's


def session_for(session: Session, record: ChatRecord, loader: Loader) -> tuple[Session | None, str]:
    """A new session on the chat's own model (None: the current `session` serves), and a line
    saying what happened when the chat's model could not be used."""
    want, current = recorded_model(record), session.settings.model
    if want is None or want in (current, session.lm.name):
        return None, ""
    if not available(want):
        return None, (f"chat #{record.id} was made with {want}, which is not available here; "
                      f"it opens on {session.lm.name} (/model {want} switches once it is)")
    try:
        lm, named = load(want, loader, session.lm.name)
    except UserError as e:
        return None, f"chat #{record.id} was made with {want}, which did not load ({e}); opened on the current model"
    settings = dataclasses.replace(session.settings, model=named)
    return Session(lm, settings, context=session.context), ""


def drop(session: Session) -> None:
    """A session that was not adopted (the restore failed): give its memory back."""
    device = lm_device(session.lm)
    del session
    release_memory(device)
