"""The chat-completions envelope, request bodies out (replies in: :mod:`._wire`).

Rule 1: this module never awaits, never reads a clock and never touches a socket. It maps
values to bytes: a request's body (:func:`encode_request`), a conversation's bodies each
message encoded once (:class:`HistoryEncoder`); the transport writes them.
"""

from __future__ import annotations

import array
import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from metacrate_grid_agent._core._types import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)
from metacrate_grid_agent.errors import InvalidMessageError

__all__ = ["MAX_LOOSE_PARTS", "HistoryEncoder", "encode_request", "encode_tools"]


def _enc_hook(obj: object) -> object:
    """Serialise the read-only mappings a tool schema may be built from."""
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"objects of type {type(obj).__name__} are not JSON")


_ENCODER: Final = msgspec.json.Encoder(enc_hook=_enc_hook)


class _RequestBody(msgspec.Struct, omit_defaults=True):
    messages: Sequence[Message]
    tools: Sequence[ToolDefinition] = ()


def encode_request(
    messages: Sequence[Message],
    tools: Sequence[ToolDefinition],
    *,
    tools_json: bytes | None = None,
) -> bytes:
    """The request body: exactly ``messages`` and, when there are any, ``tools``.

    The body names no ``model`` and no ``stream``: the endpoint URL selects the model and
    replies are never streamed. ``tools_json``, when given, is :func:`encode_tools` of
    ``tools``, kept from an earlier request: the same bytes, not serialised again.
    Raises ``InvalidMessageError`` when a value is not JSON.
    """
    try:
        if tools_json is not None and tools:
            return b"".join(
                (b'{"messages":', _ENCODER.encode(messages), b',"tools":', tools_json, b"}")
            )
        return _ENCODER.encode(_RequestBody(messages=messages, tools=tools if tools else ()))
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"the request cannot be serialised: {exc}") from exc


def encode_tools(tools: Sequence[ToolDefinition]) -> bytes:
    """The JSON array of ``tools``, as :func:`encode_request` writes it into a body."""
    try:
        return _ENCODER.encode(tools)
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"the request cannot be serialised: {exc}") from exc


#: The message types whose bytes may be kept: frozen all the way down (their content is a
#: string or a tuple of frozen parts), so equal ones always encode to the same bytes.
_FROZEN_MESSAGES: Final = frozenset({SystemMessage, UserMessage, AssistantMessage, ToolMessage})


class HistoryEncoder:
    """The request bodies of one conversation, each message encoded once.

    A session sends its whole history on every turn, and the history only grows between
    compactions: encoding it whole each time makes a session quadratic. This encoder keeps
    the messages of the last request it encoded (frozen: their bytes stay theirs) and their
    bytes. The next request reuses the bytes of its longest prefix of messages equal to
    those, in the same places, and encodes only the rest; its body is byte for byte what
    :func:`encode_request` makes of the same history.

    Reuse is by equality, and only for this package's message types, frozen all the way
    down (a ``msgspec.structs.force_setattr`` aside): equal is the same type (a subclass is
    another) with equal fields, each a string, None or a tuple of frozen parts, so equal
    messages encode to the same bytes. Anything else (a ``dict``) is encoded every time.
    Outside the contract, like ``force_setattr``: a value whose own ``__eq__`` lies (a
    ``str`` or ``tuple`` subclass, or a foreign object, claiming to equal a message sent)
    is sent as what it claims to equal, and so is a ``str`` subclass the encoder refuses.
    It holds at most what the last request held: its messages and their bytes.
    One encoder per conversation; it is not meant to be shared between sessions (it stays
    correct, but then reuses little).
    """

    __slots__ = ("_block", "_encoded", "_ends", "_loose", "_messages")

    def __init__(self) -> None:
        # The last request's messages that may be reused: its leading ones of the frozen
        # types (from the first other one on, every message is encoded again).
        self._messages: list[Message] = []
        # The messages' bytes as they go into a body (the first after its opening, each
        # other after a comma): older ones joined in one block, newer ones loose.
        self._block = b""
        self._loose: list[bytes] = []
        # Where each message's bytes end in the body (its length; where to cut the block).
        self._ends = array.array("q")
        self._encoded = 0

    def __len__(self) -> int:
        """How many messages' bytes it holds: those of the last request."""
        return len(self._ends)

    @property
    def encoded(self) -> int:
        """Messages encoded so far, over every request (each once while it stays put)."""
        return self._encoded

    def encode(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        *,
        tools_json: bytes | None = None,
    ) -> bytes:
        """The request body of ``messages`` and ``tools``, as :func:`encode_request` makes it.

        ``tools_json``, when given, is :func:`encode_tools` of ``tools``. Raises
        ``InvalidMessageError`` when a value is not JSON (and then holds nothing, so the
        next request starts afresh).
        """
        return b"".join(self.body_pieces(messages, tools, tools_json=tools_json)[0])

    def body_pieces(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        *,
        tools_json: bytes | None = None,
    ) -> tuple[list[bytes], int]:
        """The body of :meth:`encode` as a few pieces to join (the block of older
        messages, at most :data:`MAX_LOOSE_PARTS` newer ones, the end), and its length."""
        held = self._messages
        # The held messages against the same places of this history: one list comparison,
        # in C (the very object held is equal without a call).
        prefix = list(messages[: len(held)])
        try:
            kept = len(held) if held == prefix else _common_prefix(held, prefix)
        except Exception:  # noqa: BLE001 - a foreign object's own __eq__: encoded (and refused) below
            kept = 0
        self._keep(kept)
        new = messages[kept:]
        try:
            encoded = list(map(_ENCODER.encode, new))
            if tools and tools_json is None:
                tools_json = encode_tools(tools)
        except (TypeError, ValueError) as exc:
            self._forget()
            raise InvalidMessageError(f"the request cannot be serialised: {exc}") from exc
        except InvalidMessageError:
            self._forget()
            raise
        ends, loose = self._ends, self._loose
        size = ends[-1] if ends else 0
        for data in encoded:
            part = (b"," if ends else _OPEN_MESSAGES) + data
            loose.append(part)
            size += len(part)
            ends.append(size)
        # The kept messages are all of the frozen types: the new ones' leading frozen ones
        # are held on.
        frozen = itertools.takewhile(_FROZEN_MESSAGES.__contains__, map(type, new))
        held += new[: len(list(frozen))]
        self._encoded += len(new)
        if len(loose) > MAX_LOOSE_PARTS:  # each message's bytes joined on once, not per turn
            self._block = b"".join((self._block, *loose))
            loose.clear()
        if not ends:
            pieces, size = [_OPEN_MESSAGES], len(_OPEN_MESSAGES)
        else:
            pieces = [self._block, *loose] if self._block else [*loose]
        if tools and tools_json is not None:
            pieces += (_CLOSE_MESSAGES_TOOLS, tools_json, b"}")
            return pieces, size + len(_CLOSE_MESSAGES_TOOLS) + len(tools_json) + 1
        pieces.append(_CLOSE_MESSAGES)
        return pieces, size + len(_CLOSE_MESSAGES)

    def _keep(self, kept: int) -> None:
        """Hold only the first ``kept`` messages' bytes (and at most those messages)."""
        ends, loose = self._ends, self._loose
        in_block = len(ends) - len(loose)
        if kept >= in_block:
            del loose[kept - in_block :]
        else:  # changed inside the block: it is cut where its message ``kept`` began
            self._block = self._block[: ends[kept - 1]] if kept else b""
            loose.clear()
        del ends[kept:], self._messages[kept:]

    def _forget(self) -> None:
        """Hold nothing (after a request that could not be encoded)."""
        self._keep(0)


#: Most messages' bytes kept as separate pieces before they are joined into the block.
MAX_LOOSE_PARTS: Final = 16
_OPEN_MESSAGES: Final = b'{"messages":['
_CLOSE_MESSAGES: Final = b"]}"
_CLOSE_MESSAGES_TOOLS: Final = b'],"tools":'


def _common_prefix(held: Sequence[object], messages: Sequence[object]) -> int:
    """How many leading items of both are equal (one pass at C speed, to where they part)."""
    return len(list(itertools.takewhile(operator.truth, map(operator.eq, held, messages))))
