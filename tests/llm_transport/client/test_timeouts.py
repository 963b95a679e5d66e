"""Each of the five timeouts of `LLMClient` fires as its own kind, and is retried per its flag.

Every limit here is short (0.2 to 0.6 s) and set against a much longer stall of the fake (10 s),
so which timer fires never depends on scheduling luck. The connect timeout needs a peer that
never answers a SYN: `unanswered_listener` is a loopback socket whose accept queue is full (the
kernel drops further SYNs); the mapping of the HTTP layer's timeout failures is also pinned
directly on the translation edge, `translate`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import UserMessage
from metacrate_grid_agent._aio._http import ConnectExpiredError, HTTPLayerError, IdleExpiredError
from metacrate_grid_agent._aio._translate import translate
from metacrate_grid_agent._core._redact import NO_KEY
from metacrate_grid_agent.errors import (
    ConnectTimeoutError,
    RequestTimeoutError,
    ResponseIdleTimeoutError,
    TimeoutExpiredError,
    TotalTimeoutError,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from metacrate_grid_agent.testing._fake_wire import render_reply
from tests.llm_transport.support import head_length, make_config, unanswered_listener

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

MESSAGES = [UserMessage(content="hello")]
LIMIT_S = 0.2
"""The timeout under test."""
STALL_S = 10.0
"""The fake's stall: fifty times the limit, and cut short as soon as the client leaves."""


# -- connect timeout -------------------------------------------------------------------------


@pytest.mark.parametrize("max_retries", [0, 1])
async def test_connect_timeout_fires_as_its_own_kind(
    client_factory: ClientFactory, max_retries: int
) -> None:
    """A peer that never answers the SYN gives ConnectTimeoutError, retried (it is transient)."""
    async with unanswered_listener() as url:
        client = client_factory(url, connect_timeout_s=LIMIT_S, max_retries=max_retries)
        with pytest.raises(ConnectTimeoutError) as info:
            await client.complete(MESSAGES)

    error = info.value
    assert (error.kind, error.retryable) == ("connect_timeout", True)
    assert error.attempts == max_retries + 1
    assert error.elapsed_s >= LIMIT_S * (max_retries + 1)


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        pytest.param(ConnectExpiredError(), ConnectTimeoutError, id="connect"),
        pytest.param(IdleExpiredError(), ResponseIdleTimeoutError, id="response-idle"),
    ],
)
def test_translate_maps_the_http_layers_timeouts(
    raised: HTTPLayerError, expected: type[TimeoutExpiredError]
) -> None:
    """The HTTP layer's timeouts map to our own kinds, retryable and unchained."""
    config = make_config("http://127.0.0.1:9/v1/chat/completions")
    error = translate(raised, config, NO_KEY)

    assert type(error) is expected
    assert error.retryable is True
    assert error.__cause__ is None
    assert error.__context__ is None


# -- request and idle timeouts -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TimeoutCase:
    """A reply that stalls one way, the limits that catch it, and what the client must report."""

    reply: Reply
    limits: dict[str, Any]
    error: type[TimeoutExpiredError]
    kind: str
    min_sent: int
    max_sent: int | None


def _stall_before_headers() -> TimeoutCase:
    reply = dataclasses.replace(Reply.completion("late"), stall_before_headers_s=STALL_S)
    limits = {"response_idle_timeout_s": LIMIT_S}
    return TimeoutCase(reply, limits, ResponseIdleTimeoutError, "response_idle_timeout", 0, 0)


def _stall_mid_body() -> TimeoutCase:
    reply = Reply.completion("stalls after a few body bytes")
    at = head_length(reply) + 5
    reply = dataclasses.replace(reply, stall_at=(at, STALL_S))
    limits = {"response_idle_timeout_s": LIMIT_S}
    return TimeoutCase(reply, limits, ResponseIdleTimeoutError, "response_idle_timeout", at, at)


def _drip() -> TimeoutCase:
    """256 bytes every 20 ms: never idle for the 5 s idle limit, but 10 s in all."""
    piece, interval = 256, 0.02
    reply = Reply.completion("x" * int(piece * STALL_S / interval))
    reply = dataclasses.replace(reply, drip_bytes=piece, drip_interval_s=interval)
    assert head_length(reply) < piece  # the first piece already carries body bytes
    limits = {"request_timeout_s": 0.3, "connect_timeout_s": 0.3, "response_idle_timeout_s": 5.0}
    total = len(render_reply(reply, client_wants_close=False).raw)
    return TimeoutCase(reply, limits, RequestTimeoutError, "request_timeout", piece, total - 1)


@pytest.mark.parametrize("max_retries", [0, 1])
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(_stall_before_headers(), id="idle-before-headers"),
        pytest.param(_stall_mid_body(), id="idle-mid-body"),
        pytest.param(_drip(), id="request-timeout-slow-drip"),
    ],
)
async def test_request_and_idle_timeouts_fire_as_their_own_kind_and_are_retried(
    client_factory: ClientFactory, case: TimeoutCase, max_retries: int
) -> None:
    """A silent or a slow endpoint is cut off by its own timer, reported as that kind, retried.

    Request and idle timeouts are transient, so max_retries=1 makes exactly two requests;
    every connection is closed by the client, at the byte where the fake stalled.
    """
    attempts = max_retries + 1
    async with FakeEndpoint([case.reply] * attempts) as ep:
        client = client_factory(ep.url, max_retries=max_retries, **case.limits)
        with pytest.raises(case.error) as info:
            await client.complete(MESSAGES)
        connections = [await ep.wait_closed(i) for i in range(attempts)]

    error = info.value
    assert type(error) is case.error
    assert (error.kind, error.retryable, error.attempts) == (case.kind, True, attempts)
    assert len(ep.requests) == attempts
    assert len(ep.connections) == attempts
    assert [c.closed_by for c in connections] == ["client"] * attempts
    for connection in connections:
        assert connection.bytes_sent >= case.min_sent
        if case.max_sent is not None:
            assert connection.bytes_sent <= case.max_sent


@pytest.mark.slow
async def test_a_body_that_keeps_coming_within_the_idle_limit_completes(
    client_factory: ClientFactory,
) -> None:
    """The idle limit is the longest silence, not the longest response: a reply dripped in
    pieces 20 ms apart for about a second completes under a 0.3 s idle limit (the one timer
    of the request is re-armed each time it finds bytes arrived since)."""
    reply = Reply.completion("y" * 1000)
    reply = dataclasses.replace(reply, drip_bytes=24, drip_interval_s=0.02)
    async with FakeEndpoint([reply]) as ep:
        client = client_factory(ep.url, max_retries=0, response_idle_timeout_s=LIMIT_S + 0.1)
        completion = await client.complete(MESSAGES)
    assert completion.text == "y" * 1000
    assert completion.latency_s > 2 * (LIMIT_S + 0.1)
    assert len(ep.requests) == 1


# -- total timeout ---------------------------------------------------------------------------

_STALLED = dataclasses.replace(Reply.completion("never"), stall_before_headers_s=STALL_S)


async def test_total_timeout_cuts_the_only_attempt_and_is_not_retried(
    client_factory: ClientFactory,
) -> None:
    """When the total deadline ends an attempt, it is reported as total_timeout, never retried."""
    limits = {"connect_timeout_s": 0.3, "request_timeout_s": 0.3, "total_timeout_s": 0.3}
    async with FakeEndpoint([_STALLED]) as ep:
        client = client_factory(ep.url, max_retries=5, **limits)
        with pytest.raises(TotalTimeoutError) as info:
            await client.complete(MESSAGES)
        connection = await ep.wait_closed(0)

    error = info.value
    assert (error.kind, error.retryable, error.attempts) == ("total_timeout", False, 1)
    assert len(ep.requests) == 1
    assert connection.closed_by == "client"


async def test_total_timeout_spans_several_slow_attempts(client_factory: ClientFactory) -> None:
    """Attempts each within request_timeout_s still cannot pass total_timeout_s together.

    Attempt 1 ends by its 0.3 s request timeout and is retried after at most 10 ms; attempt 2
    would end at 0.6 s or later, so the 0.6 s total deadline cuts it: TotalTimeoutError,
    after exactly two requests, with no third attempt.
    """
    limits = {
        "connect_timeout_s": 0.3,
        "request_timeout_s": 0.3,
        "total_timeout_s": 0.6,
        "max_retry_delay_s": 0.01,
    }
    async with FakeEndpoint([_STALLED, _STALLED]) as ep:
        client = client_factory(ep.url, max_retries=5, **limits)
        with pytest.raises(TotalTimeoutError) as info:
            await client.complete(MESSAGES)
        connections = [await ep.wait_closed(i) for i in range(2)]

    error = info.value
    assert (error.kind, error.retryable, error.attempts) == ("total_timeout", False, 2)
    assert error.elapsed_s >= limits["total_timeout_s"]
    assert len(ep.requests) == 2
    assert [c.closed_by for c in connections] == ["client", "client"]


# -- pool idle timeout ---------------------------------------------------------------------------


async def test_idle_pooled_connection_is_closed_and_a_new_one_opened(
    client_factory: ClientFactory,
) -> None:
    """A kept-alive connection idle past pool_idle_timeout_s is closed by the client, not reused."""
    async with FakeEndpoint([Reply.completion("one"), Reply.completion("two")]) as ep:
        client = client_factory(ep.url, pool_idle_timeout_s=0.05)
        await client.complete(MESSAGES)
        first = await ep.wait_closed(0)
        assert first.closed_by == "client"
        await client.complete(MESSAGES)

        assert [r.connection_id for r in ep.requests] == [0, 1]
        assert len(ep.connections) == 2


async def test_connection_is_reused_within_pool_idle_timeout(
    client_factory: ClientFactory,
) -> None:
    """Back-to-back calls within pool_idle_timeout_s share one kept-alive connection."""
    async with FakeEndpoint([Reply.completion("one"), Reply.completion("two")]) as ep:
        client = client_factory(ep.url, pool_idle_timeout_s=5.0)
        await client.complete(MESSAGES)
        await client.complete(MESSAGES)

        assert [r.connection_id for r in ep.requests] == [0, 0]
        assert len(ep.connections) == 1
        assert ep.connections[0].closed is False
