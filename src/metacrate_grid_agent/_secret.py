"""A credential held so that nothing shows it: :class:`Secret` (public in ``config``), and
the one rule for reading a credential from a file (:func:`read_secret_file`).
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Any, Final, NamedTuple

from metacrate_grid_agent._files import read_regular

__all__ = ["REDACTED", "SHARED_BITS", "Secret", "SecretText", "read_secret_file"]

REDACTED: Final = "[REDACTED]"
#: Permission bits that let users other than the owner read a secret's file (warned about).
SHARED_BITS: Final = stat.S_IRGRP | stat.S_IROTH


class SecretText(NamedTuple):
    """What :func:`read_secret_file` read: the text, stripped, and whether more was there."""

    text: str
    oversized: bool


def read_secret_file(
    path: str | os.PathLike[str], limit: int, *, what: str, log: logging.Logger
) -> SecretText:
    """The text of a file holding one credential (an API key, a token), whitespace stripped.

    Every credential file is read by this rule: only a regular file (a link to one is
    followed; a FIFO or a device is refused without blocking, ``_files.read_regular``), at
    most ``limit + 1`` bytes (``oversized`` says there were more); one that other users can
    read is used, with a warning on ``log`` naming ``what`` and the mode, as ssh does for a
    private key. The caller checks the text's shape and words its own problems.

    Raises :class:`OSError` (its ``strerror`` says why) or :class:`UnicodeDecodeError`.
    """
    found = read_regular(path, limit)
    text = found.data.decode("utf-8").strip()
    if found.mode & SHARED_BITS:
        log.warning("%s is readable by other users (mode %04o); chmod 600 it", what, found.mode)
    return SecretText(text, len(found.data) > limit)


class Secret:
    """A credential. Its repr, str and every serialisation show :data:`REDACTED`.

    Call :meth:`reveal` at the one place the value is needed (the ``Authorization`` header).
    ``origin`` says where the value came from, for display (never the value itself):
    "inline", "environment variable NAME", "file PATH"; None when given in code.
    """

    __slots__ = ("_origin", "_value")

    def __init__(self, value: str, *, origin: str | None = None) -> None:
        if not isinstance(value, str):
            raise TypeError("Secret takes a str")
        self._value = value
        self._origin = origin

    def reveal(self) -> str:
        """The credential itself; never log or print it."""
        return self._value

    @property
    def origin(self) -> str | None:
        """Where the credential came from ("inline", "environment variable NAME", ...)."""
        return self._origin

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, format_spec: str) -> str:
        return format(REDACTED, format_spec)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (REDACTED,))

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Secret:
        return self  # immutable: a copy within the process keeps the credential

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return self._value == other._value

    def __hash__(self) -> int:
        return hash(self._value)
