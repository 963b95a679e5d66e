"""The connection protocol alone, fed bytes without a socket: reads may split anywhere.

The client's protocol sees a response as a series of reads of at most 16 KiB, cut wherever
the network cut it. Whatever the cuts, it must settle the exchange the same way: the same
status, headers and body, or the same kind of failure. Driven here with a stub transport,
so any split can be tried quickly, head and framing bounds included.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Final

import hypothesis
import hypothesis.strategies as st

from metacrate_grid_agent._aio._http import MAX_HEAD_BYTES
from tests.llm_transport.client.protocol_support import CAP, exchange, new_connection

BODY: Final = b'{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}'


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


async def _exchange(raw: bytes, cuts: list[int]) -> tuple[Any, ...]:
    """Feed ``raw`` cut at ``cuts`` (and every READ_SIZE bytes), every read handed over as a
    socket would until the connection is closed, then the endpoint's close; the outcome as
    the pool takes it."""
    return (await exchange(raw, cuts, close_at=len(raw))).outcome


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


def test_bytes_after_a_response_are_malformed_wherever_the_reads_are_cut() -> None:
    """Bytes that follow a complete response, whether in its last read or in a later read
    that came before the response was taken, make it malformed and end the connection:
    the ``garbage-after`` sample is cut at every byte, none settles as its 204."""
    raw = RESPONSES["garbage-after"]
    for cut in range(1, len(raw)):
        settled = asyncio.run(exchange(raw, [cut]))
        assert (cut, settled.outcome, settled.kept) == (cut, ("BadResponseError",), False)


def test_a_response_that_ends_at_the_head_bound_inside_a_read_is_not_followed_unseen() -> None:
    """A response whose last byte is the head bound's last byte (65,536), in a read that
    goes on with a whole second response: the rest of the read is parsed too, so the second
    response is seen, and the first is malformed (it answers nothing), never reused."""
    second = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
    start = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Pad: " % len(BODY)
    pad = MAX_HEAD_BYTES - len(start) - len(b"\r\n\r\n") - len(BODY)
    first = start + b"a" * pad + b"\r\n\r\n" + BODY
    assert len(first) == MAX_HEAD_BYTES
    settled = asyncio.run(exchange(first + second, [100]))
    assert (settled.outcome, settled.kept) == (("BadResponseError",), False)
    alone = asyncio.run(exchange(first, [100]))
    assert (alone.outcome[3:5], alone.kept) == ((BODY, True), True)


def test_bytes_after_a_response_that_followed_interim_heads_are_malformed() -> None:
    """Interim heads are messages of their own: each lets one more message begin, the final
    response none. Bytes after a final response that came after two interim heads make it
    malformed, wherever the reads are cut, exactly as after a response alone."""
    raw = RESPONSES["interim-then-chunked"] + b"HTTP/9"
    for cut in (1, 30, 60, len(raw) - 6, len(raw) - 1):
        settled = asyncio.run(exchange(raw, [cut]))
        assert (cut, settled.outcome, settled.kept) == (cut, ("BadResponseError",), False)


def test_a_connection_kept_after_interim_heads_reads_the_next_response_whole() -> None:
    """The next exchange on a kept connection starts anew, whatever heads the last one read:
    a response after one with interim heads, and after one without, is read whole."""

    async def twice(first: bytes) -> tuple[Any, ...]:
        kept = await exchange(first, [])
        assert kept.kept
        again = await exchange(RESPONSES["content-length"], [], connection=kept.connection)
        assert again.kept
        return again.outcome

    for first in (RESPONSES["interim-then-chunked"], RESPONSES["content-length"]):
        assert asyncio.run(twice(first))[3:5] == (BODY, True)


def test_the_status_text_and_message_begin_callbacks_run_no_python_frame() -> None:
    """llhttp calls back into the connection for each piece of a response; the reason
    phrase and the start of a message are handed to C methods (a bytearray's extend, a
    list's pop), not to Python functions: a Python call per response each is what they
    cost before (the client's instructions per request)."""

    async def callbacks() -> tuple[object, object]:
        connection = new_connection()
        return connection.on_status, connection.on_message_begin

    assert all(map(inspect.isbuiltin, asyncio.run(callbacks())))
