"""A connection lost partway through the response head is a protocol error, never retried.

Some response bytes arrived: the endpoint received the request and may have acted on it
(and billed it), so sending it again could do that twice. Only a connection that fails
before any response byte arrives, or is reset in the middle of a body, is a retryable
transport failure. Each case is checked against the fake's own count of the POSTs it
received, for a clean close (FIN) and for a reset (RST, ``SO_LINGER`` 0), at several
points of the head. The client's own protocol counts the response bytes, so the line is
exact: no parser's view of a partial message is involved.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import struct
from typing import TYPE_CHECKING, Final, Literal

import pytest
import trustme

from metacrate_grid_agent import UserMessage
from metacrate_grid_agent.errors import (
    ConnectionLostError,
    GridAgentError,
    MalformedResponseError,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply

if TYPE_CHECKING:
    from pathlib import Path

    from tests.llm_transport.conftest import ClientFactory

MESSAGES: Final = [UserMessage(content="hello")]
BODY: Final = b'{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}'
HEAD: Final = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (
    len(BODY)
)
RETRIES: Final = 2
Fault = Literal["close", "reset"]
#: Where in HEAD the connection breaks: inside the status line, right after it, inside a
#: header name, and after the last header line but before the blank line that ends the head.
CUTS: Final = {
    "in-status-line": len(b"HTTP/1.1 20"),
    "after-status-line": len(b"HTTP/1.1 200 OK\r\n"),
    "in-a-header": len(b"HTTP/1.1 200 OK\r\nContent-Ty"),
    "before-the-blank-line": len(HEAD) - 2,
}


@pytest.mark.parametrize("fault", ["close", "reset"])
@pytest.mark.parametrize("cut", list(CUTS))
async def test_a_head_cut_off_is_a_protocol_error_sent_once(
    client_factory: ClientFactory, cut: str, fault: Fault
) -> None:
    """Part of the head arrived, then FIN or RST: exactly one POST, malformed_response.

    Protects: a request the endpoint answered (even in part) is never sent again.
    """
    reply = Reply(head=HEAD, body=BODY, fault=fault, fault_at=CUTS[cut])
    async with FakeEndpoint([reply] * (RETRIES + 1)) as ep:
        client = client_factory(ep.url, max_retries=RETRIES)
        with pytest.raises(GridAgentError) as info:
            await client.complete(MESSAGES)
        posts = [r for r in ep.requests if r.method == "POST"]
    assert len(posts) == 1
    assert type(info.value) is MalformedResponseError
    assert (info.value.kind, info.value.retryable, info.value.attempts) == (
        "malformed_response",
        False,
        1,
    )


@pytest.mark.parametrize("fault", ["close", "reset"])
async def test_a_connection_lost_before_any_byte_is_still_retried(
    client_factory: ClientFactory, fault: Fault
) -> None:
    """No response byte arrived: the loss stays a retryable transport failure.

    Protects: telling a cut-off head apart does not turn a connection that never answered
    into a protocol error (the boundary case of the test above).
    """
    reply = Reply(head=HEAD, body=BODY, fault=fault, fault_at=0)
    async with FakeEndpoint([reply] * (RETRIES + 1)) as ep:
        client = client_factory(ep.url, max_retries=RETRIES)
        with pytest.raises(ConnectionLostError) as info:
            await client.complete(MESSAGES)
        posts = [r for r in ep.requests if r.method == "POST"]
    assert info.value.retryable is True
    assert len(posts) == RETRIES + 1


@pytest.mark.parametrize("fault", ["close", "reset"])
async def test_a_reused_connection_cut_in_the_next_head_is_sent_once(
    client_factory: ClientFactory, fault: Fault
) -> None:
    """On a pooled connection whose first response was whole, a second response cut in its
    head is still a protocol error: what arrived before counts for nothing.

    Protects: the bytes of an earlier response on the same connection neither hide nor fake
    a cut-off head of the next one.
    """
    whole = Reply.completion("first")
    cut_off = Reply(head=HEAD, body=BODY, fault=fault, fault_at=CUTS["in-a-header"])
    async with FakeEndpoint([whole, cut_off, whole, whole]) as ep:
        client = client_factory(ep.url, max_retries=RETRIES)
        first = await client.complete(MESSAGES)
        with pytest.raises(GridAgentError) as info:
            await client.complete(MESSAGES)
        posts = [r for r in ep.requests if r.method == "POST"]
        connections = len(ep.connections)
    assert first.text == "first"
    assert type(info.value) is MalformedResponseError
    assert len(posts) == 2
    assert connections == 1


class _TLSPartialServer:
    """A TLS server on 127.0.0.1 that reads each POST whole, counts it, sends the first
    ``cut`` bytes of HEAD, then closes (close_notify, FIN) or resets (RST).

    Written here rather than with FakeEndpoint: under TLS the fake's zero-limit drain waits
    for the client's next bytes, so its fault would come only after the client gave up.
    """

    def __init__(self, context: ssl.SSLContext, cut: int, fault: Fault) -> None:
        self.context = context
        self.cut = cut
        self.fault = fault
        self.posts = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one request on this connection, then break it."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            assert length is not None
            await reader.readexactly(int(length.group(1)))
            self.posts += 1
            writer.write(HEAD[: self.cut])
            await writer.drain()  # default limits: returns once the bytes are in the kernel
        except (OSError, asyncio.IncompleteReadError):
            writer.transport.abort()
            return
        if self.fault == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            writer.close()


@pytest.mark.parametrize(
    ("cut", "fault", "expected"),
    [
        pytest.param(CUTS["in-a-header"], "close", MalformedResponseError, id="head-cut-close"),
        pytest.param(CUTS["in-a-header"], "reset", MalformedResponseError, id="head-cut-reset"),
        pytest.param(0, "close", ConnectionLostError, id="no-byte-close"),
        pytest.param(0, "reset", ConnectionLostError, id="no-byte-reset"),
    ],
)
async def test_under_tls_only_response_bytes_count(
    client_factory: ClientFactory,
    tmp_path: Path,
    cut: int,
    fault: Fault,
    expected: type[GridAgentError],
) -> None:
    """Over TLS the same line holds: bytes of the TLS layer itself (the handshake, session
    tickets sent after it) are not response bytes; a cut-off head is sent once, a connection
    lost before any response byte is retried.

    Protects: the distinction is made on decrypted response bytes, so TLS endpoints get
    neither a duplicate POST nor a lost retry.
    """
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    server = _TLSPartialServer(context, cut, fault)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=context)
    try:
        port = listener.sockets[0].getsockname()[1]
        client = client_factory(
            f"https://127.0.0.1:{port}/v1/chat/completions",
            max_retries=RETRIES,
            ca_bundle=str(bundle),
        )
        with pytest.raises(GridAgentError) as info:
            await client.complete(MESSAGES)
    finally:
        listener.close()
        await listener.wait_closed()
    assert type(info.value) is expected
    assert server.posts == (1 if expected is MalformedResponseError else RETRIES + 1)
