"""A hostile endpoint, byte by byte: the answer is the one 2xx completion, or a typed error.

Each test sends bytes a valid chat-completions server never sends (a body on an interim
response, trailers that name a content coding, a status outside 100-599, endless chunk
framing), or exercises a lifecycle race (a close that comes with the response, a request
body the endpoint reads slowly), and checks what the call returns and what the endpoint
recorded. Raw asyncio servers stand in for the fake where the fake cannot express the bytes
or the timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import pytest

from metacrate_grid_agent import UserMessage
from metacrate_grid_agent._aio._http import MAX_RESPONSE_OVERHEAD_BYTES
from metacrate_grid_agent.errors import GridAgentError, MalformedResponseError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.conftest import counts_socket_reads

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

HELLO: Final = [UserMessage(content="hello")]
BODY: Final = b'{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}'
#: What an interim response carries as its body: a completion that must never be returned.
SMUGGLED: Final = b'{"choices":[{"message":{"content":"SMUGGLED"},"finish_reason":"stop"}]}'
RETRIES: Final = 2
MiB: Final = 1024 * 1024
FINAL: Final = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)


async def _malformed_once(client_factory: ClientFactory, raw: bytes) -> GridAgentError:
    """Send one call with retries allowed: a malformed response, the one POST the endpoint
    saw, and its connection closed."""
    async with FakeEndpoint([Reply(head=raw)] * (RETRIES + 1)) as ep:
        client = client_factory(ep.url, max_retries=RETRIES)
        with pytest.raises(GridAgentError) as info:
            await client.complete(HELLO)
        _assert_malformed(info.value)
        await ep.wait_closed(0)
    assert len(ep.requests) == 1
    return info.value


def _assert_malformed(error: GridAgentError) -> None:
    assert type(error) is MalformedResponseError
    assert (error.kind, error.retryable, error.attempts) == ("malformed_response", False, 1)


async def _read_request(reader: asyncio.StreamReader) -> int:
    """Read one request's head; the length of its body."""
    head = await reader.readuntil(b"\r\n\r\n")
    return int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])


@contextlib.asynccontextmanager
async def _raw_server(handler: Handler, *, rcvbuf: int | None = None) -> AsyncIterator[str]:
    """A loopback server running ``handler`` per connection; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # set before listen, so that accepted sockets (and the window) get it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(handler, sock=sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1/chat/completions"
    finally:
        server.close()
        await server.wait_closed()


# -- item 1: a body that comes with an interim response -----------------------------------


@pytest.mark.parametrize(
    "interim",
    [
        pytest.param(
            b"HTTP/1.1 199 X\r\nContent-Length: %d\r\n\r\n%b" % (len(SMUGGLED), SMUGGLED),
            id="199-content-length",
        ),
        pytest.param(
            b"HTTP/1.1 199 X\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(SMUGGLED),
            id="199-chunked",
        ),
        pytest.param(
            b"HTTP/1.1 100 Continue\r\nContent-Length: %d\r\n\r\n%b" % (len(SMUGGLED), SMUGGLED),
            id="100-content-length",
        ),
        pytest.param(
            b"HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(SMUGGLED),
            id="103-chunked",
        ),
    ],
)
async def test_a_body_on_an_interim_response_is_malformed_never_the_completion(
    client_factory: ClientFactory, interim: bytes
) -> None:
    """An interim (1xx) response never has a body (RFC 9110, 15.2; RFC 9112, 6.1-6.3: no
    Content-Length or Transfer-Encoding on a 1xx). One that announces one is malformed,
    sent once, and its body is never returned as the model's answer, whatever final
    response follows (here a bodiless 200)."""
    raw = interim + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    error = await _malformed_once(client_factory, raw)
    assert "SMUGGLED" not in str(error)


async def test_an_interim_head_leaves_nothing_to_the_final_one(
    client_factory: ClientFactory,
) -> None:
    """Each head starts with empty state: the fields of a 103 (here a content coding) do not
    become the final response's."""
    interim = b"HTTP/1.1 103 Early Hints\r\nContent-Encoding: gzip\r\nLink: </a>\r\n\r\n"
    async with FakeEndpoint([Reply(head=interim + FINAL)]) as ep:
        reply = await client_factory(ep.url, max_retries=0).complete(HELLO)
    assert reply.text == "hi"


# -- item 9: a status outside 100-599 ------------------------------------------------------


@pytest.mark.parametrize("status", [b"000", b"099", b"600", b"999"])
async def test_a_status_outside_100_to_599_is_malformed(
    client_factory: ClientFactory, status: bytes
) -> None:
    """HTTP's status codes are 100-599 (RFC 9110, 15): any other three digits are not an
    HTTP status the endpoint answered, but a malformed response, sent once."""
    raw = b"HTTP/1.1 %b X\r\nContent-Length: %d\r\n\r\n%b" % (status, len(BODY), BODY)
    await _malformed_once(client_factory, raw)


# -- item 7: trailers are not headers ------------------------------------------------------


async def test_trailers_never_change_how_the_body_is_read(client_factory: ClientFactory) -> None:
    """A chunked response's trailer fields are not the head's: a trailer naming a content
    coding or another type leaves a valid identity reply valid, and the connection is
    reused."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    trailers = b"Content-Encoding: gzip\r\nContent-Type: text/html\r\n"
    raw = head + b"%x\r\n%b\r\n0\r\n%b\r\n" % (len(BODY), BODY, trailers)
    async with FakeEndpoint([Reply(head=raw), Reply.completion("two")]) as ep:
        client = client_factory(ep.url, max_retries=0)
        first = await client.complete(HELLO)
        second = await client.complete(HELLO)
    assert (first.text, second.text) == ("hi", "two")
    assert [r.connection_id for r in ep.requests] == [0, 0]


# -- item 2: a kept-alive connection the endpoint closed -----------------------------------


async def test_a_connection_closed_with_its_response_is_not_written_to_by_the_next_call(
    client_factory: ClientFactory,
) -> None:
    """The endpoint sends a whole response and its FIN in one go (``write`` then
    ``write_eof`` in one callback: both are in the client's socket before it reads); the
    next call comes at once, in the same task, before the event loop has read the close.
    The pool checks the idle socket before reusing it, so the request goes out on a new
    connection, as its first attempt (no retry is allowed here), and the server's record
    shows each request on its own connection."""
    requests: list[int] = []  # the connection number of each request, in arrival order
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(connections)
        connections.append(number)
        try:
            while True:
                await reader.readexactly(await _read_request(reader))
                requests.append(number)
                writer.write(FINAL)
                if number == 0:
                    writer.write_eof()
                    return
        except (asyncio.IncompleteReadError, OSError):
            return
        finally:
            writer.close()

    async with _raw_server(handler) as url:
        client = client_factory(url, max_retries=0)
        first = await client.complete(HELLO)
        second = await client.complete(HELLO)
    assert (first.text, second.text, second.attempts) == ("hi", "hi", 1)
    assert requests == [0, 1]


async def test_calls_in_a_row_against_an_endpoint_that_closes_every_other_connection(
    client_factory: ClientFactory,
) -> None:
    """A raw server writes each response and its FIN in one go on every other connection
    (``write`` then ``write_eof`` in one callback: both are in the client's socket before it
    reads); forty calls in a row, without retries and without a pause, all succeed at their
    first attempt."""
    served: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(served)
        served.append(0)
        try:
            while True:
                await reader.readexactly(await _read_request(reader))
                served[number] += 1
                writer.write(FINAL)
                if number % 2 == 0:
                    writer.write_eof()
                    return
        except (asyncio.IncompleteReadError, OSError):
            return
        finally:
            writer.close()

    async with _raw_server(handler) as url:
        client = client_factory(url, max_retries=0)
        replies = [await client.complete(HELLO) for _ in range(40)]
    assert {(r.text, r.attempts) for r in replies} == {("hi", 1)}
    assert sum(served) == 40
    assert all(count == 1 for count in served[0::2])


# -- item 3: sending the request is not idleness -------------------------------------------


@pytest.mark.slow
async def test_a_request_body_read_slowly_is_not_an_idle_response(
    client_factory: ClientFactory,
) -> None:
    """The endpoint reads a 16 MiB prompt slowly for 1.2 s (a small receive window, 64 KiB
    every 50 ms), far longer than the 0.3 s response-idle limit, then the rest at once, and
    answers. The idle limit starts when the request has been written: the call succeeds."""
    slow_s, piece = 1.2, 64 * 1024

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            left = await _read_request(reader)
            loop = asyncio.get_running_loop()
            until = loop.time() + slow_s
            while left > 0 and loop.time() < until:  # bounded by slow_s
                data = await reader.read(min(piece, left))
                left -= len(data)
                await asyncio.sleep(0.05)
            await reader.readexactly(left)
            writer.write(FINAL)
            await writer.drain()
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            writer.close()

    big = [UserMessage(content="x" * (16 * MiB))]
    async with _raw_server(handler, rcvbuf=16 * 1024) as url:
        client = client_factory(
            url,
            max_retries=0,
            max_prompt_bytes=32 * MiB,
            response_idle_timeout_s=0.3,
            request_timeout_s=20.0,
            total_timeout_s=30.0,
        )
        reply = await client.complete(big)
    assert (reply.text, reply.attempts) == ("hi", 1)


# -- item 5: bytes read are bounded whatever the framing -----------------------------------


@counts_socket_reads
async def test_endless_chunk_extensions_end_quickly_within_the_stated_bound(
    client_factory: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1-byte chunks, each with a 16 KB chunk extension (every chunk-size line under the
    per-line bound): the framing of one response is bounded in total, so the call ends with
    a malformed response after at most max_response_bytes + MAX_RESPONSE_OVERHEAD_BYTES
    read, long before the endpoint's own stop (64 MiB)."""
    cap = MiB
    received = 0
    recv_into = socket.socket.recv_into
    ports: set[int] = set()

    def counted_into(self: socket.socket, *args: Any) -> int:
        nonlocal received
        size: int = recv_into(self, *args)
        if self.getpeername()[1] in ports:  # the client's end, not the server's
            received += size
        return size

    chunk = b"1;e=" + b"x" * (16 * 1024) + b"\r\na\r\n"
    sent = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        try:
            await reader.readexactly(await _read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while sent < 64 * MiB:  # bounded: the client stops reading long before
                writer.write(chunk * 16)
                sent += 16 * len(chunk)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    monkeypatch.setattr(socket.socket, "recv_into", counted_into)
    async with _raw_server(handler) as url:
        ports.add(int(url.split(":")[2].split("/")[0]))
        client = client_factory(url, max_retries=0, max_response_bytes=cap)
        with pytest.raises(GridAgentError) as info:
            await client.complete(HELLO)
    _assert_malformed(info.value)
    assert "framing" in info.value.message
    assert 0 < received <= cap + MAX_RESPONSE_OVERHEAD_BYTES
    assert sent < 16 * MiB
