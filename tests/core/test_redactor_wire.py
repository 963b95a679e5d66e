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
import json
import urllib.parse
from typing import Final, SupportsIndex

import pytest

from metacrate_grid_agent._core import _redact
from metacrate_grid_agent._core._redact import (
    _ANCHOR,
    _SEARCHED_KEY_LENGTH,
    _STRIDE,
    MIN_KEY_SLICE,
    KeyRedactor,
    redact,
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


THRESHOLD_SIZES: Final = sorted(
    {1, 5, _ANCHOR, MIN_KEY_SLICE - 1, MIN_KEY_SLICE, MIN_KEY_SLICE + 1}
    | {size for n in (2, 3) for size in (n * _STRIDE + _ANCHOR - 1, n * _STRIDE + _ANCHOR)}
    | {_SEARCHED_KEY_LENGTH - 1, _SEARCHED_KEY_LENGTH, _SEARCHED_KEY_LENGTH + 1}
    | {14 * _STRIDE + _ANCHOR - 1, 14 * _STRIDE + _ANCHOR, 160}
)


@pytest.mark.parametrize("size", THRESHOLD_SIZES)
def test_every_slice_of_the_threshold_length_is_redacted_exactly(size: int) -> None:
    """A slice of MIN_KEY_SLICE+ characters is replaced, exactly it; a shorter one stays.

    A key shorter than MIN_KEY_SLICE is redacted only whole. Every start in the key, and
    every offset of the slice in the text across one stride, so each anchor of the key and
    each looked-up position of the text is the only one a slice holds at least once. The
    character before a slice that starts the key is the key's last (an extension must not
    wrap around the key; a short key is searched for whole, so it has no such rule); the
    text goes on after the slice (nor may an extension run past its end), and ends with
    the key's character before the slice (nor wrap around the text).
    """
    key = _key(size)
    redactor = KeyRedactor(key)
    least = min(size, MIN_KEY_SLICE)
    for start in range(size):
        lengths = {least - 1, least, least + 1, size - start}
        for length in sorted(n for n in lengths if 0 < n <= size - start):
            piece = key[start : start + length]
            for lead in range(_STRIDE + 1):
                before, after = _PAD * lead, _PAD + (key[start - 1] if start else _PAD)
                if start == 0 and lead and size > MIN_KEY_SLICE:
                    before = before[:-1] + key[-1]
                text = before + piece + after
                expected = before + REDACTED + after if length >= least else text
                assert redactor.redact(text) == expected, (start, length, lead)


@pytest.mark.parametrize("size", [MIN_KEY_SLICE + 8, _SEARCHED_KEY_LENGTH + 1, 160])
def test_a_slice_that_ends_the_text_is_redacted_exactly(size: int) -> None:
    """The key's last characters ending a text: 12 or more go, exactly; 11 stay.

    At every offset across a stride, so the text's last, shorter piece falls on a
    looked-up position: no extension may count characters past the text's end.
    """
    key = _key(size)
    for lead in range(_STRIDE + 1):
        for length in (MIN_KEY_SLICE - 1, MIN_KEY_SLICE, MIN_KEY_SLICE + 1):
            text = _PAD * lead + key[-length:]
            expected = _PAD * lead + REDACTED if length >= MIN_KEY_SLICE else text
            assert KeyRedactor(key).redact(text) == expected, (lead, length)


def test_a_text_shorter_than_an_anchor_shows_no_slice() -> None:
    """Texts of fewer than _ANCHOR characters are searched without fault and kept."""
    for size in (MIN_KEY_SLICE + 8, _SEARCHED_KEY_LENGTH + 8):
        key = _key(size)
        for length in range(_ANCHOR):
            assert KeyRedactor(key).redact(key[:length]) == key[:length]


@pytest.mark.parametrize("size", [10, 40, _SEARCHED_KEY_LENGTH + 24])
def test_every_occurrence_of_every_slice_is_redacted(size: int) -> None:
    """Repeated and distinct slices in one text are each replaced, wherever they stand."""
    key = _key(size)
    first, second = key[: min(size, 15)], key[-min(size, 13) :]
    text = f"{first} a {second} b {first} c {first}"
    assert KeyRedactor(key).redact(text) == f"{REDACTED} a {REDACTED} b {REDACTED} c {REDACTED}"


def test_overlapping_occurrences_of_a_short_key_are_redacted_together() -> None:
    """A short key found at two overlapping places: the union of both is replaced."""
    assert KeyRedactor("aaaaaaaaaa").redact("x aaaaaaaaaaa y") == f"x {REDACTED} y"


def test_an_anchor_found_twice_in_a_row_is_tried_at_each_place() -> None:
    """A periodic anchor seen at consecutive places: the place that lines up is found."""
    key = "aaaaaa" + _key(34)
    assert KeyRedactor(key).redact("~a" + key[:MIN_KEY_SLICE] + "~") == f"~a{REDACTED}~"


def test_touching_slices_are_replaced_by_one_marker() -> None:
    """Two slices with no gap between them are one redacted span, shown as one marker."""
    key = _key(40)
    assert KeyRedactor(key).redact(f"a {key[:12]}{key[25:37]} b") == f"a {REDACTED} b"


class _Counted(str):
    """A text that counts the searches made in it and the slices taken of it."""

    finds: int
    slices: int

    def find(
        self, sub: str, start: SupportsIndex | None = None, end: SupportsIndex | None = None, /
    ) -> int:
        self.finds += 1
        return super().find(sub, start, end)

    def __getitem__(self, index: SupportsIndex | slice) -> str:
        self.slices += 1
        return super().__getitem__(index)


def _cost(text: str, key: str) -> tuple[int, int]:
    counted = _Counted(text)
    counted.finds = counted.slices = 0
    KeyRedactor._matches(counted, key)
    return counted.finds, counted.slices


#: Clean text: nothing in it is a hex digit, so no anchor of a hex key is ever found.
_CLEAN: Final = "the endpoint said nothing of interest; " * 30


@pytest.mark.parametrize("size", [MIN_KEY_SLICE + 1, 4 * _STRIDE + _ANCHOR, _SEARCHED_KEY_LENGTH])
def test_a_key_up_to_the_searched_length_costs_one_search_per_anchor(size: int) -> None:
    """Anchors at each multiple of _STRIDE in the key are searched for, one find each."""
    anchors = (size - _ANCHOR) // _STRIDE + 1
    assert _cost(_CLEAN, _key(size)) == (anchors, 0)


def test_a_longer_key_costs_one_lookup_per_stride_of_text_whatever_its_length() -> None:
    """Beyond _SEARCHED_KEY_LENGTH, the text is sliced once per _STRIDE and never searched."""
    per_stride = -(-len(_CLEAN) // _STRIDE)
    for size in (_SEARCHED_KEY_LENGTH + 1, 200, 1200):
        assert _cost(_CLEAN, _key(size)) == (0, per_stride)


def test_positions_are_mapped_only_when_a_changed_form_shows_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blanks and escapes without the key never reach the slow position mapping.

    An endpoint can fill a body with escapes; only a real echo of the key, which it
    cannot make without knowing the key, pays for mapping positions back.
    """
    mapped: list[str] = []

    def counting(text: str, pattern: object) -> object:
        mapped.append(text)
        return None

    monkeypatch.setattr(_redact, "_mapped", counting)
    key = _key(40)
    texts = (
        "a b\tc",
        "\\n%41&amp; \\u0041",
        "%2541 twice",
        "no escape",
        key[:11] + " " + key[20:31],
    )
    for text in texts:
        assert KeyRedactor(key).redact(text) == text
    assert mapped == []


def test_a_secret_with_spaces_is_found_with_blanks_dropped_on_both_sides() -> None:
    """A secret holding spaces, echoed with other blanks in their place, is found whole."""
    secret = "correct horse battery staple"
    text = "said correct horse\nbattery\u200bstaple here"
    assert redact(text, redactor=KeyRedactor(secret)) == f"said {REDACTED} here"


def test_an_echo_with_one_escape_is_redacted_whole() -> None:
    """One escaped character in an echo is decoded: the whole echo goes, not its tail."""
    key = "zq9#key-0123456789abcdef"
    assert redact(f"x {key.replace('#', '%23')} y", redactor=KeyRedactor(key)) == f"x {REDACTED} y"


def test_a_slice_ending_after_the_last_escape_is_redacted_up_to_its_end() -> None:
    """A span that ends in plain text after an escape maps back to its last character."""
    key = "zq9#key-0123456789abcdef"
    text = "x zq9%23key-0123 y"
    assert redact(text, redactor=KeyRedactor(key)) == f"x {REDACTED} y"


def test_an_echo_starting_the_text_with_a_plain_character_is_redacted_from_it() -> None:
    """Positions before the first escape map back one to one, from the text's start."""
    key = "zq9#key-0123456789abcdef"
    text = key[0] + "".join(f"%{ord(c):02x}" for c in key[1:])
    assert redact(text, redactor=KeyRedactor(key)) == REDACTED


def test_a_key_holding_escapes_is_found_as_sent_and_decoded_in_one_text() -> None:
    """An echo as sent and an escaped one, side by side: both are redacted."""
    key = "pct%41key/?&=#+7f3a9c1e5b2d"
    text = key + "," + urllib.parse.quote(key, safe="")
    assert redact(text, redactor=KeyRedactor(key)) == f"{REDACTED},{REDACTED}"


def test_a_json_escaped_line_break_inside_an_echo_is_dropped() -> None:
    """``\\n`` decodes to a line break, a blank: the two halves join and go as one."""
    key = _key(30)
    echo = json.dumps(key[:10] + "\n" + key[10:])
    assert redact(echo, redactor=KeyRedactor(key)) == f'"{REDACTED}"'


@pytest.mark.parametrize("letter", ["x", "u", "U"])
def test_a_backslash_before_a_code_letter_without_digits_is_that_letter(letter: str) -> None:
    """``\\x``, ``\\u`` or ``\\U`` not followed by hex digits stands for the letter."""
    key = f"ma{letter}-power-0123456789"
    text = f"ma\\{letter}-power-0123456789"
    assert redact(f"a {text} b", redactor=KeyRedactor(key)) == f"a {REDACTED} b"


def test_an_escape_beyond_unicode_is_kept_as_it_is() -> None:
    """``\\U00110000`` names no character: it is left alone, and nothing fails."""
    for code in ("\\U00110000", "\\UFFFFFFFF"):
        text = f"a {code} b"
        assert redact(text, redactor=KeyRedactor(_key(20))) == text
    assert redact("\\U0010FFFF" * 3, redactor=KeyRedactor("\U0010ffff" * 3)) == REDACTED


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


#: Unicode 15.1's default-ignorable code points and format characters (category Cf), from
#: DerivedCoreProperties.txt and DerivedGeneralCategory.txt, inclusive ranges.
_INVISIBLE: Final = [
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x0600, 0x0605), (0x061C, 0x061C),
    (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2),
    (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F),
    (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
]  # fmt: skip
#: Every code point, in one text (surrogates included: a str may hold them).
_EVERY_CHARACTER: Final = "".join(map(chr, range(0x110000)))


def test_the_blanks_are_whitespace_controls_and_every_invisible_character() -> None:
    """Dropped when looking for the key: whitespace, the C0 and C1 controls, and every
    character a reader does not see; nothing else. The pattern and the drop table agree,
    and every format character of this interpreter's Unicode database is among them."""
    import unicodedata

    expected = {c for c in range(0x110000) if chr(c).isspace()}
    expected |= {*range(0x20), *range(0x7F, 0xA0)}
    expected |= {c for first, last in _INVISIBLE for c in range(first, last + 1)}
    matched = {
        c for m in _redact._BLANK.finditer(_EVERY_CHARACTER) for c in range(m.start(), m.end())
    }
    assert expected == matched
    assert expected == set(_redact._DROP_BLANKS)
    assert set(_redact._DROP_BLANKS.values()) == {None}
    formats = {c for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"}
    assert formats <= matched
