"""A reply's Markdown streamed in pieces (chatapp/tui/markdown.py): the same widgets as one parse
of the whole text, a growing list keeps the rows it had, and the last block carries `.last`."""

from __future__ import annotations

import pytest
from textual.app import App
from textual.containers import Horizontal
from textual.widgets import Markdown

from chatapp.tui.markdown import ReplyMarkdown, chat_markdown

LIST = "".join(f"{i}. **Fruit {i}** is tasty\n   and round.\n" for i in range(1, 13))
TEXT = ("Here are fruits:\n\n" + LIST + "\n- a\n- b\n  - nested *b*\n- c\n\n"
        "```python\nprint(1)\n```\n\nDone.")  # no table: Textual grows one its own way


class Pair(App):
    def compose(self):
        yield ReplyMarkdown()
        yield Markdown(parser_factory=chat_markdown)


def tree(widget, depth: int = 0) -> list[str]:
    """Each widget under `widget` by type (ours named as Textual's), with what it shows."""
    out = []
    for child in widget.children:
        name = type(child).__name__.replace("Growing", "Markdown")
        shown = getattr(child, "symbol", None) or getattr(child, "_content", None) or ""
        out.append(f"{'  ' * depth}{name} {shown}")
        out += tree(child, depth + 1)
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("step", [1, 7, 40])
async def test_a_streamed_reply_builds_the_widgets_one_parse_of_it_builds(step):
    app = Pair()
    async with app.run_test(size=(80, 200)) as pilot:
        streamed, whole = app.query(Markdown)
        for i in range(0, len(TEXT), step):
            await streamed.add(TEXT[i:i + step])
        await whole.update(TEXT)
        await pilot.pause()
        assert tree(streamed) == tree(whole)
        assert len(streamed.query("MarkdownBullet")) == 12 + 4


class Three(App):
    def compose(self):
        yield ReplyMarkdown()
        yield Markdown(parser_factory=chat_markdown)
        yield Markdown(parser_factory=chat_markdown)


PIECES = ["1. ", "2. ", "10. ", "- ", "  - ", "   ", "**bold** ", "word ", "\n", "\n\n", "```\ncode\n```\n",
          "# Head\n", "> quote\n", "text", "3) ", "* ", "\n1. ", "\n- "]


@pytest.mark.anyio
async def test_random_streams_build_what_textual_or_one_parse_builds():
    """Random list-heavy Markdown in random pieces: our widget ends equal to one parse of the
    whole text, or to Textual's own streamed widget where its incremental parse differs by
    itself (a block quote after a list: 1 of 150 seeds). 150 seeds passed when this was written;
    the suite runs a dozen."""
    import random

    for seed in range(12):
        rnd = random.Random(seed)
        text = "".join(rnd.choice(PIECES) for _ in range(rnd.randint(5, 80)))
        app = Three()
        async with app.run_test(size=(80, 400)) as pilot:
            ours, plain, whole = app.query(Markdown)
            i = 0
            while i < len(text):
                n = rnd.randint(1, 12)
                await ours.add(text[i:i + n])
                await plain.append(text[i:i + n])
                i += n
            await whole.update(text)
            await pilot.pause()
            assert tree(ours) in (tree(whole), tree(plain)), (seed, text)


@pytest.mark.anyio
async def test_a_growing_list_keeps_its_rows_and_renumbers_them_when_the_count_gains_a_digit():
    """Textual rebuilds a whole list on every append; ours rebuilds only the item being written."""
    app = Pair()
    async with app.run_test(size=(80, 100)) as pilot:
        md = app.query_one(ReplyMarkdown)
        for i in range(1, 10):
            await md.add(f"{i}. item {i}\n")
        (lst,) = md.children
        rows = list(lst.query_children(Horizontal))
        await md.add("10. item 10\n11. item")
        await pilot.pause()
        after = list(lst.query_children(Horizontal))
        assert md.children[0] is lst and len(after) == 11
        assert after[:8] == rows[:8]  # the same widgets, not new ones
        assert after[8] is not rows[8]  # the item that was last is rebuilt (it might have grown)
        assert [str(b.symbol) for b in lst.query("MarkdownBullet")][:2] == ["  1. ", "  2. "]
        assert str(lst.query("MarkdownBullet").last().symbol) == " 11. "


@pytest.mark.anyio
async def test_only_the_last_block_is_marked_last():
    """app.tcss drops the bottom margin of `.last`: a class, so no rule needs `:last-child`."""
    app = Pair()
    async with app.run_test(size=(80, 60)):
        md = app.query_one(ReplyMarkdown)
        await md.add("One.\n\n")
        await md.add("- a\n- b\n\nTwo.")
        assert [b.has_class("last") for b in md.children] == [False, False, True]
        await md.replace("Just one.")
        assert [b.has_class("last") for b in md.children] == [True]


def test_no_rule_of_the_app_styles_by_order():
    """A rule with :first-child, :last-child and the like makes Textual restyle every sibling's
    subtree on each mount: with `*` in it, every widget of the app on every streamed row."""
    from pathlib import Path

    css = (Path(__file__).parents[1] / "chatapp/tui/app.tcss").read_text()
    assert not any(p in css for p in (":first-child", ":last-child", ":first-of-type", ":last-of-type",
                                      ":odd", ":even", ":empty"))
