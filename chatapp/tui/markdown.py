"""A reply's Markdown: Textual's widget with chat line breaks and lists that grow in place.

Textual's `Markdown.append` re-parses the last top-level block and, for a list, removes the
whole list's widgets and mounts a fresh tree, so every batch of a streamed numbered list cost
more than the one before: CSS for every new widget, then a layout of all of them. While a model
writes, that work holds the GIL and a core the decode's threads need (docs/notes.md, "The TUI
starved the model"). Here a list that grew keeps the rows it had: only its last item, the one
still being written, is rebuilt, and the items after it are mounted.
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from textual.containers import Horizontal
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownBlock, MarkdownBullet, MarkdownBulletList, MarkdownOrderedList


def hard_breaks(state) -> None:
    """A markdown-it core rule: every soft break in inline text becomes a hard one."""
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type, child.tag = "hardbreak", "br"


def chat_markdown() -> MarkdownIt:
    """Textual's parser, with single newlines kept as line breaks, as chat apps show a reply (a
    model writes `Red\nBlue\nYellow` as three lines, not one paragraph). markdown-it's own
    `breaks` option only changes its HTML renderer; Textual reads the tokens, so the rule
    rewrites them. Code blocks, lists and tables parse as before."""
    md = MarkdownIt("gfm-like")
    md.core.ruler.push("hard_breaks", hard_breaks)
    return md


async def grow_list(old: MarkdownBlock, new: MarkdownBlock) -> bool:
    """Bring the mounted list `old` up to `new`, its re-parse with more text: the rows before
    the last one are final (a list's earlier items never change once a later one starts), so
    they stay, their numbers re-padded if the count gained a digit. False: not a list that
    grew; the caller rebuilds."""
    rows = list(old.query_children(Horizontal))
    if type(new) is not type(old) or not rows:
        return False
    fresh = list(new.compose())  # one Horizontal(bullet, body) an item, as Textual builds them
    keep = min(len(rows), len(fresh)) - 1
    if keep < 0:
        return False
    for row, row_new in zip(rows[:keep], fresh[:keep], strict=True):
        bullet, symbol = row.query_one(MarkdownBullet), row_new._pending_children[0].symbol  # not yet mounted
        if bullet.symbol != symbol:
            bullet.symbol = symbol
    await old.remove_children(rows[keep:])
    await old.mount_all(fresh[keep:])
    old._copy_context(new)
    return True


# Two classes, not a shared base: a base deriving from MarkdownBlock puts its DEFAULT_CSS back in
# the lists' MRO, after their own margins, and the snapshots change.
class GrowingBulletList(MarkdownBulletList):
    async def _update_from_block(self, block: MarkdownBlock) -> None:
        if not await grow_list(self, block):
            await super()._update_from_block(block)


class GrowingOrderedList(MarkdownOrderedList):
    async def _update_from_block(self, block: MarkdownBlock) -> None:
        if not await grow_list(self, block):
            await super()._update_from_block(block)


class ReplyMarkdown(Markdown):
    """The Markdown widget a reply streams into."""

    BLOCKS = {**Markdown.BLOCKS, "bullet_list_open": GrowingBulletList, "ordered_list_open": GrowingOrderedList}

    def __init__(self) -> None:
        super().__init__(parser_factory=chat_markdown)

    async def add(self, text: str) -> None:
        await self.append(text)
        self.mark_last()

    async def replace(self, text: str) -> None:
        await self.update(text)
        self.mark_last()

    def mark_last(self) -> None:
        """The last block drops its bottom margin (app.tcss, `.last`). A class, not `:last-child`:
        a rule with an order pseudo-class makes Textual restyle every sibling's whole subtree on
        each mount, and with `*` it matched every widget of the app."""
        blocks = list(self.children)
        for block in blocks:
            block.set_class(block is blocks[-1], "last")
