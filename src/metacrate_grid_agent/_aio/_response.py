"""Reading one HTTP/1.1 response on llhttp: its bounds, its outcome, the HTTP layer's errors.

The connection (:mod:`._http`) owns the socket, the timer and the pool; everything it knows
about the bytes of a response lives here, in :class:`ResponseReader`, which the connection
inherits (the parser's callbacks land on the connection itself: no extra call per read):

- the bytes of a read fed to ``httptools``' ``HttpResponseParser`` (llhttp, the parser of
  Node.js; nothing here parses HTTP by hand), within the head bound (:data:`MAX_HEAD_BYTES`,
  interim 1xx heads included, which are skipped) and the chunk-framing bound;
- the body kept up to the cap (a declared ``Content-Length`` over it ends the exchange on
  the head alone), an error body cut at its own smaller cap;
- how an exchange is settled when the connection ends (a head cut off partway told apart
  from a connection lost before any response byte) or the idle limit passes;
- :class:`Response`, the outcome, and the exceptions (:class:`HTTPLayerError` and its
  kinds) that :func:`~._translate.translate` turns into the library's errors; none of them
  holds a header.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import httptools

from metacrate_grid_agent._aio._progress import Phase

__all__ = [
    "MAX_FRAMING_BYTES",
    "MAX_HEAD_BYTES",
    "BadResponseError",
    "BodyCutOffError",
    "ConnectExpiredError",
    "DeadlineExpiredError",
    "HTTPLayerError",
    "HeadCutOffError",
    "IdleExpiredError",
    "LostError",
    "PhaseHook",
    "Response",
    "ResponseReader",
]

#: Largest response head (the status line and headers, interim 1xx heads included), and
#: largest run of chunk framing (a chunk-size line with its extensions, or the trailers).
#: Real heads are under 8 KiB; a longer one is refused as malformed.
MAX_HEAD_BYTES: Final = 64 * 1024
#: Most bytes of chunk framing in one response (chunk-size lines with their extensions, the
#: line ends, the trailers) beyond what its body leaves unused of the cap: 8 bytes a chunk
#: lets a body of 64 MiB come in 8 KiB chunks; 1-byte chunks of a long body do not fit.
MAX_FRAMING_BYTES: Final = 64 * 1024
#: Longest excerpt of a response that does not parse kept in the error (its first line).
MAX_EXCERPT_BYTES: Final = 80

PhaseHook = Callable[[Phase], None]

#: What one response may take beyond the cap in force, once its final head has ended.
_OVERHEAD: Final = MAX_HEAD_BYTES + MAX_FRAMING_BYTES
_IDENTITY: Final = ("", "identity")
_NO_BODY_STATUSES: Final = (204, 304)
#: What llhttp's feed raises when parsing stops (an upgrade is no HttpParserError).
_PARSER_ERRORS: Final = (httptools.HttpParserError, httptools.HttpParserUpgrade)
#: The tokens of a new exchange: one message (the response) may begin.
_ONE_MESSAGE: Final = (None,)


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


class ResponseReader:
    """One response at a time read through llhttp, settling the exchange's future.

    The connection that inherits it starts an exchange with :meth:`_start`, feeds each read
    to :meth:`_read`, and reports the connection's end (:meth:`_settle_lost`), the idle
    limit (:meth:`_settle_idle`) and bytes that came after the exchange settled
    (:meth:`_read_late`); the connection ends it (``_waiter`` back to None, ``_trailing``
    checked) when the pool takes the outcome. ``usable`` says whether the connection may
    carry another request once the exchange ends.

    Bounds, on the bytes of one response (a read that passes one is fed up to it, so the
    same bytes are refused however the reads cut them): until the final head has ended,
    :data:`MAX_HEAD_BYTES` (interim heads included); then the cap in force plus
    :data:`MAX_HEAD_BYTES` and :data:`MAX_FRAMING_BYTES` in all, and one run of chunk
    framing (a chunk-size line with its extensions, or the trailers) under
    :data:`MAX_HEAD_BYTES` as it is read.
    """

    # Slots: the connection that inherits it has about forty attributes, past what CPython
    # 3.11 keeps in an instance's shared-key values (30), where every ``self._x`` became a
    # lookup in a dict of its own.
    __slots__ = (
        "_begins",
        "_body",
        "_bound",
        "_cap",
        "_chunk_headers",
        "_close_delimited",
        "_complete",
        "_error_cap",
        "_framing",
        "_head_done",
        "_headers",
        "_interim",
        "_on_phase",
        "_parser",
        "_piece",
        "_response",
        "_size",
        "_status_text",
        "_taken",
        "_trailing",
        "_truncate",
        "_waiter",
        "on_message_begin",
        "on_status",
        "usable",
    )

    def __init__(self) -> None:
        # Two of llhttp's callbacks are C methods, not Python ones (a Python call per
        # response each): httptools takes the callbacks the protocol has when the parser is
        # made, so they are set on the instance before it. The reason phrase goes into one
        # bytearray (cleared per head); each message that may begin takes a token from a
        # list (one per exchange, one more per interim head), and a message with none left,
        # after the final response, is unsolicited: the pop raises, which stops the parser.
        self._status_text = bytearray()
        self.on_status: Callable[[bytes], None] = self._status_text.extend
        self._begins: list[None] = []
        self.on_message_begin: Callable[[], object] = self._begins.pop
        self._parser = httptools.HttpResponseParser(self)
        #: Whether the connection may carry another request once this exchange ends.
        self.usable = True
        # The exchange in progress (None between exchanges).
        self._waiter: asyncio.Future[Response] | None = None
        self._on_phase: PhaseHook | None = None
        # The response being parsed: the bytes fed and their bound in force.
        self._taken = 0
        self._bound = MAX_HEAD_BYTES
        self._head_done = False
        self._interim = False
        self._complete = False
        #: Whether bytes followed the complete response before the exchange was taken.
        self._trailing = False
        self._headers: dict[str, str] = {}
        self._response: Response | None = None
        self._cap = 0
        self._error_cap = 0
        self._truncate = False
        self._size = 0
        # The body: its one piece while it came in one, then one buffer bounded by the cap.
        self._piece = b""
        self._body: bytearray | None = None
        self._chunk_headers = 0
        self._framing = 0
        self._close_delimited = False

    def _start(
        self,
        waiter: asyncio.Future[Response],
        body_cap: int,
        error_cap: int,
        on_phase: PhaseHook | None,
    ) -> None:
        """A new exchange: every piece of the last response's state starts anew."""
        self._waiter = waiter
        self._on_phase = on_phase
        self._cap = body_cap
        self._error_cap = error_cap
        # _reset_head(), without its call; the one message this exchange lets begin.
        self._head_done = False
        self._interim = False
        self._status_text.clear()
        self._begins[:] = _ONE_MESSAGE
        self._headers = {}
        self._taken = 0
        self._bound = MAX_HEAD_BYTES
        self._complete = False
        self._trailing = False
        self._response = None
        self._size = 0
        self._piece = b""
        self._body = None
        self._framing = 0
        self._truncate = False
        self._close_delimited = False

    def _read(self, data: memoryview, nbytes: int) -> None:
        """Feed one read to the parser within the bounds; settle once the read is parsed."""
        room = self._bound - self._taken
        if nbytes > room:
            self._read_past_the_bound(data, nbytes, room)
            return
        self._taken += nbytes
        if not self._head_done:  # nearly every response: _feed(), without its call
            try:
                self._parser.feed_data(data)
            except _PARSER_ERRORS as exc:
                self._refused(exc, data)
                return
            if self._complete:
                self._finish(complete=True)
            return
        size, chunk_headers = self._size, self._chunk_headers
        if not self._feed(data):
            return
        if self._complete:
            self._finish(complete=True)
            return
        overhead = nbytes - (self._size - size)
        self._framing = (
            overhead if self._chunk_headers != chunk_headers else self._framing + overhead
        )
        if self._framing > MAX_HEAD_BYTES:
            what = "chunk framing (a chunk-size line, or the trailers)"
            self._fail(BadResponseError(f"{what} passed {MAX_HEAD_BYTES} bytes"))

    def _read_past_the_bound(self, data: memoryview, nbytes: int, room: int) -> None:
        """A read that passes the bound in force: fed up to it, then only what the response
        allows (the rest of a read in which the final head ended and moved the bound, or
        bytes after the response's end, refused unless llhttp skips them as blank lines)."""
        self._taken += room
        head_done = self._head_done
        if not self._feed(data[:room]):
            return
        rest = data[room:]
        if self._complete:
            if self._feed(rest):
                self._finish(complete=True)
        elif self._head_done != head_done:
            self._read(rest, nbytes - room)
        elif head_done:
            self._fail(
                BadResponseError(
                    "the response's chunk framing (chunk-size lines, extensions, trailers) "
                    f"passed its bound: {self._taken} bytes read for {self._size} of body"
                )
            )
        else:
            self._fail(BadResponseError(f"the response head passed {MAX_HEAD_BYTES} bytes"))

    def _read_late(self, data: memoryview) -> None:
        """Bytes after the exchange settled and before it was taken: after a complete
        response, anything but the blank lines llhttp skips between messages makes it
        malformed (as in the same read); the connection is never reused either way."""
        if self._complete and not self._trailing and not self._feed(data):
            self._trailing = True
        self.usable = False

    def _settle_lost(self, exc: Exception | None) -> None:
        """The connection ended: settle the exchange by what had arrived."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        lost_as = "closed" if exc is None else type(exc).__name__
        response = self._response
        if not self._head_done:
            if self._taken:
                self._fail(HeadCutOffError(self._taken, lost_as))
            else:
                self._fail(LostError(lost_as))
        elif response is not None and exc is None and self._close_delimited:
            self._finish(complete=True)  # a body that ends with the connection
        elif response is not None and self._truncate:
            self._drop_body()  # an error body cut short: the status is what counts
            self._finish(complete=False)
        else:
            self._fail(BodyCutOffError(self._size, lost_as))

    def _settle_idle(self) -> None:
        """The response-idle limit passed with the exchange in progress."""
        if self._head_done and self._truncate:  # an error body that stalls: its status
            self._drop_body()
            self._finish(complete=False)
        else:
            self._fail(IdleExpiredError())

    def _reset_head(self) -> None:
        """An interim head ended: the final one follows (a message more may begin)."""
        self._head_done = False
        self._interim = False
        self._status_text.clear()
        self._headers = {}
        self._begins.append(None)

    def _read_no_more(self) -> None:
        """Stop reading a connection that is to be dropped (the connection's part: uvloop
        reads again within the same wake-up, asyncio's loop once, which would read past a
        bound); nothing here."""

    def _drop_body(self) -> None:
        self._piece = b""
        self._body = None

    def _feed(self, data: memoryview) -> bool:
        """Parse ``data``; False when the exchange has its outcome (or parsing stopped).

        A complete response is settled by the caller once the whole read is parsed: bytes
        that follow its end in the same read make it malformed, as they answer nothing.
        """
        try:
            self._parser.feed_data(data)
        except _PARSER_ERRORS as exc:
            self._refused(exc, data)
            return False
        return True

    def _refused(self, exc: Exception, data: memoryview) -> None:
        """Parsing ``data`` stopped with ``exc``: the exchange's outcome, if it had none."""
        if isinstance(exc, httptools.HttpParserUpgrade):
            self._fail(BadResponseError("the endpoint switched protocols (101), never asked for"))
        elif isinstance(exc, httptools.HttpParserCallbackError):
            self.usable = False  # stopped mid-message (_Stop): the rest is never read
            cause = exc.__context__
            if self._complete and isinstance(cause, IndexError):  # no message may begin
                self._fail(BadResponseError("bytes followed the end of the response"))
            elif not isinstance(cause, _Stop):  # a field our reading refused
                self._fail(BadResponseError(f"{type(cause).__name__} in the head"))
        else:
            # The first line of the piece that failed, for the operator (scrubbed by the
            # translation, like every text from the endpoint).
            line = bytes(data[:MAX_EXCERPT_BYTES]).split(b"\r\n", 1)[0].decode("latin-1")
            self._fail(BadResponseError(f"{type(exc).__name__}: {exc}; near {line!r}"))

    def _fail(self, failure: HTTPLayerError) -> None:
        self.usable = False
        self._read_no_more()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(failure)
        self._response = None
        self._drop_body()

    def _finish(self, *, complete: bool) -> None:
        """Hand the response on; the connection keeps nothing of it."""
        response = self._response
        assert response is not None  # noqa: S101 - set when the head was complete
        body = self._body
        response.body = self._piece if body is None else bytes(body)
        self._response = None
        self._piece = b""
        self._body = None
        response.complete = complete
        if not complete:
            self.usable = False
            self._read_no_more()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    # -- llhttp's callbacks (on_status and on_message_begin: C methods, see __init__) ----

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header field; a repeated one is joined to the earlier value. Trailer fields
        (after the final head) are not the head's, and change nothing."""
        if self._head_done:
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self._headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        """The head: skip an interim one; else decide how much of the body to read."""
        status = self._parser.get_status_code()
        headers = self._headers
        if not 200 <= status < 600:
            if not 100 <= status < 200:  # three digits, but no HTTP status (RFC 9110, 15)
                self._fail(BadResponseError(f"the status code {status:03d} is not in 100-599"))
                raise _Stop
            if "content-length" in headers or "transfer-encoding" in headers:
                # A 1xx has no body (RFC 9110, 15.2; RFC 9112, 6.1 and 6.2): never read one.
                self._fail(BadResponseError(f"an interim response ({status}) came with a body"))
                raise _Stop
            self._interim = True  # 100 Continue, 103 Early Hints: the final head follows
            return
        self._head_done = True
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
        encoding = headers.get("content-encoding")  # folded only when there is one
        if 300 <= status < 400 or (
            encoding is not None and encoding.strip().lower() not in _IDENTITY
        ):
            self._finish(complete=False)  # refused on the head: the body is never read
            raise _Stop
        self._truncate = not 200 <= status < 300
        if self._truncate:
            self._cap = self._error_cap
        elif length is not None and int(length) > self._cap:
            response.declared = int(length)
            self._finish(complete=False)
            raise _Stop
        self._bound = self._cap + _OVERHEAD

    def on_body(self, body: bytes) -> None:
        """Body bytes: kept in one buffer up to the cap; past it, reading stops."""
        size = self._size + len(body)
        if size <= self._cap:
            if not self._size:
                self._piece = body  # the whole body, if it comes in one piece
            elif self._body is None:
                self._body = bytearray(self._piece)
                self._piece = b""
                self._body += body
            else:
                self._body += body
            self._size = size
            return
        if self._truncate:
            self.on_body(body[: self._cap - self._size])
        else:
            assert self._response is not None  # noqa: S101 - the head came first
            self._response.over_cap = True
            self._drop_body()  # refused whole: nothing of it is kept
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
        self._complete = True  # settled once the read is parsed (see _read)
        self.usable = self.usable and self._parser.should_keep_alive()
