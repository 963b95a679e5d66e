"""Content made safe for a sink: redacted first, then bounded (pure, no I/O).

The tracing sink and the session transcript record text that came from the endpoint or the
executor (replies, arguments, observations, error messages). Each piece passes through
:class:`ContentGuard` first: the key (and anything credential-shaped) is replaced with the
library's own redaction, *then* the text is cut to its byte bound, so a cut never shows part
of a key and no record grows without a cap.
"""

from __future__ import annotations

from typing import Final

from metacrate_grid_agent._core._loop import bounded_text
from metacrate_grid_agent._core._wire import KeyRedactor, redact
from metacrate_grid_agent.config import Secret

__all__ = ["ContentGuard"]

#: Characters of a text looked at before redaction, per byte of its bound (UTF-8 is at most
#: four bytes a character, so this never cuts text the bound would have kept).
_CHARS_PER_BYTE: Final = 4


class ContentGuard:
    """Redacts the key and credential-shaped text, then bounds, every text it is given."""

    __slots__ = ("_key_length", "_redactor")

    def __init__(self, secret: Secret | str | None) -> None:
        value = secret.reveal() if isinstance(secret, Secret) else secret
        self._redactor = KeyRedactor(value or None)
        self._key_length = len(value or "")

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
