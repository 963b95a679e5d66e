"""Text made safe to show on a terminal or a page: the one escaping rule (pure, no I/O).

A model, an endpoint, a transcript or a file name can hold characters that act instead of
showing: ESC and the C1 controls start terminal sequences (set the window title, erase or
conceal a line), CR and LF redraw or forge lines, bidi overrides and isolates reorder what
follows, and zero-width, soft-hyphen, variation-selector or filler characters hide
themselves. :func:`display_safe` replaces every such character with a visible escape:
``\\xNN`` (up to U+00FF), ``\\uNNNN`` or ``\\UNNNNNNNN``. The rule, exactly:

- every character of Unicode category C: the controls (C0, DEL and C1; tab, CR and LF
  included), format characters (Cf: bidi embeddings, overrides and isolates, zero-width
  characters, U+00AD, U+FEFF, tags), lone surrogates, private-use and unassigned code points;
- the line and paragraph separators (U+2028, U+2029);
- the other default-ignorable code points: U+034F, U+115F, U+1160, U+17B4, U+17B5,
  U+180B-U+180F, U+3164, U+FE00-U+FE0F, U+FFA0 and U+E0100-U+E01EF.

Everything else (letters of any script, combining accents, emoji, spaces, a literal
backslash) is kept, so an escaped text is unchanged by a second pass. The command applies it
to every line it writes; the text and HTML reports and the replay report to every line they
build.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

__all__ = ["display_safe"]

#: The default-ignorable code points outside category C: each is invisible where it stands.
_IGNORABLE: Final = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]"
)
#: Characters that Python calls unprintable but that show as blank space (kept).
_SPACE: Final = "Zs"


def _unsafe(char: str) -> bool:
    if char.isprintable():
        return _IGNORABLE.match(char) is not None
    return unicodedata.category(char) != _SPACE


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def display_safe(text: str) -> str:
    """``text`` with every character that could act on a terminal or reorder or hide text
    replaced by a visible escape (see the module's rule)."""
    if text.isprintable() and _IGNORABLE.search(text) is None:
        return text
    return "".join(_escape(char) if _unsafe(char) else char for char in text)
