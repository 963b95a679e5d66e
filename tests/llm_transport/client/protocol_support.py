"""The connection protocol driven without a socket: reads cut anywhere, closes anywhere.

A stub transport stands in for the socket, so any cut of a response into reads can be
tried quickly and exactly; :func:`exchange` settles one exchange the way the pool does
(its outcome, and whether the connection would go back to the pool) and counts the bytes
the connection was handed.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

from metacrate_grid_agent._aio._http import (
    READ_SIZE,
    HTTPLayerError,
    Pool,
    Response,
    _Connection,
)

#: The body cap of the stub exchanges (and the error-body cap).
CAP = 1024


class StubTransport(asyncio.Transport):
    """What the protocol asks of a transport, and nothing sent anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def writelines(self, list_of_data: Any) -> None:
        """Accept the request."""

    def get_write_buffer_size(self) -> int:
        """Everything was sent."""
        return 0

    def is_closing(self) -> bool:
        """Whether close or abort was called."""
        return self.closing

    def pause_reading(self) -> None:
        """Reading stops when an exchange fails: nothing to stop here."""

    def abort(self) -> None:
        """Note the close."""
        self.closing = True

    def close(self) -> None:
        """Note the close."""
        self.closing = True


def outcome(result: Response | BaseException) -> tuple[Any, ...]:
    """What an exchange settled as, comparable across runs."""
    if isinstance(result, BaseException):
        return (type(result).__name__,)
    return (result.status, result.reason, result.headers, result.body, result.complete,
            result.declared, result.over_cap)  # fmt: skip


@dataclass
class Exchanged:
    """One exchange as the pool saw it."""

    outcome: tuple[Any, ...]
    #: Bytes handed to the connection (the reads it was given, whole).
    fed: int
    #: Bytes handed to the connection up to the read that settled the exchange (all of
    #: them if the close or the idle limit settled it).
    read_for_response: int
    #: Whether the pool would put the connection back for the next request.
    kept: bool
    #: The connection, for what it still holds.
    connection: _Connection


def new_connection(*, cap: int = CAP, error_cap: int = CAP) -> _Connection:
    """A connection on a stub transport, of a pool that never connects."""
    pool = Pool(host="127.0.0.1", port=9, ssl_context=None, connect_timeout_s=1.0, idle_s=60.0,
                pool_idle_s=60.0, body_cap=cap, error_cap=error_cap)  # fmt: skip
    connection = _Connection(pool)
    connection.connection_made(StubTransport())
    return connection


async def exchange(
    raw: bytes,
    cuts: list[int],
    *,
    close_at: int | None = None,
    cap: int = CAP,
    error_cap: int = CAP,
    connection: _Connection | None = None,
) -> Exchanged:
    """Deliver ``raw`` cut at ``cuts`` (and every READ_SIZE bytes), as a socket would: every
    read is handed over until the connection is closed; ``close_at`` ends the connection
    (FIN) after that many bytes, else it stays open and the response-idle limit passes if the
    exchange is still unsettled. Then take the outcome as the pool does."""
    if connection is None:
        connection = new_connection(cap=cap, error_cap=error_cap)
    transport = connection.transport
    assert isinstance(transport, StubTransport)
    loop = asyncio.get_running_loop()
    waiter = connection.send(
        b"POST / HTTP/1.1\r\n\r\n", b"", deadline=loop.time() + 60.0, idle_s=60.0,
        body_cap=cap, error_cap=error_cap, on_phase=None,
    )  # fmt: skip
    end = len(raw) if close_at is None else min(close_at, len(raw))
    points = sorted({0, *(c for c in cuts if 0 < c < end), end})
    fed = 0
    settled_at: int | None = None
    for start, stop in itertools.pairwise(points):
        for offset in range(start, stop, READ_SIZE):
            if transport.closing:
                break
            piece = raw[offset : min(stop, offset + READ_SIZE)]
            connection.get_buffer(len(piece))[: len(piece)] = piece
            connection.buffer_updated(len(piece))
            fed += len(piece)
            if settled_at is None and waiter.done():
                settled_at = fed
    if close_at is not None and not transport.closing:
        connection.connection_lost(None)
    elif not waiter.done():  # nothing more comes: the response-idle limit passes
        connection._last -= 120.0  # as if the limit (60 s) had passed since the last byte
        connection._on_timer()
    read = fed if settled_at is None else settled_at
    try:
        response = await waiter
        kept = connection.take(response)
    except HTTPLayerError as error:
        return Exchanged(outcome(error), fed, read, False, connection)
    return Exchanged(outcome(response), fed, read, kept, connection)
