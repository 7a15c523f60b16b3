"""What the store must hold after a kill, worked out only from the events the app reported.

`Ledger` starts from the store as it was before the process started and applies each reported
event (headless JSON) the way docs/persistence.md says the keeper stores it. After a kill the
store must equal the ledger: commit-then-report means everything reported is on disk. The one
thing allowed beyond it is what the app committed but was killed before printing: the turn under
way (and the trim that made room for it). tests/crash_campaign.py drives it.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path

from chatapp.chat.reply import EMPTY_FIRST_REPLY
from chatapp.keeper.reopen import pairs
from chatapp.store.database import ChatStore

SEGMENT = re.compile(r"\d{8}-\d{8}\.safetensors")


@dataclass
class View:
    """A chat as the check sees it. `settings`: the keys to compare (all of them for a chat the
    process left alone; for one it stored, those that /set changed)."""

    title: str | None
    settings: dict
    pairs: list[tuple[str, str, bool]] = field(default_factory=list)  # (user, reply, in the context)


@dataclass
class Disk:
    chats: dict[int, View]
    next_id: int          # AUTOINCREMENT: the id the next new chat gets
    latest: int | None
    integrity: str


def read_disk(root: Path) -> Disk:
    """The store as it is, opened read-only so that nothing (no sweep) changes it."""
    if not (root / "chats.db").exists():
        return Disk({}, 1, None, "ok")  # no app has started on it yet
    store = ChatStore(root, read_only=True)
    try:
        chats = {}
        for c in store.list(limit=1 << 20):
            chat = store.get(c.id)
            chats[c.id] = View(chat.title, chat.settings, [(u.content, a.content, bool(u.token_ids or a.token_ids))
                                                         for u, a in pairs(chat.messages)])
        row = store.db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'chats'").fetchone()
        return Disk(chats, (row[0] if row else 0) + 1, store.latest_id(), store.integrity_check())
    finally:
        store.close()


def leftovers(root: Path, chat_ids: set[int]) -> list[str]:
    """Anything in the snapshots folder that is neither a segment nor a stored chat's folder."""
    base = root / "snapshots"
    out = []
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if not (d.is_dir() and d.name.isdigit() and int(d.name) in chat_ids):
            out.append(f"{d.name}/ (no such chat)")
            continue
        out += [f"{d.name}/{p.name}" for p in sorted(d.iterdir()) if not SEGMENT.fullmatch(p.name)]
    return out


class Ledger:
    def __init__(self, disk: Disk):
        self.chats = copy.deepcopy(disk.chats)
        self.next_id, self.latest = disk.next_id, disk.latest
        self.current: int | None = None
        self.ephemeral = False   # created by this process and never saved by name: /undo deletes it empty
        self.retrying = False
        self.set_values: dict = {}
        self.stored_here: set[int] = set()  # chats this process committed
        self.editing = 0         # /edit's message number, from its branch event until its rewind
        self.problems: list[str] = []

    def apply(self, ev: dict) -> None:
        handler = getattr(self, "on_" + ev["event"], None)
        if handler is None:
            self.problems.append(f"unexpected event {ev}")
        else:
            handler(ev)

    def touch(self) -> None:
        """The current chat was committed: it holds this session's settings and is the latest."""
        view = self.chats[self.current]
        if self.current not in self.stored_here:  # flags and /load change what is stored: check /set's keys
            self.stored_here.add(self.current)
            view.settings = {}
        view.settings.update(self.set_values)
        self.latest = self.current

    def new_chat(self, title: str | None, chat_id: int | None = None) -> None:
        self.current = chat_id if chat_id is not None else self.next_id
        self.next_id = max(self.next_id, self.current + 1)
        self.chats[self.current] = View(title, {})
        self.ephemeral = chat_id is None

    # --- one handler per reported event ---------------------------------------------
    def on_ready(self, ev: dict) -> None:
        if ev["chat"] is not None:  # --resume: opened and saved again, so it is the latest
            self.current = ev["chat"]
            self.touch()

    def on_turn(self, ev: dict) -> None:
        if self.current is None:
            self.new_chat(" ".join(ev["user"].split())[:48])
        turns = self.chats[self.current].pairs
        if self.retrying:
            turns.pop()
        turns.append((ev["user"], ev["reply"], True))
        self.retrying = False
        self.touch()

    def on_trim(self, ev: dict) -> None:
        turns = self.chats[self.current].pairs
        first = next(i for i, p in enumerate(turns) if p[2])
        for i in range(first, first + ev["dropped_exchanges"]):
            turns[i] = (*turns[i][:2], False)
        self.touch()

    def on_retry(self, _ev: dict) -> None:
        self.retrying = True  # the rewind is not stored: the old reply stays until the new one

    def on_undo(self, _ev: dict) -> None:
        turns = self.chats[self.current].pairs
        turns.pop()
        if self.ephemeral and not turns:  # deleted before the line was printed
            del self.chats[self.current]
            self.current, self.latest, self.ephemeral = None, None, False
        else:
            self.touch()

    def on_reset(self, _ev: dict) -> None:
        self.current, self.ephemeral, self.retrying = None, False, False  # the old chat stays as it was

    on_system = on_reset

    def on_info(self, ev: dict) -> None:
        if "deleted" in ev["data"]:
            return  # said after the undo that deleted it (on_undo)
        if ev["text"] == EMPTY_FIRST_REPLY:
            return  # a random model may sample its end token first; the note changes nothing stored
        if not ev["text"].startswith("settings: "):
            self.problems.append(f"unexpected info {ev}")
            return
        self.set_values.update(ev["data"])
        if self.current is not None:
            self.touch()

    def on_saved(self, ev: dict) -> None:
        if self.current is None:
            self.new_chat(ev["title"], ev["chat"])
        elif ev["chat"] != self.current:
            self.problems.append(f"/save reported chat {ev['chat']}, the ledger has {self.current}")
        self.chats[self.current].title, self.ephemeral = ev["title"], False
        self.touch()

    def on_load(self, ev: dict) -> None:
        self.current, self.ephemeral, self.set_values = ev["chat"], False, {}
        if ev["messages"] != 2 * len(self.chats[self.current].pairs):
            self.problems.append(f"/load reported {ev['messages']} messages, the ledger has "
                                 f"{self.chats[self.current].pairs}")
        self.touch()  # opening saves it again (its settings as this session renders them)

    def on_branch(self, ev: dict) -> None:
        """/edit: the chat as it was is now a stored chat of its own (committed before this line)."""
        self.editing = ev["from_message"]
        if ev["branch"] is None:
            return
        self.chats[ev["branch"]] = View(ev["title"], {}, list(self.chats[self.current].pairs))
        self.next_id, self.latest = max(self.next_id, ev["branch"] + 1), ev["branch"]

    def on_edit(self, _ev: dict) -> None:
        """The rewind: message N and the ones after it are gone from the chat (committed)."""
        del self.chats[self.current].pairs[self.editing - 1:]
        self.ephemeral = False  # the branch names it: it stays even when emptied
        self.touch()

    def on_error(self, ev: dict) -> None:
        self.problems.append(f"error event {ev['message']}")

    # --- the check ---------------------------------------------------------------
    def mismatch(self, disk: Disk, pending: str | None) -> str:
        """"" if the store holds exactly what was reported, or that plus the turn for `pending`
        (a message whose turn was under way), which may have been committed and not printed."""
        candidates = [self] + (self.with_pending(disk, pending) if pending is not None else [])
        reasons = [c.differs(disk) for c in candidates]
        return "" if "" in reasons else reasons[0]

    def with_pending(self, disk: Disk, user: str) -> list[Ledger]:
        """The ledger plus what the turn for `user` commits before it is printed: the trim that
        made room for it (as many exchanges as the store shows out of the context), then the turn."""
        target = self.current if self.current is not None else self.next_id
        stored = disk.chats.get(target)
        if stored is None:
            return []
        trimmed = copy.deepcopy(self)
        if trimmed.current is not None:
            out = sum(not p[2] for p in stored.pairs)  # a trim's exchanges come first
            turns = trimmed.chats[target].pairs
            turns[:] = [(u, r, i >= out) for i, (u, r, _) in enumerate(turns)]
            trimmed.touch()
        turned = copy.deepcopy(trimmed)
        turned.on_turn({"user": user, "reply": stored.pairs[-1][1] if stored.pairs else ""})
        return [trimmed, turned]

    def differs(self, disk: Disk) -> str:
        if disk.integrity != "ok":
            return f"integrity_check: {disk.integrity}"
        if set(disk.chats) != set(self.chats):
            return f"stored chats {sorted(disk.chats)}, reported {sorted(self.chats)}"
        for cid, want in self.chats.items():
            got = disk.chats[cid]
            if got.pairs != want.pairs:
                return f"chat {cid}: stored {got.pairs}, reported {want.pairs}"
            if want.title is not None and got.title != want.title:
                return f"chat {cid}: stored title {got.title!r}, reported {want.title!r}"
            if {k: got.settings.get(k) for k in want.settings} != want.settings:
                return f"chat {cid}: stored settings {got.settings}, reported {want.settings}"
        if self.latest is not None and disk.latest != self.latest:
            return f"latest chat is {disk.latest}, reported {self.latest}"
        return ""
