"""What an application writing its own front end needs to show and store output safely.

The library's own rules, public so a front end (the ``grid-agent`` command is one) applies
the same ones instead of a second copy:

- :func:`display_safe`: the one escaping rule. Every character that could act on a terminal
  or a page becomes a visible escape (``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``): each of
  Unicode category C (controls, tab and line breaks included; format characters such as bidi
  overrides and zero-width characters; surrogates, private-use and unassigned code points),
  the line and paragraph separators, and the other default-ignorable code points. Anything
  else is kept, so a second pass changes nothing. Apply it to every line written.
- :class:`SecretRedactor`: hides one secret (an API key) in any text, in every form an echo
  of it takes, as the library does in its own messages.
- :func:`read_regular` and :func:`open_private`: read only a regular file (never a FIFO or
  a device), bounded; write a file with mode 0600, never through a symbolic link. A path
  refused by either raises :class:`RefusedFileError`, an :class:`OSError`.
"""

from __future__ import annotations

from typing import Final, NoReturn

from metacrate_grid_agent import _public
from metacrate_grid_agent._core._redact import KeyRedactor, display_safe
from metacrate_grid_agent._files import ReadFile, RefusedFileError, open_private, read_regular
from metacrate_grid_agent.config import REDACTED, Secret

__all__ = [
    "ReadFile",
    "RefusedFileError",
    "SecretRedactor",
    "display_safe",
    "open_private",
    "read_regular",
]

#: The mark a bounded text ends with where it was cut; a beginning of the secret before it
#: is hidden too, as the cut may have fallen inside the secret.
CUT_MARK: Final = "…"


class SecretRedactor:
    """Hides one secret in texts: each form of it found is replaced by ``[REDACTED]``.

    Found, case-insensitively: the secret; any slice of it of 12 characters or more (the
    whole secret when it is shorter); both as they are, split by blanks or invisible
    characters, and with backslash, percent and HTML escapes decoded (a secret quoted by
    ``repr``, JSON, a URL or a page). A beginning of the secret (4 characters or more) at the
    end of a text or just before :data:`CUT_MARK` is hidden too: a bound may have cut there.

    Its repr never shows the secret, and it refuses to be pickled.
    """

    __slots__ = ("_key",)

    def __init__(self, secret: str | Secret) -> None:
        self._key = KeyRedactor(secret.reveal() if isinstance(secret, Secret) else secret)

    def __repr__(self) -> str:
        return f"SecretRedactor({REDACTED!r})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a SecretRedactor holds the secret; it cannot be pickled")

    def redact(self, text: str) -> str:
        """``text`` with every form of the secret, and a cut beginning of it, hidden."""
        return self._key.cut_prefixes(self._key.redact(text), CUT_MARK)


_public.claim(globals())
