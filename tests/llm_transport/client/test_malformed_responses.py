"""A response that arrived but does not parse is a protocol error, never retried.

The endpoint that sent it received the request and may have acted on it (and billed it);
sending it again would do that twice. Only a connection lost before any response byte, or
reset in the middle of a body, is a transport failure the retry policy may retry. Each
case is checked against the fake's own record of the POSTs it received.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import UserMessage
from metacrate_grid_agent.errors import (
    ConnectionLostError,
    GridAgentError,
    MalformedResponseError,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply

if TYPE_CHECKING:
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
        pytest.param(Reply(body=BODY, fault="reset", fault_at=80), id="reset-mid-body"),
    ],
)
async def test_a_connection_lost_without_a_whole_response_is_retried(
    client_factory: ClientFactory, reply: Reply
) -> None:
    """A connection that breaks before the response or inside its body stays retryable."""
    async with FakeEndpoint([reply] * (RETRIES + 1)) as ep:
        client = client_factory(ep.url, max_retries=RETRIES)
        with pytest.raises(ConnectionLostError) as info:
            await client.complete(MESSAGES)
        posts = [r for r in ep.requests if r.method == "POST"]
    assert info.value.retryable is True
    assert len(posts) == RETRIES + 1
