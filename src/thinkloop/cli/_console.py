"""The CLI's console: text from runs is shown, never obeyed by the terminal.

A model's answer, a tool's output (a file it read, a command's output) or a goal may hold terminal control
sequences — `ESC ] 52` writes the clipboard in many terminals, `ESC [ 2J` clears the screen, a carriage
return or U+202E (right-to-left override) hides text from the person approving a call. Every string the
CLI prints goes through `printable()`, which shows such characters as escapes (`\\x1b`, `\\u202e`) instead.
"""

from __future__ import annotations

from typing import Any

import rich.console
from rich.text import Text

_CONTROL = {
    code: f"\\x{code:02x}"
    for code in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0))  # all but \t and \n
}
_CONTROL.update({code: f"\\u{code:04x}" for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))})  # bidi


def printable(text: str) -> str:
    """`text` with terminal control characters (and bidirectional overrides) shown as escapes."""
    return text if text.isprintable() else text.translate(_CONTROL)


class Console(rich.console.Console):
    """A rich console whose every string (printed, in a panel or a table cell) is made `printable()` first
    — markup is thinkloop's own and holds no control characters."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(printable(text), **kwargs)
