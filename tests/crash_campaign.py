"""Crash campaign: `kill -9` the real headless app right after each kind of event (turn, undo,
retry, reset, system, set, save, load, trim, edit), and at random moments inside turns and snapshot
writes. After each kill the store must hold exactly what was reported (tests/crash_ledger.py),
pass `integrity_check`, and the next start must leave no temp or orphan file in the snapshots.
The fault trials (tests/crash_faults.py) run the app while its saves fail (a held lock, a full
disk) or an open fails after the adopt step, and check that nothing saved is lost.

    python tests/crash_campaign.py --trials 110 [--seed 1]   # the full campaign, prints figures
    pytest tests/test_crash.py                               # the CI sample: one trial per kind

All trials share one store, so /load and --resume open what earlier kills left, and each
trial's start is the "next start" that must clean up after the kill before it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from tests.crash_faults import FAULT_KINDS, fault_trial  # noqa: E402
from tests.crash_ledger import Disk, Ledger, leftovers, read_disk  # noqa: E402

EVENT_KINDS = ["turn", "undo", "retry", "reset", "system", "set", "save", "load", "trim", "edit"]
RANDOM_KINDS = ["mid-turn", "mid-snapshot"]
KINDS = EVENT_KINDS + RANDOM_KINDS + FAULT_KINDS  # the fault trials: tests/crash_faults.py
# --context 256: a trim comes within a few turns. Temperature 1: /retry gives another reply.
FLAGS = ["--headless", "--model", "random:tiny", "--context", "256", "--max-new-tokens", "48", "--temperature", "1"]
# the event that ends each kind of input line (an error ends any)
ENDS = {"/undo": "undo", "/reset": "reset", "/system": "system", "/set": "info", "/save": "saved", "/load": "load",
        "/edit": "edit"}
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Trial:
    kind: str
    lines: list[str]
    resume: bool = False
    delay: float = 0.0     # mid-turn / mid-snapshot: seconds from the last line (or its turn) to the kill


@dataclass
class Figures:
    trials: int = 0
    kills: Counter = field(default_factory=Counter)
    lost: int = 0                # trials whose store lacks or contradicts a reported event
    integrity_failures: int = 0
    left_temp: int = 0           # kills that left a snapshot temp file: they landed inside a write
    left_folder: int = 0         # kills that left a deleted chat's snapshot folder
    committed_unreported: int = 0  # the turn under way was on disk, its line never printed (allowed)
    left_after_start: int = 0    # temp or orphan files the next start did not remove
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def plan(kind: str, r: int, rng: random.Random, have_chats: bool) -> Trial:
    say = [f"trial {r} message {i} {rng.choice(['hi', 'tell me more', 'why?', 'ok'])}" for i in range(12)]
    n = rng.randint(1, 3)
    if kind == "trim":
        return Trial(kind, say)  # sent until a trim comes
    if kind == "edit":  # a new chat of one or two exchanges (no trim yet), killed once the rewind is reported
        n = rng.randint(1, 2)
        return Trial(kind, say[:n] + [f"/edit {rng.randint(1, n)} trial {r} edited {rng.choice(['hi', 'why?'])}"])
    if kind in RANDOM_KINDS:
        # inside a turn: prefill, decode, commit, print or snapshot; inside a snapshot write: just after the turn line
        delay = rng.uniform(0, 0.25) if kind == "mid-turn" else rng.uniform(0, 0.006)
        return Trial(kind, say[:n], resume=have_chats and rng.random() < 0.5, delay=delay)
    command = {"turn": [], "undo": ["/undo"], "retry": ["/retry"], "reset": ["/reset"],
               "system": [f"/system You are terse, trial {r}."], "load": ["/load"],
               "set": [f"/set temperature={rng.choice([0.3, 0.7, 1.3])} top_k={rng.randint(2, 40)}"],
               "save": [f"/save title of trial {r}"]}[kind]
    if kind in ("save", "load"):
        n = rng.randint(0, 2)
    return Trial(kind, say[:n] + command, resume=have_chats and kind != "load" and rng.random() < 0.3)


class App:
    """The headless app in a subprocess, read one JSON event line at a time."""

    def __init__(self, root: Path, seed: int, resume: bool, stdin_text: str | None = None, faults: Path | None = None):
        env = {**os.environ, "NANOCHAT_TUI_CHATS": str(root), "NANOCHAT_TUI_TEST_FAULTS": str(faults or ""),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        entry = "tests.faults" if faults else "chatapp.cli"  # tests/faults.py: the app with failures wired in
        cmd = [sys.executable, "-m", entry, *FLAGS, "--seed", str(seed), *(["--resume"] if resume else [])]
        self.stderr = tempfile.TemporaryFile()  # a file, not a pipe: a full pipe would block the app
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                  env=env, cwd=ROOT)
        self.events: list[dict] = []

    def write(self, line: str) -> None:
        self.p.stdin.write(line.encode() + b"\n")
        self.p.stdin.flush()

    def next_event(self) -> dict:
        raw = self.p.stdout.readline()
        if not raw:
            self.stderr.seek(0)
            raise RuntimeError(f"the app exited: {self.stderr.read().decode(errors='replace')[-800:]}")
        self.events.append(json.loads(raw))
        return self.events[-1]

    def until(self, done) -> dict:
        while not done(ev := self.next_event()):
            pass
        return ev

    def kill(self) -> None:
        self.p.kill()
        self.p.wait()
        # lines printed before the kill are still in the pipe; a line the kill cut short was never reported
        for raw in self.p.stdout.read().splitlines(keepends=True):
            if raw.endswith(b"\n"):
                self.events.append(json.loads(raw))
        for f in (self.p.stdin, self.p.stdout, self.stderr):
            f.close()


def ends(line: str, ev: dict) -> bool:
    if ev["event"] == "error":
        return True
    return ev["event"] == ENDS.get(line.split()[0], "turn") and not (line == "/retry" and ev["event"] == "retry")


def drive(app: App, trial: Trial) -> str | None:
    """Feed the lines one at a time, each after the last one's events; kill at the trigger.
    Returns the message whose turn may be under way at the kill (None: nothing was under way)."""
    for i, line in enumerate(trial.lines):
        last = i == len(trial.lines) - 1
        app.write(line)
        if last and trial.kind == "mid-turn":
            time.sleep(trial.delay)
            app.kill()
            return line
        ev = app.until(lambda e, line=line: ends(line, e) or (trial.kind == "trim" and e["event"] == "trim"))
        if ev["event"] == "trim" and trial.kind == "trim":
            app.kill()
            return line
        if last:
            end = time.perf_counter() + trial.delay
            while time.perf_counter() < end:  # spin: a sleep would overshoot a millisecond
                pass
            app.kill()
            # killed at /edit's rewind: the edited message's turn is under way, maybe committed
            return line.split(maxsplit=2)[2] if trial.kind == "edit" and ev["event"] == "edit" else None
    raise AssertionError(f"{trial.kind}: no trigger came in {trial.lines}")


def start_checks(root: Path, app: App, before: Disk, fig: Figures, label: str) -> dict:
    """The start after a kill: once the app is ready, nothing the kill left may remain."""
    ready = app.next_event()
    left = leftovers(root, set(before.chats))
    if left:
        fig.left_after_start += len(left)
        fig.failures.append(f"{label}: left after the next start: {left}")
    return ready


def one_trial(root: Path, r: int, trial: Trial, disk: Disk, fig: Figures) -> Disk:
    label = f"trial {r} ({trial.kind})"
    app = App(root, seed=r, resume=trial.resume)
    try:
        start_checks(root, app, disk, fig, f"trial {r - 1}")
        ledger = Ledger(disk)
        pending = drive(app, trial)
    finally:
        if app.p.poll() is None:
            app.kill()
    fig.kills[trial.kind] += 1
    for ev in app.events:
        ledger.apply(ev)
    if pending is not None and any(e["event"] == "turn" and e["user"] == pending for e in app.events):
        pending = None  # its turn was reported: nothing more can be on disk
    after = read_disk(root)
    left = leftovers(root, set(after.chats))
    fig.left_folder += any(x.endswith("(no such chat)") for x in left)
    fig.left_temp += any(not x.endswith("(no such chat)") for x in left)
    fig.integrity_failures += after.integrity != "ok"
    problem = "; ".join(ledger.problems) or ledger.mismatch(after, pending)
    if problem:
        fig.lost += 1
        fig.failures.append(f"{label}: {problem} (events: {[e['event'] for e in app.events]})")
    elif pending is not None and ledger.differs(after):
        fig.committed_unreported += 1
    return after


def campaign(root: Path, trials: int, seed: int = 1) -> Figures:
    """Run `trials` kills (the kinds in turn, so every kind comes up), then one clean start."""
    rng, fig = random.Random(seed), Figures()
    t0 = time.perf_counter()
    disk = read_disk(root)
    for r in range(trials):
        kind = KINDS[r % len(KINDS)]
        if kind in FAULT_KINDS:
            disk = fault_trial(root, r, kind, rng, disk, fig)
        else:
            disk = one_trial(root, r, plan(kind, r, rng, bool(disk.chats)), disk, fig)
        fig.trials += 1
    app = App(root, seed=trials, resume=False)
    start_checks(root, app, disk, fig, f"trial {trials - 1}")
    app.p.stdin.close()
    app.p.wait(timeout=60)
    app.p.stdout.close()
    app.stderr.close()
    fig.seconds = time.perf_counter() - t0
    return fig


def report(fig: Figures, seed: int) -> str:
    kills = ", ".join(f"{k} {fig.kills[k]}" for k in KINDS)
    lines = [f"trials {fig.trials} (seed {seed}, {fig.seconds:.0f} s)", f"kills by kind: {kills}",
             f"lost or contradicted reported events: {fig.lost}", f"integrity_check failures: {fig.integrity_failures}",
             f"kills that left a snapshot temp file: {fig.left_temp}; a deleted chat's folder: {fig.left_folder}",
             f"temp or orphan files left after the next start: {fig.left_after_start}",
             f"turns committed but killed before printed (allowed): {fig.committed_unreported}"]
    return "\n".join(lines + [f"FAIL {f}" for f in fig.failures])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=len(KINDS) * 10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--store", type=Path, help="the store folder (default: a new temp folder)")
    args = ap.parse_args()
    root = args.store or Path(tempfile.mkdtemp(prefix="crash-campaign-"))
    fig = campaign(root, args.trials, args.seed)
    print(report(fig, args.seed))
    return 1 if fig.failures else 0


if __name__ == "__main__":
    sys.exit(main())
