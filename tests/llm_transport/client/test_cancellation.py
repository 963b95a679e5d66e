"""A call of `LLMClient` can be cancelled at any moment, and leaves nothing behind.

Two ways in: asyncio task cancellation (``task.cancel()``: `asyncio.CancelledError` propagates
unchanged) and an explicit `CancelToken` (``token.cancel("shutdown")``: the call raises
`CancelledByCallerError` with that reason, and the task is not left cancelling). In every
phase (waiting for a concurrency slot, connecting, waiting for headers, mid-body, sleeping
before a retry) the call returns within `BOUND_S`, no retry starts, no task is left running,
and the fake sees a half-read connection closed by the client (a connection whose response
was read whole, as before a retry, stays healthy in the pool and serves the next call).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import pytest

from metacrate_grid_agent import CancelToken, LLMClient, UserMessage
from metacrate_grid_agent.errors import CancelledByCallerError
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply

# The one loopback peer that never answers a SYN; shared with the connect-timeout tests.
from tests.llm_transport.support import head_length, unanswered_listener

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

MESSAGES = [UserMessage(content="hello")]
BOUND_S = 2.0
"""A cancelled call must return within this; every stall below is far longer."""
STALL_S = 10.0
"""The fake's stall: five times `BOUND_S`, and cut short as soon as the client leaves."""
IN_CONNECT_S = 0.1
"""How long a call to an unanswered port runs before it is cancelled (its connect takes 10 s)."""
POLL_S = 0.005
"""Poll interval for the fake's byte counters, which signal no event per write."""
REASON = "shutdown"

Mechanism = Literal["task", "token"]
MECHANISMS: tuple[Mechanism, ...] = ("task", "token")


def other_tasks() -> set[asyncio.Task[Any]]:
    """Every live task of the loop except the test's own."""
    current = asyncio.current_task()
    return {task for task in asyncio.all_tasks() if task is not current}


async def cancel_during(
    client: LLMClient,
    mechanism: Mechanism,
    reached: Callable[[asyncio.Task[Any]], Awaitable[None]],
) -> CancelledByCallerError | None:
    """Start a call, wait until `reached`, cancel it one way, and check it returned promptly.

    Returns the token's error, or None for task cancellation (after checking that
    `asyncio.CancelledError` came out of the call unchanged).
    """
    token = CancelToken()

    async def call() -> tuple[CancelledByCallerError, int]:
        try:
            await client.complete(
                MESSAGES, request_id="cancelled", cancel=token if mechanism == "token" else None
            )
        except CancelledByCallerError as exc:
            me = asyncio.current_task()
            assert me is not None
            return exc, me.cancelling()
        raise AssertionError("the call completed although it was cancelled")

    task = asyncio.create_task(call())
    await reached(task)
    assert not task.done(), "the call ended before the moment it was to be cancelled"
    if mechanism == "task":
        task.cancel()
    else:
        assert token.cancel(REASON) is True
    async with asyncio.timeout(BOUND_S):
        await asyncio.wait({task})

    if mechanism == "task":
        assert task.cancelled(), f"CancelledError did not propagate: {task!r}"
        return None
    error, cancelling = task.result()
    assert (error.kind, error.reason, error.retryable) == ("cancelled", REASON, False)
    assert error.request_id == "cancelled"
    assert cancelling == 0, "the token's cancellation was left pending on the task"
    return error


# -- the phases --------------------------------------------------------------------------------


class FailedAttempts(logging.Handler):
    """Sets `logged` when the client logs a failed attempt (just before it sleeps to retry)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.logged = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "outcome", "ok") != "ok":
            self.logged.set()


@pytest.fixture
def failed_attempts() -> Iterator[FailedAttempts]:
    """Listen to the client's per-attempt log records for the duration of a test."""
    logger = logging.getLogger("metacrate_grid_agent")
    handler = FailedAttempts()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


Reached = Callable[[FakeEndpoint, FailedAttempts], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class Phase:
    """A moment of a call: the script that holds it there, and how to know it got there.

    `closes` says whether cancelling must close the connection (a half-read one must; one
    whose response was read whole is back in the pool); `follow_up_on` is the connection the
    next call uses (None: either, the cancelled connect may or may not have been accepted).
    """

    script: tuple[Reply, ...]
    limits: dict[str, Any]
    reached: Reached
    requests: int
    attempts: int
    closes: bool
    follow_up_on: int | None


async def _just_started(_ep: FakeEndpoint, _log: FailedAttempts) -> None:
    await asyncio.sleep(0)  # one step: the call runs up to its first suspension, the connect


async def _first_request(ep: FakeEndpoint, _log: FailedAttempts) -> None:
    await ep.wait_for_request(0)


def _bytes_sent(count: int) -> Reached:
    async def reached(ep: FakeEndpoint, _log: FailedAttempts) -> None:
        request = await ep.wait_for_request(0)
        connection = ep.connections[request.connection_id]
        async with asyncio.timeout(BOUND_S):
            # The fake signals no event per write, so poll its counter (bounded by the timeout).
            while connection.bytes_sent < count:  # noqa: ASYNC110 - no event to wait on
                await asyncio.sleep(POLL_S)

    return reached


async def _retry_delay(_ep: FakeEndpoint, log: FailedAttempts) -> None:
    # The failed attempt is logged, then the client sleeps without yielding in between.
    async with asyncio.timeout(BOUND_S):
        await log.logged.wait()


_BODY = Reply.completion("stalls after a few body bytes")
_MID_BODY = head_length(_BODY) + 5

PHASES = {
    "connect": Phase(
        script=(),
        limits={},
        reached=_just_started,
        requests=0,
        attempts=1,
        closes=False,
        follow_up_on=None,
    ),
    "waiting-for-headers": Phase(
        script=(dataclasses.replace(_BODY, stall_before_headers_s=STALL_S),),
        limits={},
        reached=_first_request,
        requests=1,
        attempts=1,
        closes=True,
        follow_up_on=1,
    ),
    "mid-body": Phase(
        script=(dataclasses.replace(_BODY, stall_at=(_MID_BODY, STALL_S)),),
        limits={},
        reached=_bytes_sent(_MID_BODY),
        requests=1,
        attempts=1,
        closes=True,
        follow_up_on=1,
    ),
    "retry-delay": Phase(
        # Retry-After 5 s is honoured (ceiling 10 s, budget 30 s): the sleep is long.
        script=(Reply.error(503, "busy", headers=(("Retry-After", "5"),)),),
        limits={"max_retry_delay_s": 10.0, "total_timeout_s": 30.0},
        reached=_retry_delay,
        requests=1,
        attempts=1,
        closes=False,
        follow_up_on=0,
    ),
}


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("phase", PHASES.values(), ids=PHASES.keys())
async def test_cancel_at_any_moment_returns_promptly_and_starts_no_retry(
    client_factory: ClientFactory,
    failed_attempts: FailedAttempts,
    phase: Phase,
    mechanism: Mechanism,
) -> None:
    """Cancelling returns promptly, closes a half-read connection, retries nothing, leaks nothing.

    Each script holds only the replies of its phase, so a retry would also fail the fake.
    The next call on the same client (one concurrency slot) then goes through: the cancelled
    call gave its slot back, and its connection is either closed or healthy in the pool.
    """
    before = other_tasks()
    async with FakeEndpoint(phase.script) as ep:
        client = client_factory(ep.url, max_concurrent_requests=1, **phase.limits)

        async def reached(_task: asyncio.Task[Any]) -> None:
            await phase.reached(ep, failed_attempts)

        error = await cancel_during(client, mechanism, reached)
        if phase.closes:
            assert (await ep.wait_closed(0)).closed_by == "client"
        assert len(ep.requests) == phase.requests

        ep.push(Reply.completion("after"))
        async with asyncio.timeout(BOUND_S):
            completion = await client.complete(MESSAGES)
        assert completion.text == "after"
        if phase.follow_up_on is not None:
            assert ep.requests[-1].connection_id == phase.follow_up_on
        await client.aclose()
        await ep.wait_all_closed()

        assert len(ep.requests) == phase.requests + 1
        assert [c.closed_by for c in ep.connections] == ["client"] * len(ep.connections)
    assert other_tasks() - before == set()
    if error is not None:
        assert error.attempts == phase.attempts


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_cancel_while_connecting_to_an_unanswered_port(
    client_factory: ClientFactory, mechanism: Mechanism
) -> None:
    """A call stuck in the TCP handshake is cancelled at once, long before connect_timeout_s."""
    async with unanswered_listener() as url:
        before = other_tasks()
        client = client_factory(url, connect_timeout_s=STALL_S, request_timeout_s=STALL_S,
                                total_timeout_s=STALL_S)  # fmt: skip

        async def in_connect(task: asyncio.Task[Any]) -> None:
            await asyncio.wait({task}, timeout=IN_CONNECT_S)

        error = await cancel_during(client, mechanism, in_connect)
        assert other_tasks() - before == set()
    if error is not None:
        assert error.attempts == 1  # the connect was begun: an attempt was made


async def test_token_cancelled_before_the_call_raises_at_once_without_connecting(
    client_factory: ClientFactory,
) -> None:
    """A token already cancelled stops the call before anything is sent or even connected."""
    token = CancelToken()
    token.cancel(REASON)
    async with FakeEndpoint([]) as ep:
        client = client_factory(ep.url)
        async with asyncio.timeout(BOUND_S):
            with pytest.raises(CancelledByCallerError) as info:
                await client.complete(MESSAGES, request_id="early", cancel=token)

    assert (info.value.kind, info.value.reason, info.value.attempts) == ("cancelled", REASON, 0)
    assert info.value.request_id == "early"
    assert ep.connections == []
    assert ep.requests == []


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_cancel_while_waiting_for_a_concurrency_slot(
    client_factory: ClientFactory, mechanism: Mechanism
) -> None:
    """A call queued for a slot is cancelled at once; the call holding the slot is untouched."""
    held = asyncio.Event()

    async def hold(_request: RecordedRequest) -> Reply:
        await held.wait()
        return Reply.completion("holder")

    before = other_tasks()
    async with FakeEndpoint([hold]) as ep:
        client = client_factory(ep.url, max_concurrent_requests=1)
        try:
            holder = asyncio.create_task(client.complete(MESSAGES, request_id="holder"))
            await ep.wait_for_request(0)

            async def queued(_task: asyncio.Task[Any]) -> None:
                await asyncio.sleep(0)  # one step: the call runs up to its wait for the slot

            error = await cancel_during(client, mechanism, queued)
            assert not holder.done()
        finally:
            held.set()
        async with asyncio.timeout(BOUND_S):
            completion = await holder

        assert completion.text == "holder"
        assert [r.header("X-Request-Id") for r in ep.requests] == ["holder"]
        assert len(ep.connections) == 1
    assert other_tasks() - before == set()
    if error is not None:
        assert error.attempts == 0
