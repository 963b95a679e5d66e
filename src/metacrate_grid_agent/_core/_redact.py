"""Redaction, bounding and display safety: every rule that makes a text safe to keep or show.

Rule 1: this module never awaits, never reads a clock and never touches a socket. Every
other module that records, quotes or shows text it did not write itself comes here:

* redaction: :class:`KeyRedactor` finds the key in every form an echo of it takes;
  :func:`redact` replaces it and anything shaped like a credential, keeping the layout;
  :func:`scrub` does the same and makes the text one short line, for error messages.
* bounding: :func:`bounded_text` cuts a text to a byte bound, marked with the library's one
  :data:`TRUNCATION_MARKER`; :func:`shortened` cuts to a character bound, marked with "…";
  :func:`valid_text` makes any text serialisable (lone surrogates become "?").
* :class:`ContentGuard`: for the sinks (tracing, the session transcript), redacts first and
  then bounds, so a cut never shows part of a key and no record grows without a cap.
* display safety: :func:`display_safe`, the one escaping rule for text shown on a terminal
  or a page.
"""

from __future__ import annotations

import html
import json
import re
import unicodedata
from typing import Final, NoReturn, TypeAlias

from metacrate_grid_agent.config import REDACTED, Secret

__all__ = [
    "EXCERPT_LIMIT",
    "MAX_CLEAR_TEXTS",
    "MAX_SCRUB_CHARS",
    "MIN_KEY_SLICE",
    "NO_KEY",
    "TRUNCATION_MARKER",
    "ContentGuard",
    "KeyRedactor",
    "bounded_text",
    "display_safe",
    "drop_partial_token",
    "redact",
    "scrub",
    "shortened",
    "valid_text",
]

#: Longest excerpt :func:`scrub` keeps unless told otherwise: of an unrecognised error body,
#: and of an error ``type`` or ``code``.
EXCERPT_LIMIT: Final = 200
#: Characters :func:`scrub` examines; anything longer is cut first (at a token boundary).
MAX_SCRUB_CHARS: Final = 64 * 1024
#: Marks where a text was cut to its byte bound: the library's one truncation marker (an
#: observation, arguments, a transcript field; after a space where the text runs on).
TRUNCATION_MARKER: Final = "… [truncated]"


# --- redaction ------------------------------------------------------------------------------

_CREDENTIAL: Final = re.compile(
    r"(?P<scheme>\b(?i:bearer)\s+)[A-Za-z0-9._~+/=-]{8,}"
    r"|(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{8,}"  # OpenAI, Anthropic, OpenRouter, DeepSeek
    r"|\bAIza[0-9A-Za-z_-]{30,}"  # Google
    r"|\b(?:hf_|gsk_|xai-)[A-Za-z0-9]{20,}"  # Hugging Face, Groq, xAI
)
# Characters a reader does not see, which an echo may hide between the key's characters:
# Unicode's default-ignorable code points (soft hyphen, joiners, variation selectors, the
# Mongolian vowel separator, Hangul fillers, tags) and every format character (Cf), as of
# Unicode 15.1; first and last of each run.
_INVISIBLE: Final = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x0600, 0x0605), (0x061C, 0x061C),
    (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2),
    (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F),
    (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)  # fmt: skip
# Blanks: whitespace, the C0 and C1 controls, and the invisible characters.
_BLANK_CHARS: Final = "\\s\x00-\x1f\x7f-\x9f" + "".join(
    f"\\U{first:08x}-\\U{last:08x}" for first, last in _INVISIBLE
)
_BLANK: Final = re.compile(f"[{_BLANK_CHARS}]+")
# A key is printable ASCII without spaces (the configuration insists), so a cut that may
# split one drops the whole trailing run of such characters.
_NOT_KEY_CHAR: Final = re.compile(r"[^\x21-\x7e]")
# Blanks a server or a reader may insert into an echo (every character _BLANK matches:
# Unicode whitespace ends at U+3000), dropped at C speed by str.translate.
_DROP_BLANKS: Final = {
    c: None
    for c in (*range(0x3100), *(c for first, last in _INVISIBLE for c in range(first, last + 1)))
    if _BLANK.match(chr(c))
}
# What an echo of the key may be wrapped in: backslash escapes (JSON, repr, C), percent
# escapes (URLs) and HTML character references.
_ESCAPE: Final = re.compile(
    r"\\(?:u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|x[0-9a-fA-F]{2}|.)"
    r"|%[0-9a-fA-F]{2}"
    r"|&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?",
    re.DOTALL,
)
_BACKSLASH_ESCAPES: Final = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "0": "\0"}
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

#: Shortest piece of the key redacted wherever it appears (a whole key shorter than this
#: is redacted only whole): a slice this long of a random key identifies it.
MIN_KEY_SLICE: Final = 12
#: Shortest beginning of the key removed where a text ends (a cut may stop inside it).
_MIN_KEY_PREFIX: Final = 4
#: Length of the anchors, the pieces of the key looked for first.
_ANCHOR: Final = MIN_KEY_SLICE // 2
#: Distance between the anchors used: a span of MIN_KEY_SLICE characters has this many
#: places where a piece of _ANCHOR characters fits whole, one of them a multiple of it. So a
#: slice of the key that long holds a whole anchor, and a span of a text a whole piece
#: looked up; no longer stride would do.
_STRIDE: Final = MIN_KEY_SLICE - _ANCHOR + 1
#: Longest key whose anchors are searched for; a longer key's are looked up instead.
_SEARCHED_KEY_LENGTH: Final = 96
#: Decoding rounds for echoes escaped more than once (a repr of a JSON string).
_DECODE_ROUNDS: Final = 2
#: Plain texts a redactor remembers as clear of the key (a reply's model, the same on every
#: reply, is searched once); past this many it forgets them all and starts again.
MAX_CLEAR_TEXTS: Final = 64


_Mapped: TypeAlias = tuple[str, list[int], list[int]]


def _mapped(text: str, pattern: re.Pattern[str]) -> _Mapped | None:
    """``text`` with each match of ``pattern`` decoded, and where each character came from.

    Returns the new text and, for its character ``i``, the span ``starts[i]:ends[i]`` of
    ``text`` it came from; None when nothing matched. Only run once a cheap test (the same
    decoding, without positions) found the key, so its cost is never the endpoint's to set.
    """
    pieces: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    pos = 0
    for match in pattern.finditer(text):
        begin, end = match.span()
        pieces.append(text[pos:begin])
        starts.extend(range(pos, begin))
        ends.extend(range(pos + 1, begin + 1))
        pos = end
        char = _plain_token(match)
        pieces.append(char)
        starts.extend([begin] * len(char))
        ends.extend([end] * len(char))
    if not pieces:
        return None
    pieces.append(text[pos:])
    starts.extend(range(pos, len(text)))
    ends.extend(range(pos + 1, len(text) + 1))
    return "".join(pieces), starts, ends


def _decode_one(token: str) -> str:
    """The text one escape stands for."""
    lead = token[0]
    if lead == "\\":
        if len(token) == 2:  # a backslash and one character
            return _BACKSLASH_ESCAPES.get(token[1], token[1])
        code = int(token[2:], 16)  # \xHH, \uHHHH or \UHHHHHHHH
        return chr(code) if code < 0x110000 else token  # chr takes U+0000 to U+10FFFF
    if lead == "%":
        return chr(int(token[1:], 16))
    if lead == "&":
        return html.unescape(token)
    return ""  # a blank


def _plain_token(match: re.Match[str]) -> str:
    """What one escape (or blank) decodes to, blanks dropped."""
    return _decode_one(match[0]).translate(_DROP_BLANKS)


class KeyRedactor:
    """Finds the key in texts, in every form an echo of it takes, and redacts it.

    The functions of this module take one of these instead of the key itself, so no frame
    of theirs holds the key as a local: a tool that records a traceback's locals shows only
    this object's repr, which is redacted. It refuses to be pickled.

    Found, case-insensitively: the key; any slice of it of :data:`MIN_KEY_SLICE` characters
    or more (a whole key when it is shorter); both in the text as it is, with blanks dropped
    (a key split by a line break or by characters a reader does not see: zero-width spaces,
    soft hyphens, variation selectors, any format character), and with backslash, percent
    and HTML escapes decoded (a key quoted by ``repr``, JSON, a URL or an HTML page).
    """

    __slots__ = ("_clear", "_folded", "_solid")

    def __init__(self, key: str | None) -> None:
        self._folded = (key or "").translate(_ASCII_LOWER)
        self._solid = _BLANK.sub("", self._folded)
        # Plain texts found clear (see leaves_plain): the answer for them never changes.
        self._clear: set[str] = set()

    def __repr__(self) -> str:
        return f"KeyRedactor({REDACTED!r})" if self._folded else "KeyRedactor(None)"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a KeyRedactor holds the credential; it cannot be pickled")

    def __bool__(self) -> bool:
        return bool(self._folded)

    def redact(self, text: str) -> str:
        """``text`` with every piece of the key found replaced by :data:`REDACTED`."""
        if not self._folded or not text:
            return text
        spans = self._spans(text)
        if not spans:
            return text
        kept: list[str] = []
        pos = 0
        for begin, end in spans:
            kept.append(text[pos:begin] + REDACTED)
            pos = end
        kept.append(text[pos:])
        return "".join(kept)

    def shows_key(self, text: str) -> bool:
        """Whether ``text`` holds the whole key, as it is (case-insensitively)."""
        if not self._folded:
            return False
        # For ASCII text, lower() is the ASCII fold, about twenty times faster than translate.
        folded = text.lower() if text.isascii() else text.translate(_ASCII_LOWER)
        return self._folded in folded

    def trailing_prefix(self, text: str) -> int:
        """Length of the longest beginning of the key (4+ characters) ending ``text``.

        The whole key counts; a key of four characters or fewer has no such beginning.
        """
        folded = self._folded
        if len(folded) <= _MIN_KEY_PREFIX:
            return 0
        tail = text[-len(folded) :].translate(_ASCII_LOWER)
        start = tail.find(folded[:_MIN_KEY_PREFIX])
        while start >= 0:
            if folded.startswith(tail[start:]):
                return len(tail) - start
            start = tail.find(folded[:_MIN_KEY_PREFIX], start + 1)
        return 0

    def cut_prefixes(self, text: str, marker: str) -> str:
        """Replace each beginning of the key (4+ characters) followed by ``marker`` or the end.

        For texts an earlier bound cut inside the key and marked the cut with ``marker`` (not
        empty): each piece of ``text`` between markers loses its :meth:`trailing_prefix`.
        """
        pieces = text.split(marker)
        for index, piece in enumerate(pieces):
            if size := self.trailing_prefix(piece):
                pieces[index] = piece[: len(piece) - size] + REDACTED
        return marker.join(pieces)

    def leaves_plain(self, text: str) -> bool:
        """Whether :func:`scrub` returns ``text`` as it is, for a plain text, at C speed.

        True only for a text of printable ASCII without space, backslash, percent or
        ampersand (no blank, no escape: the changed forms :meth:`redact` looks at are the
        text itself) in which the key, a slice of it, a beginning of it at the end, and a
        credential shape are all absent: every change :func:`scrub` could make.
        """
        clear = self._clear
        if text in clear:
            return True
        if _PLAIN.fullmatch(text) is None or _CREDENTIAL.search(text) is not None:
            return False
        folded = self._folded
        # ASCII, so lower() folds exactly as the translation to _ASCII_LOWER does.
        if folded and (self._matches(text.lower(), folded) or self.trailing_prefix(text)):
            return False
        if len(clear) >= MAX_CLEAR_TEXTS:
            clear.clear()
        clear.add(text)
        return True

    def remembered(self) -> int:
        """How many plain texts it remembers as clear (at most :data:`MAX_CLEAR_TEXTS`)."""
        return len(self._clear)

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """The merged spans of ``text`` that show the key or a slice of it."""
        found = self._matches(text.translate(_ASCII_LOWER), self._folded)
        if self._decoded_hit(text):
            found += self._decoded_spans(text)
        found.sort()
        merged: list[tuple[int, int]] = []
        for begin, end in found:
            if merged and begin <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((begin, end))
        return merged

    def _decoded_hit(self, text: str) -> bool:
        """Whether a changed form of ``text`` shows a slice of the key (no position kept).

        The forms: blanks dropped, then escapes decoded (twice, for an echo escaped twice).
        The cheap test, at C speed but for one call per escape: positions are worked out
        only on a hit, which an endpoint cannot cause without knowing the key.
        """
        source = text.translate(_DROP_BLANKS)
        if len(source) != len(text) and self._matches(source.translate(_ASCII_LOWER), self._solid):
            return True
        for _ in range(_DECODE_ROUNDS):
            plain, count = _ESCAPE.subn(_plain_token, source)
            if count == 0:
                return False
            if self._matches(plain.translate(_ASCII_LOWER), self._solid):
                return True
            source = plain
        return False

    def _decoded_spans(self, text: str) -> list[tuple[int, int]]:
        """Spans of ``text`` whose changed forms (see :meth:`_decoded_hit`) show the key."""
        found: list[tuple[int, int]] = []
        source, starts = text, list(range(len(text)))
        ends = [i + 1 for i in starts]
        for pattern in (_BLANK, *(_ESCAPE,) * _DECODE_ROUNDS):
            mapped = _mapped(source, pattern)
            if mapped is None:
                continue
            source, inner_starts, inner_ends = mapped
            starts = [starts[i] for i in inner_starts]
            ends = [ends[i - 1] for i in inner_ends]
            for begin, end in self._matches(source.translate(_ASCII_LOWER), self._solid):
                found.append((starts[begin], ends[end - 1]))
        return found

    @staticmethod
    def _matches(text: str, key: str) -> list[tuple[int, int]]:
        """Spans of ``text`` equal to a slice of ``key`` of MIN_KEY_SLICE characters or more.

        A key of MIN_KEY_SLICE characters or fewer is searched for whole. A longer key's slice
        holds the anchor at a multiple of _STRIDE in the key, and covers the piece at a
        multiple of _STRIDE in the text: a key of up to _SEARCHED_KEY_LENGTH characters has
        those anchors searched for (one ``str.find`` each, at C speed, and one more per hit);
        a longer key's anchors are indexed, and the piece at each multiple of _STRIDE of the
        text looked up (one slice each), so the cost never grows with the key. A hit is
        extended both ways as far as text and key agree at that alignment. Both arguments
        are already case-folded.
        """
        if not key:
            return []
        spans: list[tuple[int, int]] = []
        if len(key) <= MIN_KEY_SLICE:
            start = text.find(key)
            while start != -1:
                spans.append((start, start + len(key)))
                start = text.find(key, start + 1)
            return spans
        if len(key) <= _SEARCHED_KEY_LENGTH:
            for offset in range(0, len(key) - _ANCHOR + 1, _STRIDE):
                anchor = key[offset : offset + _ANCHOR]
                hit = text.find(anchor)
                while hit != -1:
                    spans += _extend(text, key, hit, offset)
                    hit = text.find(anchor, hit + 1)
            return spans
        index: dict[str, list[int]] = {}
        for offset in range(len(key) - _ANCHOR + 1):
            index.setdefault(key[offset : offset + _ANCHOR], []).append(offset)
        for hit in range(0, len(text), _STRIDE):  # a short last piece is in no index
            for offset in index.get(text[hit : hit + _ANCHOR], ()):
                spans += _extend(text, key, hit, offset)
        return spans


def _extend(text: str, key: str, hit: int, offset: int) -> list[tuple[int, int]]:
    """The span around ``text[hit:]`` that agrees with ``key`` aligned at ``offset``."""
    shift = hit - offset  # where key[0] would sit in text
    begin, end = hit, hit + _ANCHOR
    while begin > 0 and begin - shift > 0 and text[begin - 1] == key[begin - 1 - shift]:
        begin -= 1
    while end < len(text) and end - shift < len(key) and text[end] == key[end - shift]:
        end += 1
    return [(begin, end)] if end - begin >= MIN_KEY_SLICE else []


#: The redactor of a call made without a key: only credential shapes are redacted.
NO_KEY: Final = KeyRedactor(None)


def drop_partial_token(text: str) -> str:
    """Cut the trailing run of key characters, which a truncation may have split."""
    found = _NOT_KEY_CHAR.search(text[::-1])
    return "" if found is None else text[: len(text) - found.start()]


def _drop_key_prefix(text: str, redactor: KeyRedactor) -> str:
    """Remove a trailing beginning of the key: the text may have been cut inside it."""
    if (size := redactor.trailing_prefix(text)) == 0:
        return text
    return text[: len(text) - size].rstrip()


def redact(text: str, *, redactor: KeyRedactor) -> str:
    """``text`` with the key and credential-shaped text replaced, nothing else changed.

    For messages the library writes itself, which may quote a short piece of what the
    endpoint sent; unlike :func:`scrub` it keeps the layout and does not cut.
    """
    text = _CREDENTIAL.sub(lambda m: (m["scheme"] or "") + REDACTED, redactor.redact(text))
    return _drop_key_prefix(text, redactor)


# Texts that no step of scrub() but redaction can change: printable ASCII without space,
# backslash, percent or ampersand, so there is no blank to drop or collapse, no control, and
# no escape to decode (every changed form of such a text is the text itself).
_PLAIN: Final = re.compile(r"[\x21-\x24\x27-\x5b\x5d-\x7e]*")


def scrub(text: str, *, redactor: KeyRedactor, limit: int = EXCERPT_LIMIT) -> str:
    """``text`` made safe to show: no key, no credential, one line, at most ``limit`` chars.

    Replaces the key (in every form :class:`KeyRedactor` finds) and anything shaped like a
    bearer token or an API key with ``[REDACTED]``, turns control characters and line
    breaks into spaces, collapses whitespace, then cuts to ``limit`` characters ending in
    "…". Redaction runs on the whole text before any cut, so a cut never shows part of a
    key; and a text that ends with the beginning of the key (say, a body cut short by its
    reader) loses that beginning. ``limit`` must be positive.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    size = len(text)
    if size <= limit and size <= MAX_SCRUB_CHARS and redactor.leaves_plain(text):
        return text  # a reply's id or model, nearly always: the same as the steps below
    return _scrub_whole(text, redactor=redactor, limit=limit)


def _scrub_whole(text: str, *, redactor: KeyRedactor, limit: int) -> str:
    """:func:`scrub` without its shortcut for plain texts (which gives the same result)."""
    if len(text) > MAX_SCRUB_CHARS:
        text = drop_partial_token(text[:MAX_SCRUB_CHARS])
    text = _BLANK.sub(" ", redact(text, redactor=redactor)).strip()
    text = _drop_key_prefix(text, redactor)
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    if redactor.shows_key(text):  # only when the key is part of the marker or "…"
        return ""
    return text


# --- bounding -------------------------------------------------------------------------------


def valid_text(text: str) -> str:
    """``text`` as valid UTF-8: lone surrogates become "?" (application text, any source)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode(errors="replace").decode()
    return text


def bounded_text(
    text: str, limit: int, *, marker: str = " " + TRUNCATION_MARKER, bare_head: bool = False
) -> str:
    """``text`` as valid UTF-8 cut to at most ``limit`` bytes, ending with ``marker`` if cut.

    Lone surrogates (text decoded leniently by an executor) become "?", so the result
    always serialises. A cut never splits a character. When no text fits before the
    marker, the result is the marker alone if it fits, else empty; with ``bare_head``, it is
    the first ``limit`` bytes of the text instead, unmarked.
    """
    try:
        data = text.encode()
    except UnicodeEncodeError:
        text = text.encode(errors="replace").decode()
        data = text.encode()
    if len(data) <= limit:
        return text
    tail = marker.encode()
    if bare_head and limit <= len(tail):
        return data[:limit].decode(errors="ignore")
    keep = max(0, limit - len(tail))
    cut = data[:keep].decode(errors="ignore")
    return cut + marker if len(tail) <= limit else cut


def shortened(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in "…" when cut."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


# --- the sinks' guard -----------------------------------------------------------------------

#: Characters of a text looked at before redaction, per byte of its bound (UTF-8 is at most
#: four bytes a character, so this never cuts text the bound would have kept).
_CHARS_PER_BYTE: Final = 4


class ContentGuard:
    """Redacts the key and credential-shaped text, then bounds, every text it is given.

    The tracing sink and the session transcript record text that came from the endpoint or
    the executor (replies, arguments, observations, error messages); each piece passes
    through here first.
    """

    __slots__ = ("_in_json", "_key_length", "_redactor")

    def __init__(self, secret: Secret | str | None) -> None:
        value = secret.reveal() if isinstance(secret, Secret) else secret
        self._redactor = KeyRedactor(value or None)
        self._key_length = len(value or "")
        # The key as it stands inside an encoded JSON string (a quote or a backslash in it
        # escaped): what contains_secret_json looks for.
        escaped = json.dumps(value or "")[1:-1]
        self._in_json = self._redactor if escaped == (value or "") else KeyRedactor(escaped)

    def __repr__(self) -> str:
        return "ContentGuard(<secret hidden>)"

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a ContentGuard holds a key and does not pickle")

    def text(self, text: str, limit: int) -> str:
        """``text`` redacted, then cut to at most ``limit`` UTF-8 bytes (with a cut marker)."""
        head = text[: limit * _CHARS_PER_BYTE + self._key_length]
        clean = redact(head, redactor=self._redactor)
        cut = bounded_text(clean, limit)
        if self._redactor.shows_key(cut):
            return ""  # pragma: no cover - redaction replaced every occurrence before the cut
        return cut

    def contains_secret(self, text: str) -> bool:
        """Whether ``text`` holds the key (case-insensitively, as the redaction matches it)."""
        return self._redactor.shows_key(text)

    def contains_secret_json(self, encoded: str) -> bool:
        """Whether JSON text ``encoded`` holds the key in one of its strings, as JSON writes
        it there (a key holding a quote or a backslash stands escaped)."""
        return self._in_json.shows_key(encoded)


# --- display safety -------------------------------------------------------------------------

#: The default-ignorable code points outside category C: each is invisible where it stands.
_IGNORABLE: Final = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]"
)
#: Characters that Python calls unprintable but that show as blank space (kept).
_SPACE_CATEGORY: Final = "Zs"


def _unsafe(char: str) -> bool:
    if char.isprintable():
        return _IGNORABLE.match(char) is not None
    return unicodedata.category(char) != _SPACE_CATEGORY


def _visible_escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def display_safe(text: str) -> str:
    """``text`` with every character that could act on a terminal, or reorder or hide text,
    replaced by a visible escape.

    A model, an endpoint, a transcript or a file name can hold characters that act instead
    of showing: ESC and the C1 controls start terminal sequences (set the window title, erase
    or conceal a line), CR and LF redraw or forge lines, bidi overrides and isolates reorder
    what follows, and zero-width, soft-hyphen, variation-selector or filler characters hide
    themselves. Each such character becomes ``\\xNN`` (up to U+00FF), ``\\uNNNN`` or
    ``\\UNNNNNNNN``. The rule, exactly:

    - every character of Unicode category C: the controls (C0, DEL and C1; tab, CR and LF
      included), format characters (Cf: bidi embeddings, overrides and isolates, zero-width
      characters, U+00AD, U+FEFF, tags), lone surrogates, private-use and unassigned code
      points;
    - the line and paragraph separators (U+2028, U+2029);
    - the other default-ignorable code points: U+034F, U+115F, U+1160, U+17B4, U+17B5,
      U+180B-U+180F, U+3164, U+FE00-U+FE0F, U+FFA0 and U+E0100-U+E01EF.

    Everything else (letters of any script, combining accents, emoji, spaces, a literal
    backslash) is kept, so an escaped text is unchanged by a second pass. The command applies
    it to every line it writes; the text and HTML reports and the replay report to every
    line they build.
    """
    if text.isprintable() and _IGNORABLE.search(text) is None:
        return text
    return "".join(_visible_escape(char) if _unsafe(char) else char for char in text)
