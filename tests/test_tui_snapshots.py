"""Snapshots (pytest-textual-snapshot) of the main and help screens and a failed load.

Deterministic: random:tiny with a fixed seed and greedy decoding, and `stable=True`, which
hides the figures that change between runs (process memory, timings). Update them with
`.venv/bin/python -m pytest tests/test_tui_snapshots.py --snapshot-update` and look at the SVGs.
"""

from __future__ import annotations

from tui_pilot import make_app, ready, submit, until

from chatapp.chat.kinds import Part
from chatapp.tui.markdown import chat_markdown

SIZE = (120, 36)
GREEDY = ("--temperature", "0", "--seed", "7", "--max-new-tokens", "32")


def test_main_screen_after_two_turns(snap_compare):
    async def chat(pilot):
        await ready(pilot)
        await submit(pilot, "hello")
        await submit(pilot, "and a **second** turn")

    assert snap_compare(make_app(*GREEDY, stable=True), terminal_size=SIZE, run_before=chat)


def test_at_80x24_the_panel_folds_and_the_transcript_keeps_the_width(snap_compare):
    """The issue's 80-column terminal: the panel took half of it and replies wrapped at about 33
    columns; folded to one status line, the transcript gets 70 and more."""
    async def chat(pilot):
        await ready(pilot)
        await submit(pilot, "hello")
        await submit(pilot, "and a **second** turn")
        assert pilot.app.transcript.size.width >= 70

    assert snap_compare(make_app(*GREEDY, stable=True), terminal_size=(80, 24), run_before=chat)


def test_help_screen_at_80_columns(snap_compare):
    async def help(pilot):
        await ready(pilot)
        await pilot.press("f1")

    assert snap_compare(make_app(*GREEDY, stable=True), terminal_size=(80, 24), run_before=help)


def test_help_screen(snap_compare):
    async def help(pilot):
        await ready(pilot)
        await pilot.press("f1")

    assert snap_compare(make_app(*GREEDY, stable=True), terminal_size=SIZE, run_before=help)


def test_a_failed_load_is_one_line(snap_compare):
    async def fail(pilot):
        await until(pilot, lambda: pilot.app.loading.failed, what="the load to fail")
        await pilot.pause()

    app = make_app("--model", "random:nope", stable=True)
    assert snap_compare(app, terminal_size=SIZE, run_before=fail)


REPLY = """The primary colours:
Red (R)
Blue (B)
Yellow (Y)

- a list item
- another one
continued on a second line

| colour | code |
|---|---|
| red | R |

```python
def mix(a, b):
    return a + b
```"""


def test_a_reply_keeps_its_single_line_breaks(snap_compare):
    """Single newlines are hard breaks (chatapp/tui/markdown.py's chat_markdown): the three
    colours stay on three lines; the list, the table and the code block render as before."""
    kinds = [t.type for t in chat_markdown().parse("Red (R)\nBlue (B)")[1].children]
    assert kinds == ["text", "hardbreak", "text"]

    async def show(pilot):
        await ready(pilot)
        await pilot.app.transcript.add_exchange("the primary colours?", [Part("answer", REPLY)], [])
        await pilot.pause()

    assert snap_compare(make_app(*GREEDY, stable=True), terminal_size=(120, 44), run_before=show)
