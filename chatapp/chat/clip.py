"""`/copy [N]`: which reply (its text, the answer alone, is `kinds.answer_text`).

Replies are numbered like the chat's turns: 1 is the first reply, and exchanges trimmed out of
the context still count (they are still on screen, dimmed). A negative N counts back from the
last: -1 is the last reply (the default), -2 the one before it.
"""

from __future__ import annotations

import re

from model.errors import UserError


def pick_reply(arg: str, count: int, command: str = "/copy") -> int:
    """The 1-based number of the reply that `/copy ARG` (or `/raw ARG`) means, out of `count` replies."""
    if count == 0:
        raise UserError(f"{command}: no reply yet")
    if arg and not re.fullmatch(r"-?[0-9]+", arg):  # not int(): it also takes "1_0" and other scripts' digits
        raise UserError(f"{command}: N is a reply number (1 is the first, -1 the last), got {arg!r}")
    n = int(arg) if arg else -1
    if not (1 <= n <= count or -count <= n <= -1):
        raise UserError(f"{command}: there {'is 1 reply' if count == 1 else f'are {count} replies'}; "
                        f"N is 1 to {count}, or -1 to -{count} counting back")
    return n if n > 0 else count + 1 + n
