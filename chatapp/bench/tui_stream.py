"""How much decode speed the TUI costs: the same greedy chat in headless mode and in the real
Textual app (under `App.run_test`, drawing every batch as a terminal would), per turn.

`python -m chatapp.bench.tui_stream [--model SPEC] [--max-new-tokens N]` prints a table of each
turn's decode tok/s in both faces and their ratio, then one JSON line. The prompts ask for a
numbered list, prose, the list again on a longer transcript, and a list of 40 items: lists are
the costly case to stream (Textual rebuilds a whole list on every append; chatapp/tui/markdown.py
grows it in place). Both faces run on this machine's cores in turn, so read the ratio, not the
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

PROMPTS = ["Explain how a car engine works, step by step.", "Write a long story about a dragon.",
           "Tell me about the history of Rome in detail.", "Explain how a car engine works, step by step.",
           "List 40 countries and their capitals as a numbered list."]


def headless_speeds(argv: list[str]) -> list[float]:
    p = subprocess.run([sys.executable, "-m", "chatapp.cli", "--headless", *argv],
                       input="\n".join(PROMPTS).encode() + b"\n", capture_output=True, timeout=900)
    events = [json.loads(line) for line in p.stdout.decode().splitlines()]
    return [e["tokens_per_s"] for e in events if e["event"] == "turn"]


def tui_speeds(argv: list[str]) -> list[float]:
    from chatapp.options import chat_parser
    from chatapp.tui.app import ChatApp

    app = ChatApp(chat_parser().parse_args(argv))

    async def run() -> list[float]:
        async with app.run_test(size=(120, 40)) as pilot:
            while app.session is None or not app.loading.ready:
                await pilot.pause(0.05)
            for n, prompt in enumerate(PROMPTS, 1):
                await pilot.press(*prompt, "enter")
                end = time.monotonic() + 600
                while (len(app.session.turn_stats) < n or app.busy) and time.monotonic() < end:
                    await pilot.pause(0.02)
            return [t.tokens_per_s for t in app.session.turn_stats]
    return asyncio.run(run())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a model spec (default: the default model)")
    p.add_argument("--max-new-tokens", type=int, default=160)
    a = p.parse_args()
    argv = [*(["--model", a.model] if a.model else []), "--temperature", "0", "--no-store",
            "--max-new-tokens", str(a.max_new_tokens)]
    headless, tui = headless_speeds(argv), tui_speeds(argv)
    rows = list(zip(headless, tui, strict=False))
    print(f"{'turn':<5} | {'headless tok/s':>14} | {'TUI tok/s':>9} | TUI / headless")
    for i, (h, t) in enumerate(rows, 1):
        print(f"{i:<5} | {h:>14.1f} | {t:>9.1f} | {t / h:.2f}x")
    print(json.dumps({"bench": "tui_stream", "model": a.model or "default", "headless_tok_s": headless,
                      "tui_tok_s": tui, "ratios": [t / h for h, t in rows]}))


if __name__ == "__main__":
    main()
