"""Transient-only retries of `LLMClient`, checked against what the loopback fake recorded.

The delays themselves are pinned by the pure policy tests (`tests/core/test_retry_policy.py`);
here every ceiling is tiny (`max_retry_delay_s` 0.05 from `make_config`) so the suite stays
fast, and the checks are on the wire: how many requests the fake saw, and the attempt history
the client reports. Each script holds exactly the replies a correct client asks for, so an
extra retry also fails the test loudly as "script exhausted".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import AttemptRecord, Completion, UserMessage
from metacrate_grid_agent._core._retry import DEFAULT_BASE_DELAY_S, backoff_delay
from metacrate_grid_agent.errors import (
    EmptyChoicesError,
    HTTPStatusError,
    MalformedJSONError,
    MissingMemberError,
    ResponseError,
)
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

MESSAGES = [UserMessage(content="hello")]
CEILING_S = 0.05
"""`max_retry_delay_s` of every client here unless a test says otherwise (`make_config`)."""

RETRYABLE = (408, 425, 429, 500, 502, 503, 504)
NOT_RETRYABLE = (400, 401, 403, 404, 409, 413, 422, 501, 505)


def jitter(request_id: str, attempt: int, *, cap_s: float = CEILING_S) -> float:
    """The jittered delay the pure policy chooses after `attempt` of `request_id` failed."""
    return backoff_delay(request_id, attempt, base_s=DEFAULT_BASE_DELAY_S, cap_s=cap_s)


def busy(_request: RecordedRequest) -> Reply:
    """A responder that answers every request 503."""
    return Reply.error(503, "busy")


async def fail_once_then_succeed(
    client_factory: ClientFactory, first: Reply, *, request_id: str
) -> tuple[Completion, FakeEndpoint]:
    """Run one call against the script [`first`, a good completion]; return it and the fake."""
    async with FakeEndpoint([first, Reply.completion("ok")]) as ep:
        client = client_factory(ep.url)
        completion = await client.complete(MESSAGES, request_id=request_id)
    return completion, ep


# -- which statuses are retried ----------------------------------------------------------------


@pytest.mark.parametrize("status", RETRYABLE)
async def test_transient_status_is_retried_once_then_succeeds(
    client_factory: ClientFactory, status: int
) -> None:
    """Each transient status (408, 425, 429, 5xx gateway) is retried, and the history says so."""
    rid = f"transient-{status}"
    completion, ep = await fail_once_then_succeed(
        client_factory, Reply.error(status, "try later"), request_id=rid
    )

    assert len(ep.requests) == 2
    assert [r.header("X-Request-Id") for r in ep.requests] == [rid, rid]
    assert ep.requests[0].body == ep.requests[1].body
    assert completion.text == "ok"
    assert completion.attempts == 2
    first, second = completion.attempt_records
    assert first == AttemptRecord(
        attempt=1,
        outcome="error",
        status=status,
        error_kind="http_status",
        latency_s=first.latency_s,
        delay_s=jitter(rid, 1),
        delay_source="jitter",
    )
    assert (second.attempt, second.outcome, second.status) == (2, "ok", 200)
    assert (second.delay_s, second.delay_source) == (None, None)


@pytest.mark.parametrize("status", NOT_RETRYABLE)
async def test_permanent_status_is_not_retried(client_factory: ClientFactory, status: int) -> None:
    """Every other status is deterministic for the same bytes: exactly one request is sent."""
    async with FakeEndpoint([Reply.error(status, "no")]) as ep:
        client = client_factory(ep.url)
        with pytest.raises(HTTPStatusError) as info:
            await client.complete(MESSAGES, request_id="permanent")

    assert len(ep.requests) == 1
    error = info.value
    assert (error.status, error.retryable, error.attempts) == (status, False, 1)
    assert error.request_id == "permanent"


# -- transport failures --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(Reply(fault="reset", fault_at=0), id="reset-before-any-byte"),
        pytest.param(Reply(fault="close", fault_at=0), id="closed-before-any-byte"),
        # A connection lost partway through the head (test_partial_head.py) or inside a 2xx
        # body (test_malformed_responses.py) is not retried: the endpoint has answered.
    ],
)
async def test_lost_connection_is_retried_and_second_attempt_succeeds(
    client_factory: ClientFactory, first: Reply
) -> None:
    """A connection lost before any byte of the response is transient: retried, then ok."""
    completion, ep = await fail_once_then_succeed(client_factory, first, request_id="lost")

    assert len(ep.requests) == 2
    assert ep.connections[0].closed_by == "server"
    assert ep.requests[1].connection_id != ep.requests[0].connection_id
    assert completion.text == "ok"
    assert completion.attempts == 2
    first_record = completion.attempt_records[0]
    assert (first_record.outcome, first_record.status, first_record.error_kind) == (
        "error",
        None,
        "connection_lost",
    )
    assert (first_record.delay_s, first_record.delay_source) == (jitter("lost", 1), "jitter")


@pytest.mark.parametrize(
    ("reply", "error_type"),
    [
        pytest.param(
            Reply(headers=(("Content-Type", "application/json"),), body=b"{not json"),
            MalformedJSONError,
            id="bad-json",
        ),
        pytest.param(
            Reply(headers=(("Content-Type", "application/json"),), body=b'{"choices": ['),
            MalformedJSONError,
            id="truncated-json",
        ),
        pytest.param(Reply.json({"choices": []}), EmptyChoicesError, id="empty-choices"),
        pytest.param(
            Reply.json({"object": "chat.completion"}), MissingMemberError, id="no-choices"
        ),
    ],
)
async def test_malformed_success_reply_is_never_retried(
    client_factory: ClientFactory, reply: Reply, error_type: type[ResponseError]
) -> None:
    """A 2xx that cannot be used is the endpoint's deterministic answer: one request only."""
    async with FakeEndpoint([reply]) as ep:
        client = client_factory(ep.url)
        with pytest.raises(error_type) as info:
            await client.complete(MESSAGES)

    assert len(ep.requests) == 1
    assert (info.value.retryable, info.value.attempts) == (False, 1)


# -- how many retries ----------------------------------------------------------------------------


@pytest.mark.parametrize("max_retries", [0, 1, 2])
async def test_at_most_max_retries_then_last_error(
    client_factory: ClientFactory, max_retries: int
) -> None:
    """An endpoint that is always busy gets max_retries + 1 requests, then the last 503."""
    async with FakeEndpoint(responder=busy) as ep:
        client = client_factory(ep.url, max_retries=max_retries)
        with pytest.raises(HTTPStatusError) as info:
            await client.complete(MESSAGES)

    assert len(ep.requests) == max_retries + 1
    assert (info.value.status, info.value.attempts) == (503, max_retries + 1)
    assert info.value.retryable is True


# -- Retry-After -----------------------------------------------------------------------------------

HTTP_DATE = "Wed, 21 Oct 2015 07:28:00 GMT"


@pytest.mark.parametrize(
    ("headers", "expected_delay_s"),
    [
        pytest.param((("Retry-After", "0.01"),), 0.01, id="retry-after-decimal"),
        pytest.param((("Retry-After", "0"),), 0.0, id="retry-after-zero"),
        pytest.param((("retry-after-ms", "20"),), 0.02, id="retry-after-ms"),
        pytest.param((("Retry-After", "0.04"), ("retry-after-ms", "20")), 0.02, id="ms-read-first"),
        pytest.param(
            (("Retry-After", "0.01"), ("retry-after-ms", "soon")),
            0.01,
            id="invalid-ms-falls-back-to-retry-after",
        ),
    ],
)
async def test_retry_after_within_ceiling_is_honoured(
    client_factory: ClientFactory, headers: tuple[tuple[str, str], ...], expected_delay_s: float
) -> None:
    """A server hint of at most max_retry_delay_s is the delay, retry-after-ms read first."""
    first = Reply.error(429, "slow down", headers=headers)
    completion, ep = await fail_once_then_succeed(client_factory, first, request_id="hinted")

    assert len(ep.requests) == 2
    record = completion.attempt_records[0]
    assert (record.status, record.delay_source, record.delay_s) == (
        429,
        "retry_after",
        expected_delay_s,
    )


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param((("Retry-After", "3600"),), id="over-ceiling"),
        pytest.param((("retry-after-ms", "3600000"),), id="ms-over-ceiling"),
        pytest.param((("Retry-After", "soon"),), id="word"),
        pytest.param((("Retry-After", HTTP_DATE),), id="http-date"),
        pytest.param((("Retry-After", "-1"),), id="negative"),
        pytest.param((("Retry-After", "1e-3"),), id="exponent"),
        pytest.param((("Retry-After", "inf"),), id="infinity"),
        pytest.param((("Retry-After", ""),), id="empty"),
    ],
)
async def test_unusable_retry_after_falls_back_to_jitter(
    client_factory: ClientFactory, headers: tuple[tuple[str, str], ...]
) -> None:
    """An over-ceiling or invalid hint never stalls the agent: the jittered backoff is used."""
    first = Reply.error(503, "busy", headers=headers)
    completion, ep = await fail_once_then_succeed(client_factory, first, request_id="unhinted")

    assert len(ep.requests) == 2
    record = completion.attempt_records[0]
    assert (record.delay_source, record.delay_s) == ("jitter", jitter("unhinted", 1))
    assert record.delay_s is not None
    assert CEILING_S / 2 <= record.delay_s <= CEILING_S


# -- deterministic jitter ------------------------------------------------------------------------


async def delay_schedule(client_factory: ClientFactory, request_id: str) -> list[float | None]:
    """The delays a fresh client waits for `request_id` against [503, 503, ok]."""
    script = [Reply.error(503, "busy"), Reply.error(503, "busy"), Reply.completion("ok")]
    async with FakeEndpoint(script) as ep:
        client = client_factory(ep.url)
        completion = await client.complete(MESSAGES, request_id=request_id)
    assert len(ep.requests) == 3
    return [record.delay_s for record in completion.attempt_records]


async def test_same_request_id_gives_same_delays_across_clients(
    client_factory: ClientFactory,
) -> None:
    """Jitter derives from the request id, not a random source: logs and tests reproduce."""
    first = await delay_schedule(client_factory, "agent-7")
    second = await delay_schedule(client_factory, "agent-7")
    other = await delay_schedule(client_factory, "agent-8")

    assert first == second == [jitter("agent-7", 1), jitter("agent-7", 2), None]
    assert other == [jitter("agent-8", 1), jitter("agent-8", 2), None]
    assert other != first


# -- the total deadline --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param((("Retry-After", "5"),), id="retry-after-past-deadline"),
        pytest.param((), id="jitter-past-deadline"),
    ],
)
async def test_no_retry_starts_that_would_end_past_the_total_deadline(
    client_factory: ClientFactory, headers: tuple[tuple[str, str], ...]
) -> None:
    """A delay that would end past total_timeout_s is not slept: the last error comes at once.

    With a 10 s ceiling the 5 s hint is honoured, and the jitter's floor is half of
    min(10, 0.5) = 0.25 s; both are past the 0.2 s budget.
    """
    limits = {
        "connect_timeout_s": 0.2,
        "request_timeout_s": 0.2,
        "total_timeout_s": 0.2,
        "max_retry_delay_s": 10.0,
    }
    async with FakeEndpoint([Reply.error(503, "busy", headers=headers)]) as ep:
        client = client_factory(ep.url, **limits)
        with pytest.raises(HTTPStatusError) as info:
            await client.complete(MESSAGES)

    assert len(ep.requests) == 1
    error = info.value
    assert type(error) is HTTPStatusError
    assert (error.status, error.attempts) == (503, 1)
    assert error.elapsed_s < limits["total_timeout_s"]
