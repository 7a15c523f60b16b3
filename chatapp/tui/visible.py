"""Text from the model, the user or the store, made safe to draw.

A terminal acts on control characters: ESC starts sequences that move the cursor, recolour
cells or retitle the window, and random or badly trained models emit them (random:tiny writes
\\x08 and \\x1f). Every string the TUI draws goes through `visible`, which swaps each control
character for its Unicode "control picture" (ESC becomes ␛), keeping newlines and tabs. It
maps one character to one, so a stream can be converted piece by piece.
"""

from __future__ import annotations

_PICTURES = {c: 0x2400 + c for c in range(0x20) if chr(c) not in "\n\t"}
_PICTURES[0x7F] = 0x2421                                  # DEL
_PICTURES.update({c: 0xFFFD for c in range(0x80, 0xA0)})  # C1 controls (0x9B is a one-byte CSI)


def visible(text: str) -> str:
    return text.translate(_PICTURES)
