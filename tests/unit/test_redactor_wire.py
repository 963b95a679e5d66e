"""The key redactor's contracts, pinned exactly at their thresholds.

:class:`KeyRedactor` finds the key and every slice of it of :data:`MIN_KEY_SLICE`
characters or more, at a cost that never grows with the key (the long-key lookup), and
removes beginnings of the key that a cut left at the end of a text. Each test states one
of those promises and checks it on exact outputs, at every length and offset where a
search could slip: keys of MIN_KEY_SLICE and _SEARCHED_KEY_LENGTH characters and one more,
slices starting at each offset of an anchor stride, texts shorter than an anchor.
"""

from __future__ import annotations

import hashlib
from typing import Final

from metacrate_grid_agent._wire import (
    _ANCHOR,
    KeyRedactor,
)
from metacrate_grid_agent.config import REDACTED

#: Lowercase hex: its 6-character pieces are all distinct for the lengths used here, so a
#: slice of the key lines up with the key at one alignment only.
_HEX: Final = "".join(hashlib.sha256(f"key {i}".encode()).hexdigest() for i in range(20))
#: Neither a hex digit nor an escape: text around a slice that matches nothing.
_PAD: Final = "~"


def _key(size: int) -> str:
    key = _HEX[:size]
    pieces = [key[i : i + _ANCHOR] for i in range(len(key) - _ANCHOR + 1)]
    assert len(set(pieces)) == len(pieces)
    return key


def test_the_trailing_prefix_is_every_beginning_of_four_or_more_characters() -> None:
    """``trailing_prefix`` is the length of the key's beginning ending a text, if 4+ long."""
    key = _key(20)
    for length in range(len(key) + 1):
        expected = length if length >= 4 else 0
        assert KeyRedactor(key).trailing_prefix("x " + key[:length].upper()) == expected
        assert KeyRedactor(key).trailing_prefix(key[:length]) == expected
    assert KeyRedactor(key).trailing_prefix(key[:8] + "x") == 0


def test_the_trailing_prefix_is_the_longest_beginning() -> None:
    """Of two beginnings that end a text (a periodic key), the longer one counts."""
    assert KeyRedactor("abcdabcdabcdxyz").trailing_prefix("x abcdabcd") == 8
    assert KeyRedactor("aaaaaxyz").trailing_prefix("zzaaaaaa") == 5
    assert KeyRedactor("abcde").trailing_prefix("x abcd") == 4


def test_each_cut_beginning_followed_by_the_marker_or_the_end_is_replaced() -> None:
    """``cut_prefixes`` replaces every beginning of 4+ characters before the marker or the end."""
    key = _key(20)
    redactor = KeyRedactor(key)
    for length in range(1, len(key) + 1):
        piece = key[:length].upper()
        kept = length < 4
        assert redactor.cut_prefixes(f"a {piece}… b", "…") == (
            f"a {piece}… b" if kept else f"a {REDACTED}… b"
        )
        assert redactor.cut_prefixes(f"a {piece}", "…") == (
            f"a {piece}" if kept else f"a {REDACTED}"
        )
        assert redactor.cut_prefixes(f"a {piece}x… b", "…") == f"a {piece}x… b"


def test_every_cut_beginning_in_a_text_is_replaced() -> None:
    """Several cut beginnings, some not before a marker: exactly the marked ones go."""
    key = _key(20)
    text = f"{key[:4]}… {key[:9]}x {key[:6]}… {key}… {key[:5]}… {key[:7]}"
    expected = f"{REDACTED}… {key[:9]}x {REDACTED}… {REDACTED}… {REDACTED}… {REDACTED}"
    assert KeyRedactor(key).cut_prefixes(text, "…") == expected


def test_a_cut_beginning_inside_a_longer_look_alike_is_replaced() -> None:
    """A periodic key: the beginning that stops at the marker is found past a longer run."""
    assert KeyRedactor("abababxyz0123").cut_prefixes("abababab…", "…") == f"ab{REDACTED}…"
