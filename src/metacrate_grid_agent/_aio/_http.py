"""HTTP/1.1 to the one endpoint: the connection protocol, and a keep-alive pool.

The client sends one kind of request (POST, to one exact URL, a JSON body of known length)
and reads one kind of response, so this is all the HTTP it needs, and no more:

- :class:`RequestHead`: the request head, built once per client; per request only the
  ``X-Request-Id`` and ``Content-Length`` lines are added.
- :class:`_Connection`: an :class:`asyncio.BufferedProtocol` that reads in pieces of
  :data:`READ_SIZE` bytes into its own buffer and hands each read to the response reading
  it inherits (:class:`~._response.ResponseReader`: llhttp, the bounds, the outcome). It
  writes the request, and enforces the request deadline and the response-idle limit with
  one timer per request, re-armed only when it fires early.
- :class:`Pool`: the keep-alive connections to the one origin (TCP, or TLS through
  :mod:`ssl`). A connection is made only when no idle one is usable, under the connect
  timeout; one that ended its response whole and may be kept goes back, every other one is
  closed; one idle for the pool-idle limit is closed by one timer for the whole pool.

Failures are the HTTP layer's own exceptions (:class:`HTTPLayerError` and its kinds, defined
with the response reading and named here too), turned into the library's errors by
:func:`~._translate.translate`; no exception here holds a header.
"""

from __future__ import annotations

import asyncio
import functools
import select
import ssl
from collections.abc import Callable, Sequence
from typing import Final, NoReturn, cast

from metacrate_grid_agent._aio._response import (
    MAX_FRAMING_BYTES,
    MAX_HEAD_BYTES,
    BadResponseError,
    BodyCutOffError,
    ConnectExpiredError,
    DeadlineExpiredError,
    HeadCutOffError,
    HTTPLayerError,
    IdleExpiredError,
    LostError,
    PhaseHook,
    Response,
    ResponseReader,
)

__all__ = [
    "MAX_FRAMING_BYTES",
    "MAX_HEAD_BYTES",
    "MAX_RESPONSE_OVERHEAD_BYTES",
    "READ_SIZE",
    "BadResponseError",
    "BodyCutOffError",
    "ConnectExpiredError",
    "DeadlineExpiredError",
    "HTTPLayerError",
    "HeadCutOffError",
    "IdleExpiredError",
    "LostError",
    "PhaseHook",
    "Pool",
    "RequestHead",
    "Response",
]

#: Largest socket read (asyncio's own is 256 KiB): the first read of a response brings its
#: head and at most this much more, and an endless body is read at most this far past the
#: cap. The reply of a tool turn (a few KiB) still comes in one read.
READ_SIZE: Final = 16 * 1024
#: Most bytes read for one response beyond the body cap, whatever its framing: its heads
#: (interim ones included), its chunk framing and trailers, and the rest of the one read
#: that passes a bound.
MAX_RESPONSE_OVERHEAD_BYTES: Final = MAX_HEAD_BYTES + MAX_FRAMING_BYTES + READ_SIZE
#: Bound on the TLS close_notify exchange when a connection is closed (asyncio's is 30 s).
TLS_SHUTDOWN_TIMEOUT_S: Final = 2.0
#: Bound on waiting for closed connections to be gone when the client closes.
CLOSE_WAIT_S: Final = TLS_SHUTDOWN_TIMEOUT_S + 0.5


def _readiness(fd: int) -> Callable[[], object]:
    """A check of whether ``fd`` has something to read (or its end) now, true if so: a poll
    object registered once (it takes any descriptor number; select only those under
    FD_SETSIZE), else select (Windows)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return functools.partial(poller.poll, 0)
    return functools.partial(_selected, fd)


def _selected(fd: int) -> object:
    return select.select((fd,), (), (), 0)[0]


class RequestHead:
    """The request head, built once: POST, the exact target, the fixed headers.

    It holds the ``Authorization`` line, so its repr shows none of it and it cannot be
    pickled.
    """

    __slots__ = ("_prefix",)

    def __init__(self, target: str, authority: str, fields: list[tuple[str, str]]) -> None:
        lines = [f"POST {target} HTTP/1.1", f"Host: {authority}"]
        lines += [f"{name}: {value}" for name, value in fields]
        self._prefix = ("\r\n".join(lines) + "\r\nX-Request-Id: ").encode("latin-1")

    def __repr__(self) -> str:
        return "RequestHead(<hidden: it holds the credential>)"

    def __reduce__(self) -> NoReturn:
        raise TypeError("the request head holds the credential; it cannot be pickled")

    def render(self, request_id: str, length: int) -> bytes:
        """The head of one request: ``request_id`` (checked ASCII) and the body's length."""
        return b"%b%b\r\nContent-Length: %d\r\n\r\n" % (
            self._prefix,
            request_id.encode("ascii"),
            length,
        )


class _Connection(ResponseReader, asyncio.BufferedProtocol):
    """One connection: llhttp fed from a buffer of our own, one exchange at a time."""

    __slots__ = (
        "_buffer",
        "_deadline",
        "_idle_s",
        "_last",
        "_loop",
        "_lost",
        "_pool",
        "_timer",
        "_timer_at",
        "_writing",
        "closed",
        "idle_since",
        "readable",
        "transport",
    )

    def __init__(self, pool: Pool) -> None:
        super().__init__()
        self._pool = pool
        self._loop = pool.loop
        self._buffer = memoryview(bytearray(READ_SIZE))
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._lost = False
        self.idle_since = 0.0
        # The exchange's limits (the response's reading state is the ResponseReader's).
        self._deadline = 0.0
        self._idle_s = 0.0
        self._last = 0.0
        #: Whether the request is still being written (the response-idle limit waits).
        self._writing = False
        # The one timer, kept across exchanges: armed anew only when it would fire too late.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        # The check of the socket before reuse (None: no socket to check).
        self.readable: Callable[[], object] | None = None

    # -- asyncio's side ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        transport = cast("asyncio.Transport", transport)  # uvloop's is no asyncio.Transport
        self.transport = transport
        self._pool.adopt(self)  # from its first moment, so that aclose reaches it

    def get_buffer(self, sizehint: int) -> memoryview:
        """Every read lands in the one buffer: at most :data:`READ_SIZE` bytes at a time."""
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        """Hand what arrived to the response reading (bytes after the exchange are unsolicited)."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            self._unsolicited(nbytes)
            return
        self._last = self._loop.time()
        self._read(self._buffer[:nbytes], nbytes)

    def eof_received(self) -> None:
        """The endpoint closed its side: let the transport close (see connection_lost)."""

    def pause_writing(self) -> None:
        """The request did not all go into the socket at once: it is being written."""
        self._writing = True

    def resume_writing(self) -> None:
        """The request has been written (the write buffer is empty, its low mark being 0):
        the response-idle limit starts now."""
        self._writing = False
        self._last = now = self._loop.time()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            idle_at = now + self._idle_s
            self._arm(self._deadline if self._deadline <= idle_at else idle_at)

    def connection_lost(self, exc: Exception | None) -> None:
        """Settle the exchange in progress by what had arrived when the connection ended."""
        self.usable = False
        self._lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pool.forget(self)
        self._settle_lost(exc)
        if not self.closed.done():
            self.closed.set_result(None)

    # -- the exchange --------------------------------------------------------------------

    def send(
        self,
        head: bytes | Sequence[bytes],
        body: bytes,
        *,
        deadline: float,
        idle_s: float,
        body_cap: int,
        error_cap: int,
        on_phase: PhaseHook | None,
        now: float | None = None,
    ) -> asyncio.Future[Response]:
        """Write one request; the future settles with its response or an HTTPLayerError.

        ``now``: the clock as the pool read it just before, in the same step (the request
        is written at once after it); else it is read here."""
        transport = self.transport
        assert transport is not None  # noqa: S101 - only a made connection is in the pool
        waiter = self._loop.create_future()
        self._start(waiter, body_cap, error_cap, on_phase)
        self._deadline = deadline
        self._idle_s = idle_s
        if self._lost:  # lost between its making and this request: nothing was sent
            waiter.set_exception(LostError("closed before the request was sent"))
            return waiter
        self._writing = False
        # pause_writing, if it does not all go at once. A request given as its pieces in
        # ``head`` (an empty body) goes as they are: gathered into one send where the event
        # loop does so (uvloop; asyncio from CPython 3.12), joined once by asyncio's own
        # writelines before; one piece is never copied.
        pieces = (head,) if isinstance(head, bytes) else head
        transport.writelines((*pieces, body) if body else pieces)
        if now is None:
            now = self._loop.time()
        self._last = now
        idle_at = now + idle_s
        # While the request is being written, only the deadline runs (see resume_writing);
        # min() costs a call per request.
        due = deadline if self._writing or deadline <= idle_at else idle_at
        if self._timer is None or self._timer_at > due:
            self._arm(due)
        if on_phase is not None:
            on_phase("waiting_for_headers")
        return waiter

    def close(self) -> None:
        """Close now (an idle connection: FIN, or close_notify under TLS)."""
        self.usable = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection at once: a half-read one is never reused."""
        self.usable = False
        if self.transport is not None:
            self.transport.abort()

    def alive(self) -> bool:
        """Whether an idle connection may carry the next request."""
        transport = self.transport
        return self.usable and transport is not None and not transport.is_closing()

    def take(self, response: Response) -> bool:
        """End the exchange that settled with ``response``: whether the connection may carry
        the next request (a whole response, the request all sent, the connection open).

        Raises BadResponseError if bytes followed the complete response in a read that came
        before this (the same rule as bytes in its last read)."""
        self._waiter = None  # from now on, any byte answers nothing
        if self._trailing:
            raise BadResponseError("bytes followed the end of the response")
        # Open, and the whole request sent (a response may come before it has).
        transport = self.transport
        keep = bool(
            response.complete
            and self.usable
            and transport is not None
            and not transport.is_closing()
            and not transport.get_write_buffer_size()
        )
        if keep:  # idle since its last byte came (no clock read of the pool's)
            self.idle_since = self._last
        return keep

    def ready(self) -> None:
        """The connection is made (called by the pool before its first request)."""
        transport = self.transport
        assert transport is not None  # noqa: S101 - made
        # Paused while anything of a request is buffered, resumed when all of it is written:
        # when the response-idle limit starts.
        transport.set_write_buffer_limits(high=0, low=0)
        sock = transport.get_extra_info("socket")
        fd = -1 if sock is None else sock.fileno()  # -1: already closed (a pool closed meanwhile)
        self.readable = None if fd < 0 else _readiness(fd)

    def _read_no_more(self) -> None:
        """Stop reading a connection that is to be dropped: uvloop reads again within the
        same wake-up (asyncio's loop reads once per wake-up), which would read past a bound."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.pause_reading()

    def _unsolicited(self, nbytes: int) -> None:
        """Bytes that answer no request: the connection can no longer be trusted (and if
        the exchange they follow is not yet taken, they may make its response malformed)."""
        if self._waiter is not None:
            self._read_late(self._buffer[:nbytes])
        self.abort()

    def _arm(self, due: float) -> None:
        """The one timer, set for ``due``."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = due
        self._timer = self._loop.call_at(due, self._on_timer)

    def _on_timer(self) -> None:
        """The one timer: the deadline, or the idle limit, or re-armed for the earlier of the
        two (it fires early whenever bytes came meanwhile, or an exchange ended and the
        next one began: neither cancels it, so a request costs no timer of its own)."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # between exchanges: the next one arms it
        now = self._loop.time()
        idle_at = self._last + self._idle_s
        if now >= self._deadline:
            self._fail(DeadlineExpiredError())
        elif self._writing:  # the request is still being written: the deadline governs
            self._arm(self._deadline)
        elif now >= idle_at:
            self._settle_idle()
        else:
            self._arm(min(self._deadline, idle_at))


class Pool:
    """Keep-alive connections to one origin; connect only when none idle is usable.

    The client's slots bound the requests in flight, so the pool holds at most that many
    connections: one per request in flight, and the idle ones those left behind.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        connect_timeout_s: float,
        idle_s: float,
        pool_idle_s: float,
        body_cap: int,
        error_cap: int,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._connect_s = connect_timeout_s
        self._idle_s = idle_s
        self._pool_idle_s = pool_idle_s
        self._body_cap = body_cap
        self._error_cap = error_cap
        self._idle: list[_Connection] = []  # the most recently used last
        self._all: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    async def send(
        self,
        head: bytes | Sequence[bytes],
        body: bytes,
        deadline: float,
        on_phase: PhaseHook | None,
    ) -> Response:
        """One exchange on an idle connection or a new one; the connection is put back only
        after a whole response that lets it be kept, and is closed in every other case.

        ``head`` and ``body`` are written one after the other; the client passes its whole
        request as ``head``, in the pieces its body was kept in (the history's encoded
        messages: never joined by this client), with an empty body."""
        # One clock read: the idle connections' expiry, and the start of the response-idle
        # limit of a request written at once on one of them, in the same step.
        read = self.loop.time()
        idle = self._idle
        connection = None
        if idle:  # the check-out, inline: the most recently used first
            expired = read - self._pool_idle_s
            while idle:
                candidate = idle.pop()
                transport = candidate.transport  # alive(), without its call
                if (
                    candidate.usable
                    and transport is not None
                    and not transport.is_closing()
                    and candidate.idle_since > expired
                ):
                    # Nothing waits on its socket, not yet read by the event loop: no close
                    # from the endpoint, no byte that answers nothing (one zero-timeout poll,
                    # as urllib3 and httpcore check a pooled connection before reusing it).
                    readable = candidate.readable
                    if readable is None or not readable():
                        connection = candidate
                        break
                    candidate.abort()  # closed by the endpoint, or sent what answers nothing
                    continue
                candidate.close()
        now: float | None = read
        if connection is None:
            if on_phase is not None:
                on_phase("connecting")
            connection = await self._connect(deadline)
            now = None  # the connection took its time: read again when the request is written
        try:
            response = await connection.send(
                head,
                body,
                deadline=deadline,
                idle_s=self._idle_s,
                body_cap=self._body_cap,
                error_cap=self._error_cap,
                on_phase=on_phase,
                now=now,
            )
            keep = connection.take(response)
        except BaseException:
            connection.abort()  # cancelled or failed: never reused half-read
            raise
        if keep and not self._closed:
            self._checkin(connection)
        else:
            connection.abort()
        return response

    def adopt(self, connection: _Connection) -> None:
        """A connection was made (called from its ``connection_made``); one made after the
        pool was closed (a request in flight then) is dropped at once."""
        if self._closed:
            connection.abort()
            return
        self._all.add(connection)

    def forget(self, connection: _Connection) -> None:
        """A connection ended (called from its ``connection_lost``)."""
        self._all.discard(connection)

    async def aclose(self) -> None:
        """Close every connection, and wait (bounded) until they are gone."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        connections = list(self._all)
        idle = set(self._idle)
        self._idle.clear()
        for connection in connections:
            if connection in idle:
                connection.close()
            else:
                connection.abort()
        if connections:
            await asyncio.wait([c.closed for c in connections], timeout=CLOSE_WAIT_S)
            for connection in connections:
                if not connection.closed.done():
                    connection.abort()

    async def _connect(self, deadline: float) -> _Connection:
        """A new connection, within the connect timeout and the attempt's deadline."""
        loop = self.loop
        connect_deadline = loop.time() + self._connect_s
        timeout = asyncio.timeout_at(min(connect_deadline, deadline))
        try:
            async with timeout:
                if self._ssl is None:
                    _, connection = await loop.create_connection(
                        lambda: _Connection(self), self._host, self._port
                    )
                else:
                    _, connection = await loop.create_connection(
                        lambda: _Connection(self),
                        self._host,
                        self._port,
                        ssl=self._ssl,
                        server_hostname=self._host,
                        ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT_S,
                    )
        except TimeoutError:
            if not timeout.expired():
                raise  # the system's own connect timeout (an OSError)
            raise (
                ConnectExpiredError() if connect_deadline <= deadline else DeadlineExpiredError()
            ) from None
        connection.ready()
        return connection

    def _checkin(self, connection: _Connection) -> None:
        """Back to the idle ones, idle since its last byte (stamped by ``take``)."""
        self._idle.append(connection)
        now = connection.idle_since
        if self._sweeper is None:
            self._sweeper = self.loop.call_at(now + self._pool_idle_s, self._sweep)

    def _sweep(self) -> None:
        """Close the connections idle for the pool-idle limit; wake again for the next."""
        self._sweeper = None
        expired = self.loop.time() - self._pool_idle_s
        keep: list[_Connection] = []
        for connection in self._idle:
            if connection.alive() and connection.idle_since > expired:
                keep.append(connection)
            else:
                connection.close()
        self._idle = keep
        if keep:
            self._sweeper = self.loop.call_at(keep[0].idle_since + self._pool_idle_s, self._sweep)
