"""The files a message really passes through: one headless turn traced, not read off a diagram.

`python -m chatapp.bench.message_path [--model SPEC]` opens the chat as headless mode does, sends
a first message (loading and warm-up, not counted), then traces the second: every project file
with a function called while it goes from the input line to the printed events, the store's
commit included. It prints the files with their call counts, grouped by folder, then one JSON
line. docs/architecture.md records the figure."""

from __future__ import annotations

import argparse
import io
import json
import sys
import threading
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def traced(run) -> Counter:
    """Calls per project file (outside tests/ and the virtualenv) while `run()` runs."""
    calls: Counter = Counter()
    root = str(ROOT) + "/"

    def profile(frame, event, _arg):
        name = frame.f_code.co_filename
        if (event == "call" and name.startswith(root) and name != __file__
                and "/.venv/" not in name and "/tests/" not in name):
            calls[name[len(root):]] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return calls


def main(argv: list[str] | None = None, out=sys.stdout) -> int:
    from chatapp.headless import run_headless
    from chatapp.launch import open_chat
    from chatapp.options import chat_parser

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model spec (default: the default model)")
    a = p.parse_args(argv)
    args = chat_parser().parse_args(["--headless", "--temperature", "0", "--max-new-tokens", "8"]
                                    + (["--model", a.model] if a.model else []))
    keeper = open_chat(args)
    events = io.StringIO()   # the turns' JSON lines: not this report
    run_headless(keeper, io.BytesIO(b"Hello there\n"), out=events)
    calls = traced(lambda: run_headless(keeper, io.BytesIO(b"What is the capital of France?\n"), out=events))
    folders = Counter(str(Path(f).parent) for f in calls)
    for folder in sorted(folders):
        print(f"{folder}/ ({folders[folder]})", file=out)
        for f in sorted(x for x in calls if str(Path(x).parent) == folder):
            print(f"  {calls[f]:6d}  {Path(f).name}", file=out)
    print(f"{len(calls)} files", file=out)
    print(json.dumps({"bench": "message_path", "model": keeper.session.lm.name, "files": len(calls),
                      "by_folder": dict(sorted(folders.items())), "calls": dict(sorted(calls.items()))}), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
