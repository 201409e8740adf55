"""Printing text nobody here wrote without letting it drive the terminal.

Model output, tool results, error texts, cancel reasons and comments are stored
faithfully, escape sequences included. Printed raw, ``ESC ] 0 ; … BEL`` retitles
the terminal, ``ESC [ 2 J`` clears it and ``\\r`` overwrites a line with a fake
one. Rich does not remove these. ``SafeConsole`` removes them from every piece
of text it prints (its own styling codes are added afterwards and survive);
``strip_terminal`` does the same for the plain lines written to stderr.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

# ESC- and C1-introduced sequences: CSI (ESC [ or 0x9b), OSC/DCS/APC/PM/SOS strings
# (ending in BEL or ST, or unterminated), and two-character escapes.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]P^_X]|[\x90\x98\x9d-\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
)
# Any other control character but newline and tab, shown as U+FFFD so the reader
# sees something was there.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_terminal(text: str) -> str:
    """``text`` without terminal escape sequences and control characters
    (newlines and tabs kept)."""
    return _CONTROL.sub("\ufffd", _SEQUENCE.sub("", text))


class SafeConsole(Console):
    """A rich ``Console`` that strips terminal control from all text it renders."""

    def render(self, renderable: RenderableType,
               options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control:  # rich's own cursor moves (live displays)
                yield segment
            else:
                yield Segment(strip_terminal(segment.text), segment.style)


__all__ = ["SafeConsole", "strip_terminal"]
