"""A credential held so that nothing shows it: :class:`Secret` (public in ``config``)."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["REDACTED", "Secret"]

REDACTED: Final = "[REDACTED]"


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
