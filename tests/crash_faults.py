"""The crash campaign's fault trials (issue 27 item 0): the real headless app while its saves
fail or an open fails after the adopt step, then `kill -9` or a clean exit. The store must hold
exactly what the ledger says once the failure has passed, a failure is reported each time it
happens, and an exit with turns still unsaved says so in one line with a copy holding them.

- `locked`:       the campaign holds the database's write lock during a turn (the app's save
                  waits its 2 s and fails); released; the next turn's save must catch up.
- `disk-full`:    every write fails as on a full disk (tests/faults.py); then /save catches up.
- `open-fails`:   /load of another chat fails right after the adopt step; this chat must keep
                  its id and messages, and the next turn goes into it.
- `exit-unsaved`: the disk fills after a turn; the next turn is not saved; stdin closes: the
                  exit must say so in one line, exit 1, and a Markdown copy must hold that turn.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

from model.escapes import escape_controls
from tests.crash_ledger import Disk, Ledger, leftovers, read_disk

FAULT_KINDS = ["locked", "disk-full", "open-fails", "exit-unsaved"]


def say(app, line: str, failing_save: bool = False) -> list[dict]:
    """Send one line; its events, up to the one that ends it (and, for a turn whose save is to
    fail, the error that follows the turn)."""
    from tests.crash_campaign import ends  # crash_campaign imports this module

    first = len(app.events)
    app.write(line)
    app.until(lambda e: ends(line, e))
    if failing_save and app.events[-1]["event"] == "turn":
        app.next_event()
    return app.events[first:]


def expected(events: list[dict], words: str) -> int:
    return sum(e["event"] == "error" and words in e["message"] for e in events)


def fault_trial(root: Path, r: int, kind: str, rng: random.Random, disk: Disk, fig) -> Disk:
    from tests.crash_campaign import App, start_checks  # crash_campaign imports this module

    label = f"trial {r} ({kind})"
    flags = root.with_name(root.name + "-faults")
    flags.mkdir(exist_ok=True)
    for f in flags.iterdir():
        f.unlink()
    if kind == "open-fails" and not disk.chats:
        kind = "locked"  # nothing to open yet
    app = App(root, seed=r, resume=False, faults=flags)
    problems: list[str] = []
    skip: set[int] = set()  # indices of events the ledger must not apply (the injected failures)
    try:
        start_checks(root, app, disk, fig, f"trial {r - 1}")
        before = len(app.events)
        if kind == "locked":
            lock = sqlite3.connect(root / "chats.db", isolation_level=None, timeout=10)
            lock.execute("BEGIN IMMEDIATE")
            evs = say(app, f"trial {r} while the lock is held", failing_save=True)
            lock.execute("ROLLBACK")
            lock.close()
            if expected(evs, "locked") != 1:
                problems.append(f"a held lock was not reported once: {evs}")
            say(app, f"trial {r} after the lock")
        elif kind == "disk-full":
            (flags / "disk-full").touch()
            evs = say(app, f"trial {r} on a full disk", failing_save=True)
            (flags / "disk-full").unlink()
            if expected(evs, "disk is full") != 1:
                problems.append(f"a full disk was not reported: {evs}")
            say(app, f"/save trial {r} after the full disk")
        elif kind == "open-fails":
            say(app, f"trial {r} before the failed open")
            (flags / "adopt").touch()
            evs = say(app, "/load")
            (flags / "adopt").unlink()
            if expected(evs, "could not be opened") != 1 or "still in chat #" not in str(evs):
                problems.append(f"a failed open was not reported as staying: {evs}")
            say(app, f"trial {r} after the failed open")
        else:  # exit-unsaved
            say(app, f"trial {r} saved")
            (flags / "disk-full").touch()
            unsaved = say(app, f"trial {r} never saved", failing_save=True)
            skip.update(range(len(app.events) - len(unsaved), len(app.events)))
            app.p.stdin.close()
            rc = app.p.wait(timeout=60)
            rest = [json.loads(x) for x in app.p.stdout.read().splitlines()]
            app.events += rest
            skip.update(range(len(app.events) - len(rest), len(app.events)))
            problems += check_exit(rc, rest, unsaved)
        skip.update(i for i in range(before, len(app.events))
                    if app.events[i]["event"] == "error" and i not in skip
                    and any(w in app.events[i]["message"] for w in ("not saved", "could not be opened")))
    finally:
        if app.p.poll() is None:
            app.kill()
    fig.kills[kind] += 1
    ledger = Ledger(disk)
    for i, ev in enumerate(app.events):
        if i not in skip:
            ledger.apply(ev)
    after = read_disk(root)
    fig.integrity_failures += after.integrity != "ok"
    left = leftovers(root, set(after.chats))
    fig.left_temp += bool(left)
    problem = "; ".join(problems + ledger.problems) or ledger.mismatch(after, None)
    if problem:
        fig.lost += 1
        fig.failures.append(f"{label}: {problem} (events: {[e['event'] for e in app.events]})")
    return after


def check_exit(rc: int, rest: list[dict], unsaved: list[dict]) -> list[str]:
    """The clean exit after an unsaved turn: exit 1, one error line naming a copy holding it."""
    last = rest[-1]["message"] if rest and rest[-1]["event"] == "error" else ""
    if rc != 1 or "not saved" not in last or " is in " not in last:
        return [f"exit with an unsaved turn: rc {rc}, last events {rest}"]
    turn = next(e for e in unsaved if e["event"] == "turn")
    text = Path(last.rsplit(" is in ", 1)[1]).read_text(encoding="utf-8")
    Path(last.rsplit(" is in ", 1)[1]).unlink()
    reply = escape_controls(turn["reply"].strip(), lines=True)  # the copy spells out a random model's controls
    if turn["user"] not in text or reply not in text:
        return [f"the copy lacks the unsaved turn {turn['user']!r}"]
    return []
