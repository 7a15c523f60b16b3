"""`/copy [N]`: which reply, and its text as the transcript shows it.

Replies are numbered like the chat's turns: 1 is the first reply, and exchanges trimmed out of
the context still count (they are still on screen, dimmed). A negative N counts back from the
last: -1 is the last reply (the default), -2 the one before it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from model.errors import UserError

if TYPE_CHECKING:  # the TUI imports this module before its first frame: tiktoken must wait
    from model.chat_formats.templates import ChatTemplate
    from model.tokenizers.tokenizer import Tokenizer


def pick_reply(arg: str, count: int) -> int:
    """The 1-based number of the reply that `/copy ARG` means, out of `count` replies."""
    if count == 0:
        raise UserError("/copy: no reply to copy yet")
    if arg and not re.fullmatch(r"-?[0-9]+", arg):  # not int(): it also takes "1_0" and other scripts' digits
        raise UserError(f"/copy: N is a reply number (1 is the first, -1 the last), got {arg!r}")
    n = int(arg) if arg else -1
    if not (1 <= n <= count or -count <= n <= -1):
        raise UserError(f"/copy: there {'is 1 reply' if count == 1 else f'are {count} replies'}; "
                        f"N is 1 to {count}, or -1 to -{count} counting back")
    return n if n > 0 else count + 1 + n


def tool_markers(template: ChatTemplate, tok: Tokenizer) -> dict[str, str]:
    """The text of the template's calculator tokens by name (none for most families)."""
    return {name: tok.decode([i]) for name, i in (template.tool_tokens or {}).items()}


def reply_text(template: ChatTemplate, tok: Tokenizer, reply: str) -> str:
    """A reply's answer without its thinking and without nanochat's calculator spans
    (`<|python_start|>…<|output_end|>`): the transcript shows those apart, not as reply text."""
    answer = template.split_thinking(reply)[1]
    markers = tool_markers(template, tok)
    for start, end in (("python_start", "python_end"), ("output_start", "output_end")):
        if start in markers and end in markers:
            answer = re.sub(re.escape(markers[start]) + ".*?" + re.escape(markers[end]), "", answer, flags=re.S)
    return answer.strip("\n")
