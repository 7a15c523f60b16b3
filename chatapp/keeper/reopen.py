"""Reopening a stored chat: rebuild the session's token list, then refill its cache.

The cache comes back from the KV snapshot when one is valid for this exact model and these
exact tokens (bit-identical to the cache that was saved). Whatever the snapshot does not
cover is re-prefilled from the stored token ids, up to where the cache stood at save time, so
the reopened session is in the same state as the one that never closed. The `Restored` event
says which happened and why.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from chatapp.chat import whole
from chatapp.chat.events import Restored, ToolCall
from chatapp.chat.session import Exchange, Session
from chatapp.chat.settings import Settings
from chatapp.store.identity import ModelIdentity, tokenizer_fingerprint
from chatapp.store.records import ChatRecord, StoredMessage, StoreError
from chatapp.store.snapshots import load_chain, plan_chain, scan


def stored_messages(s: Session) -> list[StoredMessage]:
    """The chat as the store keeps it: trimmed exchanges as text only, the rest with their ids."""
    msgs = []
    for ex in s.trimmed:  # trimmed out of the context: text only, no token ids (`trimmed_exchanges`)
        msgs.append(StoredMessage("user", ex.user, []))
        msgs.append(StoredMessage("assistant", ex.reply, [], [dataclasses.asdict(c) for c in ex.tool_calls], ex.stop))
    for ex in s.exchanges:
        msgs.append(StoredMessage("user", ex.user, s.tokens[ex.start:ex.reply_start]))
        msgs.append(StoredMessage("assistant", ex.reply, s.tokens[ex.reply_start:ex.end],
                                  [dataclasses.asdict(c) for c in ex.tool_calls], ex.stop))
    return msgs


def pairs(messages: list[StoredMessage]) -> list[tuple[StoredMessage, StoredMessage]]:
    """(user, reply) pairs. A message whose other half is missing (a reply row lost, two user
    rows in a row) is kept, paired with an empty one: orphan rows are shown, never dropped."""
    out, i = [], 0
    while i < len(messages):
        m, after = messages[i], messages[i + 1] if i + 1 < len(messages) else None
        if m.role == "user" and after is not None and after.role == "assistant":
            out.append((m, after))
            i += 2
            continue
        out.append((m, StoredMessage("assistant", "", [])) if m.role == "user" else (StoredMessage("user", "", []), m))
        i += 1
    return out


def orphans(messages: list[StoredMessage]) -> int:
    """How many messages `pairs` had to give an empty other half."""
    return 2 * len(pairs(messages)) - len(messages)


def ids_fit(tokens: list[int], vocab_size: int) -> bool:
    """Stored ids a tokenizer can take: a row holding 10**9 must not reach the embedding."""
    return all(type(t) is int and 0 <= t < vocab_size for t in tokens)


def trimmed_exchanges(record: ChatRecord) -> list[Exchange]:
    """The exchanges a trim took out of the context: stored with their text and no token ids."""
    return [Exchange(u.content, -1, -1, -1, a.content, [ToolCall(**c) for c in a.tool_calls])
            for u, a in pairs(record.messages) if not u.token_ids and not a.token_ids]


def in_context(record: ChatRecord) -> list[tuple[StoredMessage, StoredMessage]]:
    return [(u, a) for u, a in pairs(record.messages) if u.token_ids or a.token_ids]


def stored_conversation(record: ChatRecord) -> tuple[list[int], list[Exchange]]:
    tokens, exchanges = list(record.prefix_tokens), []
    for u, a in in_context(record):
        start = len(tokens)
        tokens += u.token_ids
        reply_start = len(tokens)
        tokens += a.token_ids
        calls = [ToolCall(**c) for c in a.tool_calls]
        exchanges.append(Exchange(u.content, start, reply_start, len(tokens), a.content, calls))
    return tokens, exchanges


def rendered_conversation(session: Session, record: ChatRecord) -> tuple[list[int], list[Exchange]]:
    """The transcript's text through this model's template: for a chat from another tokenizer.
    What was trimmed stays out of the context, as it was."""
    t = session.template
    tokens, exchanges = t.start(record.system), []
    for u, a in in_context(record):
        start = len(tokens)
        tokens += t.user_turn(u.content, "" if exchanges else record.system)  # nanochat's system rides here
        reply_start = len(tokens)
        tokens += session.tokenizer.encode(a.content) + t.end_reply()
        exchanges.append(Exchange(u.content, start, reply_start, len(tokens), a.content,
                                  [ToolCall(**c) for c in a.tool_calls]))
    return tokens, exchanges


def fits_template(session: Session, record: ChatRecord, tokens: list[int], exchanges: list[Exchange]) -> bool:
    """The stored ids are this template's rendering of the transcript (replies aside)."""
    t = session.template
    closing = t.end_reply()
    return t.fits_start(tokens[:len(record.prefix_tokens)], record.system) and all(
        tokens[ex.start:ex.reply_start] == t.user_turn(ex.user, "" if i else record.system)
        and tokens[ex.end - len(closing):ex.end] == closing for i, ex in enumerate(exchanges))


def conversation(session: Session, record: ChatRecord) -> tuple[list[int], list[Exchange], str]:
    """The token list and exchanges to adopt, and a note when the stored ids could not be used."""
    same = record.tokenizer_fingerprint == tokenizer_fingerprint(session.tokenizer) and not record.damage
    fit = ids_fit(stored_conversation(record)[0], session.tokenizer.vocab_size) if same else True
    same = same and fit  # a stored id of 10**9 must never reach the embedding
    if record.damage:  # validate.py: its ids are not to be trusted; the text is what is left
        more = f" and {len(record.damage) - 1} more" if len(record.damage) > 1 else ""
        note = f"damaged row ({record.damage[0]}{more}); re-tokenized from its text, saved again at the next change"
    elif not fit:
        note = f"stored token ids are past this tokenizer's {session.tokenizer.vocab_size}; re-tokenized from its text"
    else:
        note = ""
    if whole.is_whole(session):   # a template rendered whole: render it again, the stored reply ids kept
        msgs = in_context(record)
        exchanges = [Exchange(u.content, -1, -1, -1, a.content, [ToolCall(**c) for c in a.tool_calls])
                     for u, a in msgs]
        pairs_ = [(u.content, a.content, list(a.token_ids) if same and a.token_ids else None) for u, a in msgs]
        tokens = whole.rendered(session.template, record.system, pairs_, exchanges)
        stored = stored_conversation(record)[0]   # without the last reply's closing: no span holds it
        kept = same and tokens[:len(stored)] == stored
        return tokens, exchanges, "" if kept else (note or "stored tokens do not follow this model's chat template; "
                                                   "re-rendered")
    if same:
        tokens, exchanges = stored_conversation(record)
        if fits_template(session, record, tokens, exchanges):
            return tokens, exchanges, ""
        note = "stored tokens do not follow this model's chat template; re-tokenized"
    elif not note:
        note = f"made with {record.model}, another tokenizer; re-tokenized from its text"
    tokens, exchanges = rendered_conversation(session, record)
    return tokens, exchanges, note


def apply_settings(session: Session, record: ChatRecord) -> None:
    known = {f.name for f in dataclasses.fields(Settings)}
    values = {k: v for k, v in record.settings.items() if k in known}
    # A default system prompt stays the model's (None), so /model gives the next model its own.
    default = values.get("system", "") is None and record.system == session.template.default_system
    session.settings = Settings(**{**values, "system": None if default else record.system})


def restore(session: Session, record: ChatRecord, identity: ModelIdentity, folder: Path | None) -> Restored:
    """Make `session` continue `record`. StoreError (the session unchanged) if it cannot fit."""
    tokens, exchanges, note = conversation(session, record)
    target = len(tokens) if note else min(max(record.cache_seqlens, 0), len(tokens))
    # What was cached must fit; a pending tail past the end is fine, as in a live session (the
    # next turn trims).
    if target > session.cache.capacity:
        raise StoreError(f"chat {record.id} holds {target} tokens, more than this cache's {session.cache.capacity} "
                         f"({session.room_hint()})")
    apply_settings(session, record)
    session.adopt(tokens, exchanges, trimmed_exchanges(record))
    give_stops(session, record)
    n, why = 0, note
    if folder is not None and not note:
        n, why = from_snapshot(session, tokens, identity, folder, target)
    if n < target:
        session.gen.prefill(tokens[n:target])
    if lone := orphans(record.messages):
        why = "; ".join(filter(None, [why, f"{lone} message(s) without their other half, kept beside an empty one"]))
    return Restored(record.id, record.title, n, target - n, len(tokens) - target, 2 * len(pairs(record.messages)),
                    session.cache.seqlen, session.cache.capacity, why)


def give_stops(session: Session, record: ChatRecord) -> None:
    """Each restored reply gets its stored stop reason, so its label ("cut at max_new_tokens")
    comes back. The trimmed pairs come first in the store, as in `session.trimmed + exchanges`."""
    both = pairs(record.messages)
    ordered = [a for u, a in both if not u.token_ids and not a.token_ids] + [a for _u, a in in_context(record)]
    for ex, reply in zip(session.trimmed + session.exchanges, ordered, strict=False):
        ex.stop = reply.stop


def from_snapshot(session: Session, tokens: list[int], identity: ModelIdentity, folder: Path,
                  target: int) -> tuple[int, str]:
    segments, bad = scan(folder)
    chain, why = plan_chain(segments, tokens, identity, target)
    n, load_why = load_chain(session.cache, chain) if chain else (0, "")
    if n < target and not (load_why or why):
        # a chain cut short by a file that is not a readable segment names that file
        why = unreadable(bad, n) or (f"snapshot covers {n} of {target} tokens" if n else "no snapshot")
    return n, load_why or why


def unreadable(bad: list[Path], at: int) -> str:
    """Why the chain stops at position `at`, when an unreadable file is there (the one that
    starts at `at` by its name, else the first)."""
    if not bad:
        return ""
    here = [p for p in bad if p.name.startswith(f"{at:08d}-")]
    return f"snapshot file {(here or bad)[0].name} is unreadable (truncated?)"
