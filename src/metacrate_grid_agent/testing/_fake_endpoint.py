"""The loopback fake chat-completions endpoint behind `metacrate_grid_agent.testing`.

An HTTP/1.1 server on raw asyncio streams (not aiohttp's server, for byte-level faults), bound
only to 127.0.0.1:0. `_fake_wire` decides which bytes, `_fake_stream` reads and writes them on
one connection; this module serves: it takes requests, asks the script and sends the replies.

Tasks, all owned by the endpoint and all cancelled and awaited by `FakeEndpoint.aclose`::

    FakeEndpoint
    ├── listener           asyncio.Server on 127.0.0.1:0
    ├── lifetime watchdog  stops everything after `lifetime_s` (recorded as a failure)
    └── one handler task per connection: read a request, ask the script, write the reply
        └── a read-ahead watcher while a reply is written, so pauses end when the client leaves

When the fake cannot do its job (script exhausted, responder raised, bad request, a bound
reached) it answers with an HTTP error *and* records a failure, raised at exit: loudly.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Final, Literal, Self, TypeAlias

from metacrate_grid_agent.testing._fake_stream import (
    READ_CHUNK_BYTES,
    ClientGoneError,
    Stream,
    TooLongError,
)
from metacrate_grid_agent.testing._fake_wire import (
    CONTINUE_RESPONSE,
    FAKE_ERROR_TYPE,
    MAX_CHUNK_LINE_BYTES,
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
    ConnectionRecord,
    RecordedRequest,
    RenderedReply,
    Reply,
    RequestError,
    RequestHead,
    Responder,
    ScriptItem,
    iter_pieces,
    parse_chunk_size,
    parse_request_head,
    render_reply,
)

_Ending: TypeAlias = Literal["keep", "close", "reset", "client", "abort"]

LOOPBACK_HOST: Final = "127.0.0.1"
"""The only address the fake listens on: nothing beyond this machine can reach it."""
DEFAULT_PATH: Final = "/v1/chat/completions"
"""The path in `FakeEndpoint.url`; the fake answers every target, and records which one."""
DEFAULT_MAX_REQUESTS: Final = 1000
"""Far above any test; a runaway retry loop reaches it in well under a second."""
DEFAULT_MAX_REQUEST_BYTES: Final = 8 * 1024 * 1024
"""Largest request body accepted: above any prompt a test sends, small enough to hold in memory."""
DEFAULT_MAX_CONNECTIONS: Final = 256
"""Most simultaneously open connections: above any connection pool a test configures."""
DEFAULT_MAX_BYTES_SENT_PER_RESPONSE: Final = 64 * 1024 * 1024
"""Cap on one reply (endless bodies stop here): far above any sane client-side body cap."""
DEFAULT_LIFETIME_S: Final = 30.0
"""Below pytest-timeout's 60 s, so a hung test fails with the fake's message, not a stack dump."""
DEFAULT_WAIT_TIMEOUT_S: Final = 5.0
"""Bound on the `wait_*` helpers: generous for loopback, short enough to fail a test quickly."""
MAX_FAILURES: Final = 100
"""Failures kept verbatim; later ones are only counted, so a failure storm stays bounded."""
SHUTDOWN_TIMEOUT_S: Final = 5.0
"""Bound on waiting for cancelled connection handlers at shutdown."""
TLS_HANDSHAKE_TIMEOUT_S: Final = 5.0
"""Bound on a TLS handshake (asyncio's default is 60 s)."""
TLS_SHUTDOWN_TIMEOUT_S: Final = 2.0
"""Bound on the TLS close_notify exchange (asyncio's default is 30 s)."""


class _TooLargeError(Exception):
    """A request body passed `max_request_bytes`."""


class FakeEndpoint:
    """A scripted, fault-injecting OpenAI-compatible endpoint on 127.0.0.1 (an async context).

    ``script`` items are consumed one per request, in order: a `Reply` is sent as is, a
    responder (sync or async callable taking the `RecordedRequest`) builds the reply. Pass
    ``responder=`` instead to answer every request the same way. Every request target is
    answered (redirect targets included); `path` only forms `url`.

    Bounds: at most `max_requests` requests, `max_request_bytes` per request body,
    `max_connections` open at once (more are closed at once), `max_bytes_sent_per_response`
    per reply, and `lifetime_s` in all. Passing any bound, an exhausted script, a failing
    responder or an unparseable request is answered with an error status and recorded in
    `failures`; with ``strict=True`` (the default) leaving the ``async with`` block raises
    AssertionError listing them. Expected failures can be acknowledged with
    ``ep.failures.clear()``.

    A client that closes its sending side (half-close) counts as gone: the fake stops writing.
    Byte offsets of faults are exact on plain TCP; under TLS they count plaintext bytes.
    """

    def __init__(
        self,
        script: Sequence[ScriptItem] = (),
        *,
        responder: Responder | None = None,
        path: str = DEFAULT_PATH,
        ssl_context: ssl.SSLContext | None = None,
        max_requests: int = DEFAULT_MAX_REQUESTS,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_bytes_sent_per_response: int = DEFAULT_MAX_BYTES_SENT_PER_RESPONSE,
        lifetime_s: float = DEFAULT_LIFETIME_S,
        strict: bool = True,
    ) -> None:
        """Configure the endpoint; it listens once entered (or after `start`)."""
        if isinstance(script, Reply) or callable(script):
            raise TypeError("script must be a sequence; pass a single callable as responder=")
        problems: list[str] = []
        if responder is not None and script:
            problems.append("script and responder: pass one, not both")
        if not path.startswith("/") or any(ch.isspace() for ch in path):
            problems.append(f"path: {path!r} must start with '/' and contain no whitespace")
        for name, value, least in (
            ("max_requests", max_requests, 0),
            ("max_request_bytes", max_request_bytes, 0),
            ("max_connections", max_connections, 1),
            ("max_bytes_sent_per_response", max_bytes_sent_per_response, 1),
        ):
            if value < least:
                problems.append(f"{name}: {value} is below {least}")
        if not (math.isfinite(lifetime_s) and lifetime_s > 0):
            problems.append(f"lifetime_s: {lifetime_s} must be a finite number > 0")
        if problems:
            raise ValueError("invalid FakeEndpoint: " + "; ".join(problems))
        self._script: deque[ScriptItem] = deque(script)
        self._responder = responder
        self._path = path
        self._ssl_context = ssl_context
        self._max_requests = max_requests
        self._max_request_bytes = max_request_bytes
        self._max_connections = max_connections
        # One record per request plus a full set of idle connections: enough for any test.
        self._max_connection_records = max_requests + max_connections
        self._max_bytes_sent = max_bytes_sent_per_response
        self._lifetime_s = lifetime_s
        self._strict = strict
        self._state: Literal["new", "running", "stopping", "closed"] = "new"
        self._server: asyncio.Server | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._port = 0
        self._requests: list[RecordedRequest] = []
        self._connections: list[ConnectionRecord] = []
        self._failures: list[str] = []
        self._dropped_failures = 0
        self._first_error: tuple[str, BaseException] | None = None
        self._open = 0
        self._in_flight = 0
        self._max_open = 0
        self._max_in_flight = 0
        self._refused = 0
        self._changed = asyncio.Event()

    def __repr__(self) -> str:
        """Show where it listens and what it has seen."""
        where = self.url if self._port else "not started"
        return (
            f"<FakeEndpoint {where} state={self._state} requests={len(self._requests)}"
            f" failures={len(self._failures)}>"
        )

    # -- configuration and results --------------------------------------------------------

    @property
    def host(self) -> str:
        """The listening address, always 127.0.0.1."""
        return LOOPBACK_HOST

    @property
    def port(self) -> int:
        """The ephemeral port (raises RuntimeError before the endpoint starts)."""
        if not self._port:
            raise RuntimeError("the FakeEndpoint has not started: use 'async with'")
        return self._port

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT`` (``https://`` with an `ssl_context`)."""
        scheme = "https" if self._ssl_context is not None else "http"
        return f"{scheme}://{LOOPBACK_HOST}:{self.port}"

    @property
    def url(self) -> str:
        """`origin` followed by the configured path, exactly as given (query included)."""
        return self.origin + self._path

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every recorded request, in arrival order (the live list)."""
        return self._requests

    @property
    def connections(self) -> list[ConnectionRecord]:
        """Every accepted connection, in accept order; `ConnectionRecord.id` is the index."""
        return self._connections

    @property
    def failures(self) -> list[str]:
        """Problems of the fake itself (the live list; ``clear()`` acknowledges them)."""
        return self._failures

    @property
    def open_connections(self) -> int:
        """Connections accepted and not yet closed."""
        return self._open

    @property
    def max_concurrent_connections(self) -> int:
        """High-water mark of simultaneously open connections."""
        return self._max_open

    @property
    def max_concurrent_requests(self) -> int:
        """High-water mark of requests being served at once (head read to reply written)."""
        return self._max_in_flight

    @property
    def refused_connections(self) -> int:
        """Connections closed at once because `max_connections` were open (each a failure)."""
        return self._refused

    @property
    def pending_replies(self) -> int:
        """Script items not yet consumed."""
        return len(self._script)

    def push(self, *items: ScriptItem) -> None:
        """Append items to the script, even while serving (a `responder` takes precedence)."""
        self._script.extend(items)

    def reset_script(self, script: Sequence[ScriptItem]) -> None:
        """Replace the remaining script."""
        self._script = deque(script)

    def expect_no_failures(self) -> None:
        """Raise AssertionError listing the recorded failures, if there are any."""
        if not self._failures and not self._dropped_failures:
            return
        lines = [f"{self!r} recorded failures:", *(f"  - {f}" for f in self._failures)]
        if self._dropped_failures:
            lines.append(f"  ... and {self._dropped_failures} more")
        cause = None
        if self._first_error is not None and self._first_error[0] in self._failures:
            cause = self._first_error[1]
        raise AssertionError("\n".join(lines)) from cause

    # -- waiting ----------------------------------------------------------------------------

    async def wait_for_request(
        self, index: int = 0, *, timeout_s: float = DEFAULT_WAIT_TIMEOUT_S
    ) -> RecordedRequest:
        """Wait until request number `index` (from 0) has arrived, and return it."""
        await self._wait_until(lambda: len(self._requests) > index, f"request #{index}", timeout_s)
        return self._requests[index]

    async def wait_closed(
        self, connection_id: int, *, timeout_s: float = DEFAULT_WAIT_TIMEOUT_S
    ) -> ConnectionRecord:
        """Wait until connection `connection_id` is accepted and closed, and return its record."""

        def closed() -> bool:
            conns = self._connections
            return len(conns) > connection_id and conns[connection_id].closed

        await self._wait_until(closed, f"connection {connection_id} closed", timeout_s)
        return self._connections[connection_id]

    async def wait_all_closed(self, *, timeout_s: float = DEFAULT_WAIT_TIMEOUT_S) -> None:
        """Wait until no connection is open."""
        await self._wait_until(lambda: self._open == 0, "all connections closed", timeout_s)

    async def _wait_until(self, predicate: Callable[[], bool], what: str, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                while not predicate():  # bounded by timeout_s
                    await self._changed.wait()
        except TimeoutError:
            raise TimeoutError(f"fake endpoint: no {what} within {timeout_s} s") from None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _fail(self, problem: str, error: BaseException | None = None) -> None:
        if len(self._failures) < MAX_FAILURES:
            self._failures.append(problem)
        else:
            self._dropped_failures += 1
        if error is not None and self._first_error is None:
            self._first_error = (problem, error)
        self._notify()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> Self:
        """Listen on 127.0.0.1:0 and start the lifetime watchdog; an endpoint starts once."""
        if self._state != "new":
            raise RuntimeError("a FakeEndpoint can only be started once")
        self._state = "running"
        tls: dict[str, Any] = {}
        if self._ssl_context is not None:
            tls = {
                "ssl": self._ssl_context,
                "ssl_handshake_timeout": TLS_HANDSHAKE_TIMEOUT_S,
                "ssl_shutdown_timeout": TLS_SHUTDOWN_TIMEOUT_S,
            }
        server = await asyncio.start_server(
            self._on_connect, LOOPBACK_HOST, 0, limit=READ_CHUNK_BYTES, **tls
        )
        self._server = server
        self._port = int(server.sockets[0].getsockname()[1])
        self._watchdog = asyncio.create_task(self._watch_lifetime(), name=f"{self!r} watchdog")
        return self

    async def aclose(self) -> None:
        """Stop listening, close every connection, and cancel and await every handler task."""
        if self._state in ("new", "closed"):
            self._state = "closed"
            return
        self._state = "stopping"
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.wait({self._watchdog})
        await self._stop()
        self._state = "closed"

    async def __aenter__(self) -> Self:
        """Start the endpoint."""
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close; if strict, raise on recorded failures (or note them on the error in flight)."""
        await self.aclose()
        if not self._strict:
            return
        if exc is None:
            self.expect_no_failures()
        elif isinstance(exc, Exception):  # keep the test's own error; show ours beside it
            try:
                self.expect_no_failures()
            except AssertionError as report:
                exc.add_note(str(report))

    async def _watch_lifetime(self) -> None:
        await asyncio.sleep(self._lifetime_s)
        self._fail(
            f"lifetime_s={self._lifetime_s} elapsed before the endpoint was closed;"
            f" stopped it with {self._open} connection(s) open"
        )
        await self._stop()

    async def _stop(self) -> None:
        if self._state == "running":
            self._state = "stopping"
        if self._server is not None:
            self._server.close()
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_TIMEOUT_S)
            for task in pending:
                self._fail(f"{task.get_name()} did not stop within {SHUTDOWN_TIMEOUT_S} s")
        if self._server is not None:
            await self._server.wait_closed()

    # -- serving ----------------------------------------------------------------------------

    def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._state != "running":
            writer.transport.abort()
            return
        if self._open >= self._max_connections or (
            len(self._connections) >= self._max_connection_records
        ):
            self._refused += 1
            self._fail(
                f"refused a connection: {self._open} open (max_connections="
                f"{self._max_connections}), {len(self._connections)} accepted in all"
            )
            writer.transport.abort()
            return
        record = ConnectionRecord(id=len(self._connections), tls=self._ssl_context is not None)
        self._connections.append(record)
        self._open += 1
        self._max_open = max(self._max_open, self._open)
        self._notify()
        task = asyncio.get_running_loop().create_task(
            self._serve(Stream(record, reader, writer)), name=f"fake connection {record.id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, stream: Stream) -> None:
        ending: _Ending = "close"
        try:
            # Drained means handed on: on TCP into the kernel (a zero mark), under TLS to the
            # socket transport. asyncio's TLS transport pauses at size >= high, so a zero mark
            # there would pause every other write with nothing buffered until the peer spoke.
            tls = self._ssl_context is not None
            stream.writer.transport.set_write_buffer_limits(high=1 if tls else 0, low=0)
            ending = await self._serve_requests(stream)
        except ClientGoneError:
            ending = "client"
        except asyncio.CancelledError:  # shutdown: drop the connection now, do not flush it
            ending = "abort"
            raise
        except Exception as exc:  # noqa: BLE001 - a bug in the fake must fail the test, not vanish
            self._fail(f"connection {stream.record.id}: internal error {exc!r}", exc)
        finally:
            try:
                await stream.close(abort=ending in ("reset", "abort"), linger=ending == "reset")
            finally:
                stream.record.closed = True
                stream.record.closed_by = "client" if ending == "client" else "server"
                self._open -= 1
                self._notify()

    async def _serve_requests(self, stream: Stream) -> _Ending:
        while True:  # one pass per request: bounded by max_requests (and lifetime_s)
            try:
                block = await stream.read_until(b"\r\n\r\n", MAX_HEADER_BYTES)
            except TooLongError:
                return await self._refuse(
                    stream, 431, f"header block over {MAX_HEADER_BYTES} bytes"
                )
            if block is None:
                return "client"
            if len(self._requests) >= self._max_requests:
                return await self._refuse(stream, 500, f"over max_requests={self._max_requests}")
            try:
                head = parse_request_head(block)
            except RequestError as exc:
                return await self._refuse(stream, 500, f"unparseable request: {exc}")
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            try:
                ending = await self._exchange(stream, head)
            finally:
                self._in_flight -= 1
            if ending != "keep":
                return ending

    async def _refuse(self, stream: Stream, status: int, problem: str) -> _Ending:
        self._fail(f"connection {stream.record.id}: {problem}")
        reply = Reply.error(status, f"fake endpoint: {problem}", type=FAKE_ERROR_TYPE)
        await stream.write(render_reply(reply, client_wants_close=True).raw)
        return "close"

    async def _exchange(self, stream: Stream, head: RequestHead) -> _Ending:
        early = self._script[0] if self._responder is None and self._script else None
        if isinstance(early, Reply) and early.before_body:
            self._script.popleft()
            return await self._answer_before_body(stream, head, early)
        try:
            body = await self._read_body(stream, head)
        except _TooLargeError:
            problem = f"{head.method} {head.target}: body over {self._max_request_bytes} bytes"
            return await self._refuse(stream, 413, problem)
        except (RequestError, TooLongError) as exc:
            problem = f"{head.method} {head.target}: malformed chunked body {exc}"
            return await self._refuse(stream, 500, problem)
        request = RecordedRequest(
            method=head.method,
            target=head.target,
            http_version=head.http_version,
            headers=head.headers,
            body=body,
            connection_id=stream.record.id,
            index=len(self._requests),
        )
        self._requests.append(request)
        stream.record.requests += 1
        self._notify()
        reply = await self._reply_for(request)
        rendered = render_reply(reply, client_wants_close=head.wants_close)
        watcher = asyncio.create_task(stream.watch(), name=f"fake request {request.index} watcher")
        try:
            return await self._send(stream, request, reply, rendered)
        finally:
            watcher.cancel()
            await asyncio.wait({watcher})
            if not watcher.cancelled() and (error := watcher.exception()) is not None:
                raise error

    async def _answer_before_body(self, stream: Stream, head: RequestHead, reply: Reply) -> _Ending:
        """Record the request (body not read), send `reply`, then read and discard the body
        (so that closing sends no reset over the reply), and close."""
        request = RecordedRequest(
            method=head.method,
            target=head.target,
            http_version=head.http_version,
            headers=head.headers,
            body=b"",
            connection_id=stream.record.id,
            index=len(self._requests),
        )
        self._requests.append(request)
        stream.record.requests += 1
        self._notify()
        rendered = render_reply(reply, client_wants_close=True)
        if (ending := await self._send(stream, request, reply, rendered)) != "close":
            return ending
        left = 0 if head.chunked else min(head.content_length, self._max_request_bytes)
        while left > 0:  # bounded by max_request_bytes
            piece = min(left, READ_CHUNK_BYTES)
            await stream.read_exact(piece)
            left -= piece
        return "close"

    async def _read_body(self, stream: Stream, head: RequestHead) -> bytes:
        if not head.chunked:
            if head.content_length > self._max_request_bytes:
                raise _TooLargeError
            if head.expects_continue and head.content_length:
                await stream.write(CONTINUE_RESPONSE)
            return await stream.read_exact(head.content_length)
        if head.expects_continue:
            await stream.write(CONTINUE_RESPONSE)
        parts: list[bytes] = []
        total = 0
        while True:  # bounded: every pass takes >= 1 body byte, and total <= max_request_bytes
            line = await stream.read_until(b"\r\n", MAX_CHUNK_LINE_BYTES)
            if line is None:
                raise ClientGoneError
            size = parse_chunk_size(line)
            if size == 0:
                break
            total += size
            if total > self._max_request_bytes:
                raise _TooLargeError
            chunk = await stream.read_exact(size + 2)
            if not chunk.endswith(b"\r\n"):
                raise RequestError("chunk data not followed by CRLF")
            parts.append(chunk[:-2])
        for _ in range(MAX_HEADER_COUNT + 1):  # trailer lines, then the blank line
            line = await stream.read_until(b"\r\n", MAX_HEADER_BYTES)
            if line is None:
                raise ClientGoneError
            if line == b"\r\n":
                return b"".join(parts)
        raise RequestError("too many trailer lines")

    async def _reply_for(self, request: RecordedRequest) -> Reply:
        where = f"request #{request.index} ({request.method} {request.target})"
        item: ScriptItem
        if self._responder is not None:
            item = self._responder
        elif self._script:
            item = self._script.popleft()
        else:
            self._fail(f"{where}: script exhausted")
            return Reply.error(500, "fake endpoint: script exhausted", type=FAKE_ERROR_TYPE)
        if isinstance(item, Reply):
            return item
        try:
            result = item(request)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # noqa: BLE001 - recorded, answered with 500, re-raised at exit
            self._fail(f"{where}: responder raised {type(exc).__name__}: {exc}", exc)
            return Reply.error(500, "fake endpoint: responder raised", type=FAKE_ERROR_TYPE)
        if not isinstance(result, Reply):
            self._fail(f"{where}: responder returned {type(result).__name__}, not Reply")
            return Reply.error(500, "fake endpoint: responder broke", type=FAKE_ERROR_TYPE)
        return result

    async def _send(
        self, stream: Stream, request: RecordedRequest, reply: Reply, rendered: RenderedReply
    ) -> _Ending:
        await stream.pause(reply.stall_before_headers_s)
        cuts = list(reply.split_at)
        if reply.stall_at is not None:
            cuts.append(reply.stall_at[0])
        if reply.fault is not None:
            cuts.append(reply.fault_at)
        offset = 0
        if (ending := await _at_offset(stream, reply, offset)) is not None:
            return ending
        for piece in iter_pieces(rendered, cuts=cuts, drip_bytes=reply.drip_bytes):
            # bounded: at most max_bytes_sent_per_response bytes, even for an endless reply
            if offset:
                await stream.pause(reply.drip_interval_s)
            if offset + len(piece) > self._max_bytes_sent:
                await stream.write(piece[: self._max_bytes_sent - offset])
                self._fail(
                    f"request #{request.index}: reply reached max_bytes_sent_per_response="
                    f"{self._max_bytes_sent} before the client went away"
                )
                return "close"
            await stream.write(piece)
            offset += len(piece)
            if (ending := await _at_offset(stream, reply, offset)) is not None:
                return ending
        if reply.fault is not None:  # fault_at lies past the end of the reply
            return reply.fault
        return "close" if rendered.close_after else "keep"


async def _at_offset(stream: Stream, reply: Reply, offset: int) -> _Ending | None:
    """Apply the stall, then the fault, scheduled at `offset` bytes (if any)."""
    if reply.stall_at is not None and reply.stall_at[0] == offset:
        await stream.pause(reply.stall_at[1])
    if reply.fault is not None and reply.fault_at == offset:
        return reply.fault
    return None
