"""A response that arrived but does not parse is a protocol error, never retried.

The endpoint that sent it received the request and may have acted on it (and billed it);
sending it again would do that twice. So is a response cut by a close or a reset once any
byte of it arrived, in its head or in its body. Only a connection lost before any response
byte is a transport failure the retry policy may retry. Each case is checked against the
fake's own record of the POSTs it received.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import UserMessage
from metacrate_grid_agent.errors import (
    ConnectionLostError,
    GridAgentError,
    MalformedResponseError,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from metacrate_grid_agent.testing._fake_wire import render_reply

if TYPE_CHECKING:
    from metacrate_grid_agent.testing._fake_wire import Fault
    from tests.llm_transport.conftest import ClientFactory

MESSAGES = [UserMessage(content="hello")]
BODY = b'{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}'
LENGTH = b"Content-Length: %d\r\n" % len(BODY)
RETRIES = 2


def _head(*lines: bytes) -> bytes:
    return b"\r\n".join(lines) + b"\r\n\r\n"


MALFORMED = [
    pytest.param(
        Reply(head=_head(b"HTTP/1.1 200 OK", b"X-Trace: a\x00b", LENGTH.strip()), body=BODY),
        id="nul-in-a-header",
    ),
    pytest.param(
        Reply(head=_head(b"HTTP/1.1 200 OK", b"Content-Length: 1x"), body=BODY), id="cl-1x"
    ),
    pytest.param(
        Reply(head=_head(b"HTTP/1.1 2000 OK", LENGTH.strip()), body=BODY), id="status-2000"
    ),
    pytest.param(Reply(head=_head(b"HTTP/1.1 204 No Content"), body=BODY), id="204-with-a-body"),
    pytest.param(Reply(head=_head(b"HTTP/1.1 103 Early Hints"), body=BODY), id="1xx-with-a-body"),
    pytest.param(Reply(head=_head(b"HTTP/1.1 2x0 OK"), body=b""), id="garbled-status-line"),
]


@pytest.mark.parametrize("reply", MALFORMED)
async def test_a_malformed_response_is_a_protocol_error_sent_once(
    client_factory: ClientFactory, reply: Reply
) -> None:
    """The endpoint received exactly one POST: a response that does not parse is not retried."""
    async with FakeEndpoint([reply] * (RETRIES + 1)) as ep:
        client = client_factory(ep.url, max_retries=RETRIES)
        with pytest.raises(GridAgentError) as info:
            await client.complete(MESSAGES)
        posts = [r for r in ep.requests if r.method == "POST"]
    assert type(info.value) is MalformedResponseError
    assert info.value.kind == "malformed_response"
    assert info.value.retryable is False
    assert info.value.attempts == 1
    assert len(posts) == 1


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply(fault="close", fault_at=0), id="closed-before-any-byte"),
        pytest.param(Reply(fault="reset", fault_at=0), id="reset-before-any-byte"),
    ],
)
async def test_a_connection_lost_without_a_whole_response_is_retried(
    client_factory: ClientFactory, reply: Reply
) -> None:
    """A connection that breaks before any byte of the response stays retryable: the
    endpoint sent nothing, so nothing says it acted on the request."""
    async with FakeEndpoint([reply] * (RETRIES + 1)) as ep:
        client = client_factory(ep.url, max_retries=RETRIES)
        with pytest.raises(ConnectionLostError) as info:
            await client.complete(MESSAGES)
        posts = [r for r in ep.requests if r.method == "POST"]
    assert info.value.retryable is True
    assert len(posts) == RETRIES + 1


def _cut_inside_the_body(fault: Fault, *, chunked: bool = False, status: int = 200) -> Reply:
    """A whole head and half of the body, then ``fault``."""
    reply = Reply(status=status, body=BODY + b" " * 200, chunked=chunked)
    raw = render_reply(reply, client_wants_close=False).raw
    head = raw.index(b"\r\n\r\n") + 4
    return dataclasses.replace(reply, fault=fault, fault_at=head + (len(raw) - head) // 2)


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(_cut_inside_the_body("close"), id="close-mid-body"),
        pytest.param(_cut_inside_the_body("reset"), id="reset-mid-body"),
        pytest.param(_cut_inside_the_body("close", chunked=True), id="close-mid-chunked-body"),
        pytest.param(_cut_inside_the_body("reset", status=201), id="reset-mid-201-body"),
    ],
)
async def test_a_connection_lost_inside_a_2xx_body_is_not_retried(
    client_factory: ClientFactory, reply: Reply
) -> None:
    """A 2xx head arrived and the connection was lost inside its body: the endpoint acted on
    the request (and a 2xx is paid), so it is sent once, like a head cut partway, and the
    call fails as ``malformed_response`` (not retryable), saying that the body was cut."""
    async with FakeEndpoint([reply] * (RETRIES + 1)) as ep:
        client = client_factory(ep.url, max_retries=RETRIES)
        with pytest.raises(GridAgentError) as info:
            await client.complete(MESSAGES)
        await ep.wait_all_closed()
        posts = [r for r in ep.requests if r.method == "POST"]
    error = info.value
    assert type(error) is MalformedResponseError
    assert (error.kind, error.retryable, error.attempts) == ("malformed_response", False, 1)
    assert "inside the response body" in str(error)
    assert "not retried" in str(error)
    assert len(posts) == 1
    assert ep.pending_replies == RETRIES
