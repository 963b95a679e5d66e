"""HTTP/1.1 to the one endpoint: a response protocol on llhttp, and a keep-alive pool.

The client sends one kind of request (POST, to one exact URL, a JSON body of known length)
and reads one kind of response, so this is all the HTTP it needs, and no more:

- :class:`RequestHead`: the request head, built once per client; per request only the
  ``X-Request-Id`` and ``Content-Length`` lines are added.
- :class:`_Connection`: an :class:`asyncio.BufferedProtocol` that reads in pieces of
  :data:`READ_SIZE` bytes into its own buffer and feeds them to ``httptools``'
  ``HttpResponseParser`` (llhttp, the parser of Node.js; nothing here parses HTTP by hand).
  It bounds the head (:data:`MAX_HEAD_BYTES`, interim 1xx heads included, which are skipped)
  and the body (a declared ``Content-Length`` over the cap ends the exchange on the head
  alone; any body stops at the cap), tells a head cut off partway from a connection lost
  before any response byte, and enforces the request deadline and the response-idle limit
  with one timer per request, re-armed only when it fires early.
- :class:`Pool`: the keep-alive connections to the one origin (TCP, or TLS through
  :mod:`ssl`). A connection is made only when no idle one is usable, under the connect
  timeout; one that ended its response whole and may be kept goes back, every other one is
  closed; one idle for the pool-idle limit is closed by one timer for the whole pool.

Failures are this module's own exceptions (:class:`HTTPLayerError` and its kinds), turned into
the library's errors by :func:`~._translate.translate`; no exception here holds a header.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Final, NoReturn, cast

import httptools

from metacrate_grid_agent._aio._progress import Phase

__all__ = [
    "MAX_HEAD_BYTES",
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
#: Largest response head (the status line and headers, interim 1xx heads included), and
#: largest run of chunk framing (a chunk-size line with its extensions, or the trailers).
#: Real heads are under 8 KiB; a longer one is refused as malformed.
MAX_HEAD_BYTES: Final = 64 * 1024
#: Longest excerpt of a response that does not parse kept in the error (its first line).
MAX_EXCERPT_BYTES: Final = 80
#: Bound on the TLS close_notify exchange when a connection is closed (asyncio's is 30 s).
TLS_SHUTDOWN_TIMEOUT_S: Final = 2.0
#: Bound on waiting for closed connections to be gone when the client closes.
CLOSE_WAIT_S: Final = TLS_SHUTDOWN_TIMEOUT_S + 0.5

PhaseHook = Callable[[Phase], None]

_IDENTITY: Final = ("", "identity")
_NO_BODY_STATUSES: Final = (204, 304)


class HTTPLayerError(Exception):
    """An exchange failed below HTTP's meaning: translated by ``_translate.translate``."""


class ConnectExpiredError(HTTPLayerError):
    """No connection (TCP and TLS) within the connect timeout."""


class DeadlineExpiredError(HTTPLayerError):
    """The attempt's deadline (the request timeout, or the call's total) passed."""


class IdleExpiredError(HTTPLayerError):
    """No byte of the response within the response-idle limit."""


class LostError(HTTPLayerError):
    """The connection was lost before any byte of the response."""

    def __init__(self, lost_as: str) -> None:
        super().__init__(f"connection lost ({lost_as})")
        self.lost_as = lost_as


class HeadCutOffError(HTTPLayerError):
    """The connection was lost after ``received`` bytes of the response head."""

    def __init__(self, received: int, lost_as: str) -> None:
        super().__init__(f"connection lost after {received} bytes of the response head")
        self.received = received
        self.lost_as = lost_as


class BodyCutOffError(HTTPLayerError):
    """The connection was lost inside the body of a 2xx response, after ``received`` bytes."""

    def __init__(self, received: int, lost_as: str) -> None:
        super().__init__(f"connection lost after {received} bytes of the response body")
        self.received = received
        self.lost_as = lost_as


class BadResponseError(HTTPLayerError):
    """The response is not valid HTTP/1.1 (llhttp's reason, or a bound it passed)."""


class _Stop(Exception):  # noqa: N818 - a signal to the parser, not an error
    """Raised from a parser callback to stop parsing: the exchange has its outcome."""


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


class Response:
    """What an exchange brought back: the final head, and the body as far as it was read.

    ``complete`` says the whole message arrived. ``declared`` is the ``Content-Length`` of a
    body over the cap, refused on the head alone; ``over_cap`` says reading stopped at the
    cap. ``headers`` are keyed by lower-case name; repeated fields are joined by ", ".
    """

    __slots__ = ("body", "complete", "declared", "headers", "over_cap", "reason", "status")

    def __init__(self, status: int, reason: str, headers: dict[str, str]) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = b""
        self.complete = False
        self.declared: int | None = None
        self.over_cap = False


class _Connection(asyncio.BufferedProtocol):
    """One connection: llhttp fed from a buffer of our own, one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._buffer = memoryview(bytearray(READ_SIZE))
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = self._loop.create_future()
        #: Whether the connection may carry another request once this exchange ends.
        self.usable = True
        self._lost = False
        self.idle_since = 0.0
        # The exchange in progress (None between exchanges).
        self._waiter: asyncio.Future[Response] | None = None
        self._on_phase: PhaseHook | None = None
        self._deadline = 0.0
        self._idle_s = 0.0
        self._last = 0.0
        # The one timer, kept across exchanges: armed anew only when it would fire too late.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        # The response being parsed.
        self._head_bytes = 0
        self._head_done = False
        self._interim = False
        self._complete = False
        self._status_text = bytearray()
        self._headers: dict[str, str] = {}
        self._response: Response | None = None
        self._cap = 0
        self._error_cap = 0
        self._truncate = False
        self._size = 0
        self._chunks: list[bytes] = []
        self._chunk_headers = 0
        self._framing = 0
        self._close_delimited = False

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
        """Feed what arrived to the parser, within the head and framing bounds."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            self._unsolicited()
            return
        self._last = self._loop.time()
        data = self._buffer[:nbytes]
        if not self._head_done:
            room = MAX_HEAD_BYTES - self._head_bytes
            if nbytes <= room:
                self._head_bytes += nbytes
                self._feed(data)
                return
            self._head_bytes = MAX_HEAD_BYTES
            if not self._feed(data[:room]):
                return
            if self._head_done:
                self._feed(data[room:])
            elif not waiter.done():
                self._fail(BadResponseError(f"the response head passed {MAX_HEAD_BYTES} bytes"))
            return
        size, chunk_headers = self._size, self._chunk_headers
        if not self._feed(data) or waiter.done():
            return
        overhead = nbytes - (self._size - size)
        self._framing = (
            overhead if self._chunk_headers != chunk_headers else self._framing + overhead
        )
        if self._framing > MAX_HEAD_BYTES:
            what = "chunk framing (a chunk-size line, or the trailers)"
            self._fail(BadResponseError(f"{what} passed {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> None:
        """The endpoint closed its side: let the transport close (see connection_lost)."""

    def resume_writing(self) -> None:
        """A large request body is leaving: that counts as activity for the idle limit."""
        self._last = self._loop.time()

    def connection_lost(self, exc: Exception | None) -> None:
        """Settle the exchange in progress by what had arrived when the connection ended."""
        self.usable = False
        self._lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pool.forget(self)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            lost_as = "closed" if exc is None else type(exc).__name__
            response = self._response
            if not self._head_done:
                if self._head_bytes:
                    self._fail(HeadCutOffError(self._head_bytes, lost_as))
                else:
                    self._fail(LostError(lost_as))
            elif response is not None and exc is None and self._close_delimited:
                self._finish(complete=True)  # a body that ends with the connection
            elif response is not None and self._truncate:
                self._chunks = []  # an error body cut short: the status is what counts
                self._finish(complete=False)
            else:
                self._fail(BodyCutOffError(self._size, lost_as))
        if not self.closed.done():
            self.closed.set_result(None)

    # -- the exchange --------------------------------------------------------------------

    def send(
        self,
        head: bytes,
        body: bytes,
        *,
        deadline: float,
        idle_s: float,
        body_cap: int,
        error_cap: int,
        on_phase: PhaseHook | None,
    ) -> asyncio.Future[Response]:
        """Write one request; the future settles with its response or an HTTPLayerError."""
        transport = self.transport
        assert transport is not None  # noqa: S101 - only a made connection is in the pool
        self._waiter = waiter = self._loop.create_future()
        self._on_phase = on_phase
        self._deadline = deadline
        self._idle_s = idle_s
        self._cap = body_cap
        self._error_cap = error_cap
        self._reset_head()
        self._head_bytes = 0
        self._complete = False
        self._response = None
        self._size = 0
        self._chunks = []
        self._framing = 0
        self._truncate = False
        self._close_delimited = False
        if self._lost:  # lost between its making and this request: nothing was sent
            waiter.set_exception(LostError("closed before the request was sent"))
            return waiter
        transport.writelines((head, body))
        self._last = now = self._loop.time()
        idle_at = now + idle_s
        due = deadline if deadline <= idle_at else idle_at  # min() costs a call per request
        if self._timer is None or self._timer_at > due:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = due
            self._timer = self._loop.call_at(due, self._on_timer)
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

    def sent(self) -> bool:
        """Whether the whole request has left (a response may come before it has)."""
        transport = self.transport
        return transport is not None and not transport.get_write_buffer_size()

    def _reset_head(self) -> None:
        self._head_done = False
        self._interim = False
        self._status_text = bytearray()
        self._headers = {}

    def _unsolicited(self) -> None:
        """Bytes that answer no request: the connection can no longer be trusted."""
        self.abort()

    def _feed(self, data: memoryview) -> bool:
        """Parse ``data``; False when the exchange has its outcome (or parsing stopped).

        A response is settled only after the whole read is parsed: bytes that follow the
        end of the response in the same read make it malformed, as they answer nothing.
        """
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadResponseError("the endpoint switched protocols (101), never asked for"))
            return False
        except httptools.HttpParserCallbackError as exc:
            self.usable = False  # stopped mid-message (_Stop): the rest is never read
            if not isinstance(exc.__context__, _Stop):  # a field our reading refused
                self._fail(BadResponseError(f"{type(exc.__context__).__name__} in the head"))
            elif self._complete:
                self._fail(BadResponseError("bytes followed the end of the response"))
            return False
        except httptools.HttpParserError as exc:
            # The first line of the piece that failed, for the operator (scrubbed by the
            # translation, like every text from the endpoint).
            line = bytes(data[:MAX_EXCERPT_BYTES]).split(b"\r\n", 1)[0].decode("latin-1")
            self._fail(BadResponseError(f"{type(exc).__name__}: {exc}; near {line!r}"))
            return False
        if self._complete:
            self._finish(complete=True)
            return False
        return True

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
        elif now >= idle_at:
            if self._head_done and self._truncate:  # an error body that stalls: its status
                self._chunks = []
                self._finish(complete=False)
            else:
                self._fail(IdleExpiredError())
        else:
            self._timer_at = due = min(self._deadline, idle_at)
            self._timer = self._loop.call_at(due, self._on_timer)

    def _fail(self, failure: HTTPLayerError) -> None:
        self.usable = False
        self._read_no_more()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(failure)

    def _read_no_more(self) -> None:
        """Stop reading a connection that is to be dropped: uvloop reads again within the
        same wake-up (asyncio's loop reads once per wake-up), which would read past a bound."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.pause_reading()

    def _finish(self, *, complete: bool) -> None:
        response = self._response
        assert response is not None  # noqa: S101 - set when the head was complete
        chunks = self._chunks
        response.body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        response.complete = complete
        if not complete:
            self.usable = False
            self._read_no_more()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    # -- llhttp's callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A message starts: after the final response, that is unsolicited."""
        if self._complete:
            self.usable = False
            raise _Stop

    def on_status(self, status: bytes) -> None:
        """The reason phrase (in one or more pieces)."""
        self._status_text += status

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header field; a repeated one is joined to the earlier value."""
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self._headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        """The head: skip an interim one; else decide how much of the body to read."""
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self._interim = True  # 100 Continue, 103 Early Hints: the final head follows
            return
        self._head_done = True
        headers = self._headers
        response = Response(status, self._status_text.decode("latin-1"), headers)
        self._response = response
        if self._on_phase is not None:
            self._on_phase("reading_body")
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            self._fail(BadResponseError("the response uses a transfer coding other than chunked"))
            raise _Stop
        length = headers.get("content-length")
        self._close_delimited = (
            coding is None and length is None and status not in _NO_BODY_STATUSES
        )
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if 300 <= status < 400 or encoding not in _IDENTITY:
            self._finish(complete=False)  # refused on the head: the body is never read
            raise _Stop
        self._truncate = not 200 <= status < 300
        if self._truncate:
            self._cap = self._error_cap
        elif length is not None and int(length) > self._cap:
            response.declared = int(length)
            self._finish(complete=False)
            raise _Stop

    def on_body(self, body: bytes) -> None:
        """Body bytes: kept up to the cap; past it, reading stops."""
        size = self._size + len(body)
        if size <= self._cap:
            self._size = size
            self._chunks.append(body)
            return
        if self._truncate:
            self._chunks.append(body[: self._cap - self._size])
        else:
            assert self._response is not None  # noqa: S101 - the head came first
            self._response.over_cap = True
            self._chunks = []  # refused whole: nothing of it is kept
        self._size = self._cap
        self._finish(complete=False)
        raise _Stop

    def on_chunk_header(self) -> None:
        """A chunk-size line ended: the framing run starts again."""
        self._chunk_headers += 1

    def on_message_complete(self) -> None:
        """The end of an interim head, or of the response."""
        if self._interim:
            self._reset_head()
            return
        self._complete = True  # settled once the read is parsed (see _feed)
        self.usable = self.usable and self._parser.should_keep_alive()


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
        self, head: bytes, body: bytes, deadline: float, on_phase: PhaseHook | None
    ) -> Response:
        """One exchange on an idle connection or a new one; the connection is put back only
        after a whole response that lets it be kept, and is closed in every other case."""
        connection = self._checkout()
        if connection is None:
            if on_phase is not None:
                on_phase("connecting")
            connection = await self._connect(deadline)
        try:
            response = await connection.send(
                head,
                body,
                deadline=deadline,
                idle_s=self._idle_s,
                body_cap=self._body_cap,
                error_cap=self._error_cap,
                on_phase=on_phase,
            )
        except BaseException:
            connection.abort()  # cancelled or failed: never reused half-read
            raise
        if response.complete and connection.alive() and connection.sent() and not self._closed:
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
        return connection

    def _checkout(self) -> _Connection | None:
        idle = self._idle
        if not idle:
            return None
        expired = self.loop.time() - self._pool_idle_s
        while idle:
            connection = idle.pop()
            if connection.alive() and connection.idle_since > expired:
                return connection
            connection.close()
        return None

    def _checkin(self, connection: _Connection) -> None:
        connection.idle_since = now = self.loop.time()
        self._idle.append(connection)
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
