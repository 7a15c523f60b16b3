"""Terminal input that survives bytes which are not UTF-8.

Textual's POSIX driver decodes what the terminal sends as strict UTF-8, so a single stray
byte (xterm's 8-bit Meta mode sends Alt+key as one high byte; a Latin-1 paste) raises
UnicodeDecodeError in its input thread and the whole app exits, taking the half-typed
message with it. Decoding with replacement turns such a byte into U+FFFD instead.
"""

from __future__ import annotations

import codecs
from functools import partial


def lenient_terminal_input() -> None:
    """Make Textual's driver decode terminal input with errors="replace" (idempotent)."""
    try:
        from textual.drivers import linux_driver
    except ImportError:  # Windows: another driver, which reads text from the console API
        return
    # The driver builds its decoder at run time from this module-level name.
    linux_driver.getincrementaldecoder = lambda encoding: partial(codecs.getincrementaldecoder(encoding),
                                                                  errors="replace")
