"""What DBOS stores for us, as msgspec JSON: never pickle.

DBOS serializes workflow inputs and outputs, step outputs, messages (``DBOS.send``) and
errors with a pluggable :class:`dbos.Serializer`; its default pickles, so a row of the
system database could run code when read. :class:`MsgspecJSON` writes JSON only: values that
are not plain data (a msgspec struct, a dict, a list, a string, a number) are refused when
written, and an exception is stored as its type name, ``kind`` and message (a
:class:`dbos.PortableWorkflowError` when read back), never as an object.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from dbos import PortableWorkflowError, Serializer

__all__ = ["SERIALIZER_NAME", "MsgspecJSON"]

#: The name DBOS stores beside every value written with :class:`MsgspecJSON`.
SERIALIZER_NAME: Final = "grid_agent_msgspec_json"
#: The key that marks an error in the stored JSON.
_ERROR_KEY: Final = "$grid_agent_error"

_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder()


def _error_data(error: BaseException) -> dict[str, Any]:
    kind = getattr(error, "kind", None)
    return {
        _ERROR_KEY: {
            "name": type(error).__name__,
            "kind": kind if isinstance(kind, str) else None,
            "message": str(error),
        }
    }


class MsgspecJSON(Serializer):
    """DBOS's serializer for durable sessions: msgspec JSON, no pickle."""

    def name(self) -> str:
        """The name DBOS stores beside each value, so a reader knows how it was written."""
        return SERIALIZER_NAME

    def serialize(self, data: Any) -> str:
        """``data`` as JSON text; an exception as its name, kind and message.

        Raises :class:`TypeError` for a value that is not plain data (never pickled).
        """
        if isinstance(data, BaseException):
            data = _error_data(data)
        try:
            return _ENCODER.encode(data).decode("utf-8")
        except (msgspec.EncodeError, TypeError) as exc:
            raise TypeError(
                f"a {type(data).__name__} cannot be stored as JSON by the durable-session "
                "serializer (it never pickles): pass plain data or msgspec structs"
            ) from exc

    def deserialize(self, serialized_data: str) -> Any:
        """The value back from its JSON (plain data); an error as a PortableWorkflowError."""
        value = _DECODER.decode(serialized_data)
        if isinstance(value, dict) and set(value) == {_ERROR_KEY}:
            error = value[_ERROR_KEY]
            return PortableWorkflowError(
                str(error.get("message", "")),
                str(error.get("name", "Error")),
                error.get("kind"),
            )
        return value
