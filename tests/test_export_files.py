"""/export: an attachment's fence gets its file's language, and its path is text above it
(the message built by the real Attachments.wrap, the export parsed by markdown-it, as Textual reads it)."""

from __future__ import annotations

from markdown_it import MarkdownIt

from chatapp.chat.attach import PASTED, Attachment, Attachments
from chatapp.store.export import ExportedChat, to_markdown


def fences(md: str) -> list[tuple[str, str]]:
    return [(t.info, t.content) for t in MarkdownIt().parse(md) if t.type == "fence"]


def test_exported_attachments_are_fenced_by_language_with_the_path_above():
    files = [Attachment("src/app util.py", "print('```')\n"), Attachment("notes/README", "plain\n"),
             Attachment(PASTED, "a paste\n")]
    user = Attachments(files).wrap("what do these do?\n\n```python\nmine = 1\n```")
    md = to_markdown(ExportedChat("t", "m", "", [(user, "they print", "", [])]))
    assert fences(md) == [("python", "print('```')\n"), ("", "plain\n"), ("", "a paste\n"),
                          ("python", "mine = 1\n")]  # the user's own fence is left as written
    assert "`src/app util.py`\n\n````python\n" in md
    assert "`notes/README`\n\n```\nplain" in md
    assert "pasted text\n\n```\na paste" in md
    assert "what do these do?" in md
