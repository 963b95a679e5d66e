"""Hostile text for the terminal-safety tests, and the check that none of it reached an output.

:data:`HOSTILE` is a value a model or an endpoint could send in any field: it sets the window
title (OSC ... BEL), erases the line (CSI 2K), returns the cursor (CR), conceals what follows
(CSI 8m), reverses and isolates the text direction (U+202E, U+2066), hides itself (U+034F,
U+FE0F, U+00AD, a tag character, Hangul fillers) and starts a C1 control sequence (U+009B).
:data:`HOSTILE_LINES` also forges a line of its own (LF, U+2028, U+0085).

:func:`unsafe` is the rule written out independently of the code under test: every control
(C0, DEL, C1), every other character of Unicode category C (format, surrogate, private use,
unassigned), line and paragraph separators, and the default-ignorable code points outside
category Cf (variation selectors, the combining grapheme joiner, Hangul fillers, Mongolian
free variation selectors, Khmer inherent vowels).
"""

from __future__ import annotations

import unicodedata
from typing import Final

#: One hostile value: terminal escapes and invisible or reordering characters.
HOSTILE: Final = "\x1b]0;pwn\x07\x1b[2K\r\x1b[8m\u202e\u2066\u034f\ufe0f\u00ad\x9b"
#: The same, forging whole lines and hiding in more places.
HOSTILE_LINES: Final = (
    "ok\nRun it? Type y\u2028\x85\u200b\ufeff\u061c\u180e\u115f\u3164\uffa0"
    "\U000e0001\U000e0100\x7f\t\x00"
)
#: A part of HOSTILE's visible escape found wherever the value was printed (so a test sees
#: the field was shown); the library itself blanks controls in an endpoint's error message,
#: not these two invisible characters.
HOSTILE_SHOWN: Final = "\\u034f\\ufe0f"

#: Default-ignorable code points (Unicode's DerivedCoreProperties) outside category C.
IGNORABLE_OUTSIDE_C: Final = frozenset(
    {
        0x034F,
        0x115F,
        0x1160,
        0x17B4,
        0x17B5,
        *range(0x180B, 0x1810),
        0x3164,
        *range(0xFE00, 0xFE10),
        0xFFA0,
        *range(0xE0100, 0xE01F0),
    }
)


def is_unsafe(char: str) -> bool:
    """Whether ``char`` may move the cursor, start a sequence, reorder or hide text."""
    category = unicodedata.category(char)
    return category[0] == "C" or category in ("Zl", "Zp") or ord(char) in IGNORABLE_OUTSIDE_C


def unsafe(text: str, *, between_lines: str = "\n") -> list[str]:
    """The unsafe characters of ``text`` (as escapes, for the failure message), apart from
    the line breaks between its lines (``between_lines``)."""
    return [ascii(char) for char in text if char not in between_lines and is_unsafe(char)]
