"""At most `max_concurrent_requests` calls of one `LLMClient` are in flight; the rest wait.

The fake's responder holds every reply until the test releases it, so the slots are provably
busy while the other calls queue; the fake's high-water marks (connections open at once,
requests served at once) are the evidence, not the client's own bookkeeping.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import Completion, UserMessage
from metacrate_grid_agent.errors import GridAgentError, TotalTimeoutError
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from tests.llm_transport.conftest import ClientFactory

MESSAGES = [UserMessage(content="hello")]
CALLS = 6
NO_MORE_S = 0.2
"""How long no further request may arrive while the slots are full (loopback takes ~1 ms)."""


async def outcome(call: Awaitable[Completion]) -> Completion | GridAgentError:
    """The call's completion, or the library error it raised."""
    try:
        return await call
    except GridAgentError as exc:
        return exc


class Gate:
    """A responder that holds every reply until `release`, then answers with a completion."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def __call__(self, request: RecordedRequest) -> Reply:
        await self.released.wait()
        return Reply.completion(f"reply {request.index}")

    def release(self) -> None:
        """Let every held reply (and every later one) go."""
        self.released.set()


@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_in_flight_requests_never_exceed_the_limit(
    client_factory: ClientFactory, limit: int
) -> None:
    """Six concurrent calls with max_concurrent_requests=N: never more than N on the wire.

    With N replies held, no further request may reach the fake; once released, every call
    completes, and the fake's high-water marks of open connections and requests in flight
    are exactly N.
    """
    gate = Gate()
    async with FakeEndpoint(responder=gate) as ep:
        client = client_factory(ep.url, max_concurrent_requests=limit)
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(client.complete(MESSAGES, request_id=f"call-{i}"))
                    for i in range(CALLS)
                ]
                await ep.wait_for_request(limit - 1)
                with pytest.raises(TimeoutError, match="no request"):
                    await ep.wait_for_request(limit, timeout_s=NO_MORE_S)
                assert ep.open_connections == limit
                assert not any(task.done() for task in tasks)
                gate.release()
        finally:
            gate.release()
        results: list[Completion] = [task.result() for task in tasks]

    assert sorted(c.request_id for c in results) == [f"call-{i}" for i in range(CALLS)]
    assert all(c.attempts == 1 for c in results)
    assert len(ep.requests) == CALLS
    assert ep.max_concurrent_connections == limit
    assert ep.max_concurrent_requests == limit


async def test_waiting_for_a_slot_counts_toward_the_total_deadline(
    client_factory: ClientFactory,
) -> None:
    """A call queued behind busy slots fails at its own total_timeout_s, wait included.

    All calls of one client share total_timeout_s (T = 0.5 s), so the two holders, started
    first, expire just before the waiter and leave it at most a few milliseconds of budget.
    If the wait did not count, the waiter would get a fresh T after the slot freed and fail
    near 2T; counting it, the waiter fails at T after its own start. Every reply is held, so
    nothing the waiter sends in its last milliseconds can complete. (The fake's high-water
    marks are not checked here: a holder's connection, closed at its deadline, may still look
    open to the fake when the waiter connects, and the fake counts a held request as in flight
    until its responder returns.)
    """
    total_s = 0.5
    limits = {"connect_timeout_s": total_s, "request_timeout_s": total_s}
    gate = Gate()
    loop = asyncio.get_running_loop()
    async with FakeEndpoint(responder=gate) as ep:
        client = client_factory(
            ep.url, max_concurrent_requests=2, total_timeout_s=total_s, **limits
        )
        try:
            async with asyncio.TaskGroup() as group:
                holders = [
                    group.create_task(outcome(client.complete(MESSAGES, request_id=f"holder-{i}")))
                    for i in range(2)
                ]
                await ep.wait_for_request(1)
                waiter_started = loop.time()
                with pytest.raises(TotalTimeoutError) as info:
                    await client.complete(MESSAGES, request_id="waiter")
                waited = loop.time() - waiter_started
            gate.release()
            await ep.wait_all_closed()
        finally:
            gate.release()

    holder_errors = [task.result() for task in holders]
    assert all(isinstance(e, TotalTimeoutError) for e in holder_errors)
    error = info.value
    assert (error.kind, error.request_id, error.retryable) == ("total_timeout", "waiter", False)
    assert total_s <= waited < 1.5 * total_s
    assert error.elapsed_s < 1.5 * total_s
    assert sorted(str(r.header("X-Request-Id")) for r in ep.requests[:2]) == [
        "holder-0",
        "holder-1",
    ]
    holder_connections = {r.connection_id for r in ep.requests[:2]}
    assert {ep.connections[i].closed_by for i in holder_connections} == {"client"}


async def test_cancelled_waiters_give_up_their_place_and_lose_no_slot(
    client_factory: ClientFactory,
) -> None:
    """Waiters cancelled in bulk leave the line; the slot then goes to the oldest live waiter.

    One slot, held by a first call; twenty callers queue and all but the last two are
    cancelled (as when their sessions are superseded). Released, the slot serves the two
    live waiters in the order they queued, and every request on the wire is from a live call.
    """
    gate = Gate()
    async with FakeEndpoint(responder=gate) as ep:
        client = client_factory(ep.url, max_concurrent_requests=1)
        holder = asyncio.create_task(client.complete(MESSAGES, request_id="holder"))
        await ep.wait_for_request(0)
        waiters = [
            asyncio.create_task(client.complete(MESSAGES, request_id=f"waiter-{i}"))
            for i in range(20)
        ]
        await asyncio.sleep(0.05)  # every waiter is now queued for the slot
        for task in waiters[:-2]:
            task.cancel()
        await asyncio.gather(*waiters[:-2], return_exceptions=True)
        gate.release()
        results = [await holder, *[await task for task in waiters[-2:]]]
    assert [c.request_id for c in results] == ["holder", "waiter-18", "waiter-19"]
    assert [r.header("X-Request-Id") for r in ep.requests] == [
        "holder",
        "waiter-18",
        "waiter-19",
    ]
    assert ep.max_concurrent_requests == 1
