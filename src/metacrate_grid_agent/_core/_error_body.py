"""Error bodies: what an endpoint's error reply says, read without trusting its shape.

Rule 1: this module never awaits, never reads a clock and never touches a socket. The
transport hands it the bytes of an error body (and the reply decoder the ``error`` member of
a reply); it gives back the message, type and code of the common shapes, or a short excerpt.

Error bodies are never trusted to have a shape: :func:`parse_error_body` reads the common
ones, falls back to a short excerpt (of an HTML page, its visible text), and passes every
string it returns through :func:`~._redact.scrub`, which removes the key and anything shaped
like a credential.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Final

import msgspec

from metacrate_grid_agent._core._redact import (
    EXCERPT_LIMIT,
    KeyRedactor,
    drop_partial_token,
    redact,
    scrub,
)

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "MESSAGE_LIMIT",
    "ErrorDetails",
    "error_member_message",
    "parse_error_body",
]

#: Longest error message kept: context-length messages with their numbers run to ~250.
MESSAGE_LIMIT: Final = 500
#: Bytes of an error body examined; error bodies are small, an HTML page is cut here.
MAX_ERROR_BODY_BYTES: Final = 64 * 1024

# Error bodies have no fixed shape; they are small and decoded only on the error path.
_ANY_DECODER: Final = msgspec.json.Decoder()
# Re-encodes a decoded body of unknown shape (plain JSON values only).
_ENCODER: Final = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class ErrorDetails:
    """What an error body says, every string scrubbed; ``excerpt`` when no shape is known."""

    message: str | None
    type: str | None
    code: str | None
    excerpt: str | None


# Where the common shapes keep the message, in the order looked at.
_MESSAGE_KEYS: Final = ("message", "msg", "detail", "error")
# Items of a detail list (or a FastAPI ``loc``) read: a handful says what went wrong.
_MAX_DETAIL_ITEMS: Final = 8
# Levels of nesting searched for a message: the common shapes need at most three.
_MAX_DETAIL_DEPTH: Final = 4


def _message_of(value: object, depth: int = 0) -> str | None:
    """The message in a string, an object's message member, or a FastAPI detail list."""
    if isinstance(value, str):
        return value or None
    if depth >= _MAX_DETAIL_DEPTH:
        return None
    if isinstance(value, list):
        found = (_message_of(item, depth + 1) for item in value[:_MAX_DETAIL_ITEMS])
        return "; ".join(m for m in found if m) or None
    if isinstance(value, dict):
        for key in _MESSAGE_KEYS:
            message = _message_of(value.get(key), depth + 1)
            if message:
                loc = value.get("loc")
                if key == "msg" and isinstance(loc, list) and loc:
                    return ".".join(_loc_part(p) for p in loc[:_MAX_DETAIL_ITEMS]) + ": " + message
                return message
    return None


def _loc_part(value: object) -> str:
    """One element of a FastAPI ``loc``: a name or an index; anything else is not shown.

    Never ``str()`` of a decoded container: its depth is the endpoint's to choose, and
    rendering it could recurse past the interpreter's limit.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # msgspec bounds integers to 64 bits
    return "…"


def _decode_error_fields(body: bytes) -> tuple[str | None, str | None, str | None] | None:
    """Message, type and code from the common error shapes; None when none applies."""
    try:
        document = _ANY_DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(document, list) and document:  # Google wraps the error in an array
        document = document[0]
    if isinstance(document, str):  # a bare JSON string is the message itself
        return (document, None, None) if document else None
    if not isinstance(document, dict):
        return None
    error = document.get("error")
    source = error if isinstance(error, dict) else document
    message = _message_of(source)
    kind = next(
        (v for k in ("type", "status", "error_type") if isinstance(v := source.get(k), str) and v),
        None,
    )
    code = source.get("code")
    code = str(code) if isinstance(code, str | int) and not isinstance(code, bool) else None
    if message is None and kind is None and not code:
        return None
    return message, kind, code or None


_BLOCK_OPEN: Final = re.compile(r"<(script|style)\b", re.IGNORECASE)
_BLOCK_CLOSE: Final = {
    "script": re.compile(r"</script\s*>", re.IGNORECASE),
    "style": re.compile(r"</style\s*>", re.IGNORECASE),
}
_TAG: Final = re.compile(r"<[^<>]*>")


def _html_text(page: str) -> str:
    """The visible text of an HTML page, in linear time (scripts and styles dropped)."""
    kept: list[str] = []
    pos = 0
    while (block := _BLOCK_OPEN.search(page, pos)) is not None:
        kept.append(page[pos : block.start()])
        end = _BLOCK_CLOSE[block[1].lower()].search(page, block.end())
        pos = len(page) if end is None else end.end()
    kept.append(page[pos:])
    return html.unescape(_TAG.sub(" ", "".join(kept)))


def parse_error_body(
    body: bytes, *, redactor: KeyRedactor, content_type: str | None = None
) -> ErrorDetails:
    """Read an error body: message, type and code of a known shape, or a short excerpt.

    Known shapes: ``{"error": {...}}``, ``{"error": "text"}``, a top-level ``message``
    (vLLM, Mistral), FastAPI's ``detail``, a bare JSON string, and any of these wrapped in
    an array (Google). Anything else gives an excerpt: of an HTML page (by content type
    or a leading ``<``) its visible text, otherwise the body as text. Only the first
    :data:`MAX_ERROR_BODY_BYTES` bytes are read. Never raises; every string returned is
    scrubbed of the key and credential-shaped text. An HTML page is redacted before its
    tags are stripped, so markup inside an echoed key cannot split it.
    """
    head = bytes(body[:MAX_ERROR_BODY_BYTES])
    is_html = head.lstrip()[:1] == b"<" or (
        content_type is not None and "html" in content_type.lower()
    )
    fields = None if is_html else _decode_error_fields(head)
    if fields is not None:
        message, kind, code = fields
        return ErrorDetails(
            message=_shown(message, redactor, MESSAGE_LIMIT),
            type=_shown(kind, redactor),
            code=_shown(code, redactor),
            excerpt=None,
        )
    text = _canonical_json(head) if not is_html else None
    if text is None:
        text = head.decode(errors="replace")
        if len(body) >= MAX_ERROR_BODY_BYTES:  # cut here, or by a reader with the same cap
            text = drop_partial_token(text)
    if is_html:
        text = _html_text(redact(text, redactor=redactor))
    excerpt = scrub(text, redactor=redactor)
    return ErrorDetails(message=None, type=None, code=None, excerpt=excerpt or None)


def _shown(text: str | None, redactor: KeyRedactor, limit: int = EXCERPT_LIMIT) -> str | None:
    """``text`` scrubbed, or None when nothing is left to show (say, only control characters)."""
    return (scrub(text, redactor=redactor, limit=limit) or None) if text else None


def _canonical_json(head: bytes) -> str | None:
    """A JSON body of unknown shape, re-encoded without escapes (None if not JSON).

    JSON lets any character be written as ``\\uXXXX``, so a key can be echoed in a form no
    text search finds; decoding and re-encoding puts it back in plain characters.
    """
    try:
        return _ENCODER.encode(msgspec.json.decode(head)).decode()
    except (msgspec.DecodeError, RecursionError, UnicodeError, TypeError):
        return None


def error_member_message(owner: str, raw: msgspec.Raw, redactor: KeyRedactor) -> str:
    """What a reply's ``error`` member says, scrubbed, as a message about ``owner``."""
    fields = _decode_error_fields(bytes(raw))
    if fields is None:
        return f"{owner} reports an error"
    message, kind, code = (_shown(f, redactor) for f in fields)
    extra = ", ".join(f"{k} {v}" for k, v in (("type", kind), ("code", code)) if v)
    return f"{owner} reports an error: {message or 'no message'}" + (f" ({extra})" if extra else "")
