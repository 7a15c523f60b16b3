"""The files a message really passes through: one turn traced, not read off a diagram.

`python -m chatapp.bench.message_path [--model SPEC] [--tui]` opens the chat as headless mode
(or, with --tui, the real Textual app under `App.run_test`) does, sends a first message (loading
and warm-up, not counted), then traces the second: every project file with a function called
from the moment it is sent (the input line read; in the TUI, Enter pressed) until its events are
printed (in the TUI, until the reply and the panel's figures are on screen), the store's commit
included; headless mode's `ready` line and its exit's save are the process's, not the message's.
It prints the files with their call counts and how many of their lines belong to a function
that was called, grouped by folder, then one JSON line.
docs/architecture.md records both figures."""

from __future__ import annotations

import argparse
import io
import json
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _profiler(calls: Counter, codes: set):
    """A profile hook counting calls per project file (outside tests/ and the virtualenv), and
    keeping each function called."""
    root = str(ROOT) + "/"

    def profile(frame, event, _arg):
        name = frame.f_code.co_filename
        if (event == "call" and name.startswith(root) and name != __file__
                and "/.venv/" not in name and "/tests/" not in name):
            calls[name[len(root):]] += 1
            codes.add(frame.f_code)
    return profile


def called_lines(codes: set) -> Counter:
    """Per file, how many of its lines belong to a function that was called (nested ones once)."""
    spans: dict[str, set[int]] = {}
    for code in codes:
        lines = [n for _, _, n in code.co_lines() if n]
        last = max(lines, default=code.co_firstlineno)
        spans.setdefault(code.co_filename[len(str(ROOT)) + 1:], set()).update(range(code.co_firstlineno, last + 1))
    return Counter({f: len(s) for f, s in spans.items()})


class Tracing:
    """Counts calls per project file, on every thread, between `start()` and `stop()`."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.codes: set = set()
        self.profile = _profiler(self.calls, self.codes)

    def start(self) -> None:
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)

    def stop(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)


FIRST, SECOND = "Hello there", "What is the capital of France?"


def headless_turn(argv: list[str]) -> tuple[str, Tracing]:
    """One headless run of two lines: the count starts when the second line is read and stops
    when the loop asks for the next one, its events printed. The `ready` line before the first
    and the exit's save after the last belong to the process, not to a message."""
    from chatapp.headless import run_headless
    from chatapp.launch import open_chat
    from chatapp.options import chat_parser

    keeper = open_chat(chat_parser().parse_args(["--headless", *argv]))
    tracing = Tracing()

    def lines():
        yield FIRST.encode() + b"\n"
        tracing.start()
        try:
            yield SECOND.encode() + b"\n"
        finally:
            tracing.stop()

    run_headless(keeper, lines(), out=io.StringIO())   # the JSON lines: not this report
    return keeper.session.lm.name, tracing


def tui_turn(argv: list[str]) -> tuple[str, Tracing]:
    """The real app: type the message, then trace from Enter until the turn is done and drawn."""
    import asyncio
    import time

    from chatapp.options import chat_parser
    from chatapp.tui.app import ChatApp

    app = ChatApp(chat_parser().parse_args(argv))
    tracing = Tracing()

    async def until(pilot, cond, timeout: float = 300.0) -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise TimeoutError("the TUI turn did not finish")
            await pilot.pause(0.02)

    async def send(pilot, text: str, trace: bool) -> None:
        done = app.inputs_done
        await pilot.press(*text)

        async def enter() -> None:
            await pilot.press("enter")
            await until(pilot, lambda: app.inputs_done > done and not app.busy)
            await pilot.pause(0.3)   # the last batch and the panel's figures drawn

        if not trace:
            return await enter()
        tracing.start()
        # the turn worker runs in the loop's executor, whose thread the first turn started before
        # the hook was set: a fresh executor starts a thread that carries it
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        try:
            await enter()
        finally:
            tracing.stop()

    async def run() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.session is not None and app.loading.ready)
            await send(pilot, FIRST, trace=False)
            await send(pilot, SECOND, trace=True)

    asyncio.run(run())
    return app.session.lm.name, tracing


def main(argv: list[str] | None = None, out=sys.stdout) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model spec (default: the default model)")
    p.add_argument("--tui", action="store_true", help="trace the Textual app's turn, not headless mode's")
    a = p.parse_args(argv)
    chat = ["--temperature", "0", "--max-new-tokens", "8"] + (["--model", a.model] if a.model else [])
    name, tracing = (tui_turn if a.tui else headless_turn)(chat)
    calls, lines = tracing.calls, called_lines(tracing.codes)
    folders = Counter(str(Path(f).parent) for f in calls)
    print("calls  lines of called functions  file", file=out)
    for folder in sorted(folders):
        files = sorted(x for x in calls if str(Path(x).parent) == folder)
        print(f"{folder}/ ({len(files)} files, {sum(lines[f] for f in files)} lines)", file=out)
        for f in files:
            print(f"  {calls[f]:6d}  {lines[f]:5d}  {Path(f).name}", file=out)
    print(f"{len(calls)} files, {sum(lines.values())} lines of called functions", file=out)
    print(json.dumps({"bench": "message_path", "face": "tui" if a.tui else "headless", "model": name,
                      "files": len(calls), "called_lines": sum(lines.values()),
                      "by_folder": dict(sorted(folders.items())), "calls": dict(sorted(calls.items())),
                      "lines": dict(sorted(lines.items()))}), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
