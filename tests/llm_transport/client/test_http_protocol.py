"""The connection protocol alone, fed bytes without a socket: reads may split anywhere.

The client's protocol sees a response as a series of reads of at most 16 KiB, cut wherever
the network cut it. Whatever the cuts, it must settle the exchange the same way: the same
status, headers and body, or the same kind of failure. Driven here with a stub transport,
so any split can be tried quickly, head and framing bounds included.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Final

import hypothesis
import hypothesis.strategies as st

from metacrate_grid_agent._aio._http import (
    MAX_HEAD_BYTES,
    READ_SIZE,
    BadResponseError,
    Pool,
    Response,
    _Connection,
)

BODY: Final = b'{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}'
CAP: Final = 1024


def _chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-T: 1\r\n\r\n"


RESPONSES: Final = {
    "content-length": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY),
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(BODY, 7),
    "interim-then-chunked": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(BODY, 16)
    ),
    "close-delimited": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + BODY,
    "error-truncated": b"HTTP/1.1 500 Oops\r\nContent-Length: 3000\r\n\r\n" + b"e" * 3000,
    "over-the-cap": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + _chunked(b"x" * 3000, 100),
    "declared-over-the-cap": b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000,
    "head-over-the-bound": b"HTTP/1.1 200 OK\r\nX-Big: "
    + b"a" * MAX_HEAD_BYTES
    + b"\r\nContent-Length: 2\r\n\r\n{}",
    "framing-over-the-bound": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"0" * (2 * MAX_HEAD_BYTES)
    + b"2\r\n{}\r\n0\r\n\r\n",
    "garbage-after": b"HTTP/1.1 204 No Content\r\n\r\nHTTP/9",
}


class _StubTransport(asyncio.Transport):
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


def _outcome(result: Response | BaseException) -> tuple[Any, ...]:
    if isinstance(result, BaseException):
        return (type(result).__name__,)
    return (result.status, result.reason, result.headers, result.body, result.complete,
            result.declared, result.over_cap)  # fmt: skip


async def _exchange(raw: bytes, cuts: list[int]) -> tuple[Any, ...]:
    """Feed ``raw`` cut at ``cuts`` (and every READ_SIZE bytes); the settled outcome."""
    pool = Pool(host="127.0.0.1", port=9, ssl_context=None, connect_timeout_s=1.0, idle_s=60.0,
                pool_idle_s=60.0, body_cap=CAP, error_cap=CAP)  # fmt: skip
    connection = _Connection(pool)
    connection.connection_made(_StubTransport())
    loop = asyncio.get_running_loop()
    waiter = connection.send(
        b"POST / HTTP/1.1\r\n\r\n", b"", deadline=loop.time() + 60.0, idle_s=60.0,
        body_cap=CAP, error_cap=CAP, on_phase=None,
    )  # fmt: skip
    points = sorted({0, *(c for c in cuts if 0 < c < len(raw)), len(raw)})
    for start, end in itertools.pairwise(points):
        for offset in range(start, end, READ_SIZE):
            if waiter.done():
                break
            piece = raw[offset : min(end, offset + READ_SIZE)]
            connection.get_buffer(len(piece))[: len(piece)] = piece
            connection.buffer_updated(len(piece))
    if not waiter.done():
        connection.connection_lost(None)
    try:
        return _outcome(await waiter)
    except BadResponseError as error:
        return _outcome(error)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    name=st.sampled_from(sorted(RESPONSES)),
    cuts=st.lists(st.integers(min_value=1, max_value=3 * MAX_HEAD_BYTES), max_size=8),
)
def test_any_split_of_a_response_settles_the_same(name: str, cuts: list[int]) -> None:
    """Property: however the response's bytes are cut into reads, the exchange settles the
    same way as when each read is as large as it can be."""
    raw = RESPONSES[name]
    whole = asyncio.run(_exchange(raw, []))
    assert asyncio.run(_exchange(raw, cuts)) == whole


def test_the_samples_settle_as_intended() -> None:
    """The samples above cover what they say: whole bodies, truncation, caps and bounds."""
    settled = {name: asyncio.run(_exchange(raw, [])) for name, raw in RESPONSES.items()}
    assert settled["content-length"][3:5] == (BODY, True)
    assert settled["chunked"][3:5] == (BODY, True)
    assert settled["interim-then-chunked"][:1] == (200,)
    assert settled["interim-then-chunked"][3:5] == (BODY, True)
    assert settled["close-delimited"][3:5] == (BODY, True)
    assert settled["error-truncated"][3:5] == (b"e" * CAP, False)
    assert settled["over-the-cap"][6] is True
    assert settled["declared-over-the-cap"][5] == 5000
    assert settled["head-over-the-bound"] == ("BadResponseError",)
    assert settled["framing-over-the-bound"] == ("BadResponseError",)
    assert settled["garbage-after"] == ("BadResponseError",)
