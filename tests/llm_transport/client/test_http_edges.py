"""HTTP/1.1's edge cases as the client's own protocol meets them, each through the fake.

Each is a typed error, never retried when the endpoint answered (it may have acted on the
request), or is handled as HTTP/1.1 (RFC 9112) says. llhttp decides what is valid HTTP;
the client bounds what llhttp alone would not (the head, chunk framing) and decides what a
valid response means for this one POST.

What the client does when the endpoint closes a kept-alive connection between two
requests: a connection whose close has arrived is never written to (the next request goes
out on a new one, as its first attempt). If the close crosses a request already sent, the
request's fate is unknown: a POST is not idempotent, so HTTP/1.1 allows no silent
retransmission (RFC 9112, 9.3.1); the loss, before any response byte, is the retryable
transport failure the retry policy already knows, resent only within ``max_retries``.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import TYPE_CHECKING, Any, Final, Literal

import pytest
import trustme

from metacrate_grid_agent import UserMessage
from metacrate_grid_agent._aio._http import MAX_HEAD_BYTES, READ_SIZE
from metacrate_grid_agent.errors import (
    ConnectionLostError,
    GridAgentError,
    HTTPStatusError,
    MalformedJSONError,
    MalformedResponseError,
    ResponseTooLargeError,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from metacrate_grid_agent.testing._fake_wire import render_reply
from tests.conftest import counts_socket_reads

if TYPE_CHECKING:
    from pathlib import Path

    from tests.llm_transport.conftest import ClientFactory

HELLO: Final = [UserMessage(content="hello")]
BODY: Final = b'{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}'
LENGTH: Final = b"Content-Length: %d" % len(BODY)
RETRIES: Final = 2
MiB: Final = 1024 * 1024
#: A server-side stall far longer than any client limit it is set against.
LONG_STALL_S: Final = 20.0


def _head(*lines: bytes) -> bytes:
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _chunked(body: bytes, *, size_line: bytes | None = None) -> bytes:
    line = size_line if size_line is not None else b"%x" % len(body)
    return line + b"\r\n" + body + b"\r\n0\r\n\r\n"


async def _refused_once(client_factory: ClientFactory, reply: Reply) -> GridAgentError:
    """Send one call with retries allowed; the endpoint must have seen exactly one POST."""
    async with FakeEndpoint([reply] * (RETRIES + 1)) as ep:
        client = client_factory(ep.url, max_retries=RETRIES)
        with pytest.raises(GridAgentError) as info:
            await client.complete(HELLO)
        await ep.wait_closed(0)
    assert len(ep.requests) == 1
    return info.value


def _assert_malformed(error: GridAgentError) -> None:
    assert type(error) is MalformedResponseError
    assert (error.kind, error.retryable, error.attempts) == ("malformed_response", False, 1)


async def test_an_obs_fold_header_is_a_protocol_error_sent_once(
    client_factory: ClientFactory,
) -> None:
    """A header continued on the next line (obs-fold, deprecated since RFC 7230) is refused.

    RFC 9112 (5.2) asks a user agent to unfold it; llhttp in its strict mode refuses it, and
    the client keeps that stricter answer (folding is a smuggling shape, and no
    chat-completions server folds): a malformed response, sent once.
    """
    head = _head(b"HTTP/1.1 200 OK", b"X-Note: first", b"  folded", LENGTH)
    _assert_malformed(await _refused_once(client_factory, Reply(head=head, body=BODY)))


@pytest.mark.parametrize(
    "lengths",
    [
        pytest.param((len(BODY), len(BODY) + 1), id="differing"),
        pytest.param((len(BODY), len(BODY)), id="repeated"),
    ],
)
async def test_a_duplicated_content_length_is_a_protocol_error_sent_once(
    client_factory: ClientFactory, lengths: tuple[int, int]
) -> None:
    """Two Content-Length fields (differing, or even equal) make the framing ambiguous:
    a malformed response (RFC 9112, 6.3), never a guess at which one to believe."""
    first, second = (b"Content-Length: %d" % n for n in lengths)
    head = _head(b"HTTP/1.1 200 OK", first, second)
    _assert_malformed(await _refused_once(client_factory, Reply(head=head, body=BODY)))


async def test_transfer_encoding_with_content_length_is_a_protocol_error_sent_once(
    client_factory: ClientFactory,
) -> None:
    """Transfer-Encoding and Content-Length together (the request-smuggling shape) are
    refused as malformed, not read by either framing."""
    head = _head(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", LENGTH)
    reply = Reply(head=head, body=_chunked(BODY), content_length=False)
    _assert_malformed(await _refused_once(client_factory, reply))


async def test_a_transfer_coding_other_than_chunked_is_a_protocol_error_sent_once(
    client_factory: ClientFactory,
) -> None:
    """A transfer coding the client does not decode (gzip) is refused, never inflated."""
    head = _head(b"HTTP/1.1 200 OK", b"Transfer-Encoding: gzip, chunked")
    reply = Reply(head=head, body=_chunked(BODY), content_length=False)
    _assert_malformed(await _refused_once(client_factory, reply))


@pytest.mark.parametrize(
    "size_line",
    [
        pytest.param(b"0" * (4 * MAX_HEAD_BYTES) + b"%x" % len(BODY), id="leading-zeros"),
        pytest.param(b"%x;ext=" % len(BODY) + b"a" * (4 * MAX_HEAD_BYTES), id="extension"),
    ],
)
async def test_a_chunk_size_line_over_the_head_bound_is_a_protocol_error(
    client_factory: ClientFactory, size_line: bytes
) -> None:
    """A chunk-size line longer than the head bound (valid to llhttp, which has no bound)
    is refused before its end, within one read past the bound."""
    head = _head(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked")
    reply = Reply(head=head, body=_chunked(BODY, size_line=size_line), content_length=False)
    error = await _refused_once(client_factory, reply)
    _assert_malformed(error)
    assert "chunk framing" in error.message


async def test_a_head_over_the_bound_is_a_protocol_error(client_factory: ClientFactory) -> None:
    """A response head longer than MAX_HEAD_BYTES is refused, not buffered whole."""
    head = _head(b"HTTP/1.1 200 OK", b"X-Big: " + b"a" * (2 * MAX_HEAD_BYTES), LENGTH)
    error = await _refused_once(client_factory, Reply(head=head, body=BODY))
    _assert_malformed(error)
    assert f"passed {MAX_HEAD_BYTES} bytes" in error.message


async def test_a_switch_of_protocols_is_a_protocol_error_sent_once(
    client_factory: ClientFactory,
) -> None:
    """101 Switching Protocols answers an upgrade the client never asks for: malformed."""
    head = _head(b"HTTP/1.1 101 Switching Protocols", b"Connection: upgrade", b"Upgrade: h2c")
    _assert_malformed(await _refused_once(client_factory, Reply(head=head, body=BODY)))


@pytest.mark.parametrize("fault", ["close", "reset"])
async def test_an_error_body_cut_short_keeps_its_status(
    client_factory: ClientFactory, fault: Literal["close", "reset"]
) -> None:
    """A 401 whose body breaks off is still the 401 (not a retryable connection loss that
    would send the key again): the status is what the error reports."""
    error = Reply.error(401, "invalid api key", type="invalid_request_error")
    at = len(render_reply(error, client_wants_close=False).raw) - 10
    reply = Reply(status=401, headers=error.headers, body=error.body, fault=fault, fault_at=at)
    refused = await _refused_once(client_factory, reply)
    assert type(refused) is HTTPStatusError
    assert (refused.status, refused.retryable, refused.attempts) == (401, False, 1)


@pytest.mark.parametrize(
    "interim",
    [
        pytest.param(b"HTTP/1.1 100 Continue\r\n\r\n", id="100-continue"),
        pytest.param(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n", id="103"),
        pytest.param(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n", id="two-interim"
        ),
    ],
)
async def test_interim_responses_before_the_final_one_are_skipped(
    client_factory: ClientFactory, interim: bytes
) -> None:
    """1xx heads before the final response are read and ignored (RFC 9110, 15.2), and the
    connection stays fit for the next request."""
    head = interim + _head(b"HTTP/1.1 200 OK", b"Content-Type: application/json", LENGTH)
    async with FakeEndpoint([Reply(head=head, body=BODY), Reply.completion("two")]) as ep:
        client = client_factory(ep.url, max_retries=0)
        first = await client.complete(HELLO)
        second = await client.complete(HELLO)
    assert (first.text, second.text) == ("hi", "two")
    assert [r.connection_id for r in ep.requests] == [0, 0]


@pytest.mark.parametrize(
    ("early", "expected"),
    [
        pytest.param(Reply.error(413, "request too large"), HTTPStatusError, id="413"),
        pytest.param(Reply.completion("early"), None, id="200"),
    ],
)
async def test_a_response_before_the_request_was_fully_written_is_read(
    client_factory: ClientFactory, early: Reply, expected: type[GridAgentError] | None
) -> None:
    """A server may answer before it has read the whole request (RFC 9112, 9.5): the
    client reads that answer as the response, then closes the connection, whose request it
    may not have finished sending; the next call opens a new one.

    The prompt (16 MiB) is far more than the loopback buffers take while the fake reads
    nothing, so the answer arrives while the client is still writing.
    """
    big = [UserMessage(content="x" * (16 * MiB))]
    reply = Reply(status=early.status, headers=early.headers, body=early.body, before_body=True)
    script = [reply, Reply.completion("next")]
    async with FakeEndpoint(script, max_request_bytes=32 * MiB) as ep:
        client = client_factory(ep.url, max_retries=RETRIES, max_prompt_bytes=32 * MiB)
        if expected is None:
            assert (await client.complete(big)).text == "early"
        else:
            with pytest.raises(expected) as info:
                await client.complete(big)
            assert getattr(info.value, "status", None) == 413
        record = await ep.wait_closed(0)
        assert (await client.complete(HELLO)).text == "next"
    assert record.closed_by == "client"
    assert [r.connection_id for r in ep.requests] == [0, 1]


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(
            _head(b"HTTP/1.1 200 OK", b"Connection: close", LENGTH), id="connection-close"
        ),
        pytest.param(_head(b"HTTP/1.0 200 OK", LENGTH), id="http-1.0"),
        pytest.param(
            _head(b"HTTP/1.0 200 OK", b"Connection: keep-alive", LENGTH), id="http-1.0-keep-alive"
        ),
    ],
)
async def test_a_response_that_ends_its_connection_is_not_reused(
    client_factory: ClientFactory, head: bytes
) -> None:
    """``Connection: close``, or HTTP/1.0 without keep-alive, ends the connection with the
    response: the client closes it itself (the fake would keep it open) and opens a new one
    for the next call. An HTTP/1.0 response that asks for keep-alive is reused."""
    keeps = b"keep-alive" in head
    async with FakeEndpoint([Reply(head=head, body=BODY), Reply.completion("two")]) as ep:
        client = client_factory(ep.url, max_retries=0)
        assert (await client.complete(HELLO)).text == "hi"
        if not keeps:
            assert (await ep.wait_closed(0)).closed_by == "client"
        assert (await client.complete(HELLO)).text == "two"
    assert [r.connection_id for r in ep.requests] == ([0, 0] if keeps else [0, 1])


async def test_a_pooled_connection_the_endpoint_closed_is_not_written_to(
    client_factory: ClientFactory,
) -> None:
    """The endpoint closes a kept-alive connection after a whole response: the client sees
    the close and sends the next request on a new connection, as its first attempt."""
    first = Reply.completion("one")
    closing = Reply(
        status=first.status,
        headers=first.headers,
        body=first.body,
        fault="close",
        fault_at=len(render_reply(first, client_wants_close=False).raw),
    )
    async with FakeEndpoint([closing, Reply.completion("two")]) as ep:
        client = client_factory(ep.url, max_retries=0)
        assert (await client.complete(HELLO)).text == "one"
        record = await ep.wait_closed(0)
        second = await client.complete(HELLO)
    assert record.closed_by == "server"
    assert (second.text, second.attempts) == ("two", 1)
    assert [r.connection_id for r in ep.requests] == [0, 1]


async def test_a_close_crossing_a_sent_request_goes_through_the_retry_policy(
    client_factory: ClientFactory,
) -> None:
    """The endpoint takes the next request on the kept-alive connection and closes it
    without a byte of answer: the request was sent, so its loss is a retryable transport
    failure, counted as an attempt and resent on a new connection only within max_retries."""
    lost = Reply(fault="close", fault_at=0)
    script = [Reply.completion("one"), lost, Reply.completion("two"), lost]
    async with FakeEndpoint(script) as ep:
        client = client_factory(ep.url, max_retries=1)
        await client.complete(HELLO)
        second = await client.complete(HELLO)
        client = client_factory(ep.url, max_retries=0)
        with pytest.raises(ConnectionLostError) as info:
            await client.complete(HELLO)
    assert (second.text, second.attempts) == ("two", 2)
    assert [r.connection_id for r in ep.requests] == [0, 0, 1, 2]
    assert (info.value.retryable, info.value.attempts) == (True, 1)


@counts_socket_reads
async def test_a_declared_length_over_the_cap_is_refused_within_one_read(
    client_factory: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Content-Length over max_response_bytes ends the call on the head: the client reads
    at most one 16 KiB piece of the response, though the body is all there to be read."""
    received = 0
    recv_into = socket.socket.recv_into

    def counted_into(self: socket.socket, *args: Any) -> int:
        nonlocal received
        size = recv_into(self, *args)
        if self.getpeername()[1] == port:  # the client's end, not the fake's
            received += size
        return size

    monkeypatch.setattr(socket.socket, "recv_into", counted_into)
    body = b"x" * (4 * MiB)
    async with FakeEndpoint([Reply(body=body)]) as ep:
        port = ep.port
        with pytest.raises(ResponseTooLargeError):
            await client_factory(ep.url, max_response_bytes=MiB, max_retries=0).complete(HELLO)
        await ep.wait_closed(0)
    assert 0 < received <= READ_SIZE


class _UncleanTLSServer:
    """A TLS server that answers each request with ``response`` and then drops the TCP
    connection without a TLS close_notify (a truncation, as far as TLS can tell)."""

    def __init__(self, response: bytes) -> None:
        self.response = response

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read one request whole, answer, drop the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(self.response)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        writer.transport.abort()  # no close_notify


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        pytest.param(_head(b"HTTP/1.1 200 OK", LENGTH) + BODY, None, id="content-length"),
        pytest.param(_head(b"HTTP/1.1 200 OK") + BODY, None, id="close-delimited-whole"),
        pytest.param(
            _head(b"HTTP/1.1 200 OK") + BODY[:30], MalformedJSONError, id="close-delimited-cut"
        ),
    ],
)
async def test_a_missing_tls_close_notify(
    client_factory: ClientFactory,
    tmp_path: Path,
    response: bytes,
    expected: type[GridAgentError] | None,
) -> None:
    """The endpoint drops the connection without TLS close_notify after its response.

    A response whose length is known (Content-Length, chunked) was verifiably received
    whole and stands (RFC 9112, 9.8). A body delimited by the close cannot be told from a
    truncated one (asyncio reports both closes alike), so it is read as what arrived: a
    JSON reply cut short never decodes and fails as malformed JSON, never retried.
    """
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    server = _UncleanTLSServer(response)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=context)
    try:
        port = listener.sockets[0].getsockname()[1]
        url = f"https://127.0.0.1:{port}/v1/chat/completions"
        client = client_factory(url, max_retries=0, ca_bundle=str(bundle))
        if expected is None:
            assert (await client.complete(HELLO)).text == "hi"
        else:
            with pytest.raises(expected):
                await client.complete(HELLO)
    finally:
        listener.close()
        await listener.wait_closed()


async def test_closing_the_client_ends_a_call_in_flight_and_leaks_nothing(
    client_factory: ClientFactory,
) -> None:
    """``aclose`` while a call waits for its response closes that connection too: the call
    ends with a retryable connection loss (no retry runs on a closed client), and every
    connection is closed by the client, none left open behind it."""
    stalled = Reply(body=BODY, stall_before_headers_s=LONG_STALL_S)
    async with FakeEndpoint([stalled]) as ep:
        client = client_factory(ep.url, max_retries=RETRIES)
        call = asyncio.create_task(client.complete(HELLO))
        await ep.wait_for_request(0)
        await client.aclose()
        with pytest.raises(GridAgentError) as info:
            await call
        await ep.wait_all_closed()
    assert type(info.value) is ConnectionLostError
    assert [c.closed_by for c in ep.connections] == ["client"]
    assert len(ep.requests) == 1
