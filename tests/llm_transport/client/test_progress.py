"""The progress hook: each attempt, its phases, each retry with its reason, the end of a call.

The CLI's heartbeat is built on these events, so they must say what a call is waiting for
(a new connection, the response headers, the body), and why and how long a retry waits.
Without a hook, nothing of it runs: the HTTP session gets no tracing at all.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import LLMClient, Outcome, ProgressEvent, UserMessage
from metacrate_grid_agent.errors import HTTPStatusError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import RecordingExecutor, make_loop, run_loop
from tests.llm_transport.support import CANARY_KEY, make_config

if TYPE_CHECKING:
    from collections.abc import Sequence

HELLO = [UserMessage(content="hello")]


def steps(events: list[ProgressEvent]) -> list[tuple[Any, ...]]:
    """Each event as (kind, request id, attempt, phase or retry reason)."""
    return [(e.kind, e.request_id, e.attempt, e.phase or e.reason) for e in events]


async def test_a_call_reports_its_attempt_phases_and_end() -> None:
    """A first call connects, waits for headers, reads the body; a second reuses the connection.

    Protects the phases a heartbeat shows, their order, and that "connecting" is reported only
    when a connection is really made.
    """
    events: list[ProgressEvent] = []
    async with (
        FakeEndpoint([Reply.completion("one"), Reply.completion("two")]) as ep,
        LLMClient(make_config(ep.url), correlation_id="p", on_progress=events.append) as client,
    ):
        await client.complete(HELLO)
        await client.complete(HELLO)
    assert steps(events) == [
        ("attempt", "p-1", 1, None),
        ("phase", "p-1", 1, "connecting"),
        ("phase", "p-1", 1, "waiting_for_headers"),
        ("phase", "p-1", 1, "reading_body"),
        ("end", "p-1", 1, None),
        ("attempt", "p-2", 1, None),
        ("phase", "p-2", 1, "waiting_for_headers"),
        ("phase", "p-2", 1, "reading_body"),
        ("end", "p-2", 1, None),
    ]
    assert len(ep.connections) == 1
    elapsed = [e.elapsed_s for e in events if e.request_id == "p-1"]
    assert elapsed == sorted(elapsed)
    assert all(CANARY_KEY not in repr(e) for e in events)


async def test_a_retry_reports_its_reason_and_delay() -> None:
    """A 503 then a success: the retry event names the failure and the delay it waits."""
    events: list[ProgressEvent] = []
    async with (
        FakeEndpoint([Reply.error(503, "busy"), Reply.completion("ok")]) as ep,
        LLMClient(make_config(ep.url), correlation_id="r", on_progress=events.append) as client,
    ):
        completion = await client.complete(HELLO)
    assert completion.attempts == 2
    kinds = [(e.kind, e.attempt) for e in events if e.kind != "phase"]
    assert kinds == [("attempt", 1), ("retry", 1), ("attempt", 2), ("end", 2)]
    [retry] = [e for e in events if e.kind == "retry"]
    assert retry.reason == "http_status (HTTP 503)"
    assert retry.delay_s == completion.attempt_records[0].delay_s
    assert retry.delay_s is not None
    assert 0.0 <= retry.delay_s <= 0.05
    assert len(ep.requests) == 2


async def test_a_failed_call_still_ends() -> None:
    """A call that fails for good reports its end, so a heartbeat always stops."""
    events: list[ProgressEvent] = []
    async with (
        FakeEndpoint([Reply.error(401, "no")]) as ep,
        LLMClient(make_config(ep.url), correlation_id="f", on_progress=events.append) as client,
    ):
        with pytest.raises(HTTPStatusError):
            await client.complete(HELLO)
    assert [e.kind for e in events if e.kind != "phase"] == ["attempt", "end"]


async def test_a_hook_that_raises_does_not_fail_the_call() -> None:
    """A broken display callback is logged and ignored; the reply still comes back."""

    def broken(_event: ProgressEvent) -> None:
        raise RuntimeError("display broke")

    async with (
        FakeEndpoint([Reply.completion("fine")]) as ep,
        LLMClient(make_config(ep.url), on_progress=broken) as client,
    ):
        completion = await client.complete(HELLO)
    assert completion.text == "fine"


async def test_without_a_hook_no_tracing_is_installed() -> None:
    """No hook, no work: no progress state, and the connection gets no phase callback."""
    phases: list[object] = []
    async with (
        FakeEndpoint([Reply.completion("x")]) as ep,
        LLMClient(make_config(ep.url)) as client,
    ):
        pool = client._ensure_pool()
        send = pool.send

        async def spy(
            head: bytes | Sequence[bytes], body: bytes, deadline: float, on_phase: object
        ) -> Any:
            phases.append(on_phase)
            return await send(head, body, deadline, on_phase)  # type: ignore[arg-type]

        pool.send = spy  # type: ignore[method-assign]
        await client.complete(HELLO)
        assert client._progress is None  # the absence is the guarantee
    assert phases == [None]


async def test_a_tool_loop_session_reports_through_its_clients_hook() -> None:
    """The client's hook sees every request of a ToolLoop session, turn by turn."""
    events: list[ProgressEvent] = []
    call = {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
    script = [Reply.completion(None, tool_calls=[call]), Reply.completion("done")]
    async with (
        FakeEndpoint(script) as ep,
        LLMClient(make_config(ep.url), correlation_id="s", on_progress=events.append) as client,
    ):
        run = await run_loop(make_loop(client, RecordingExecutor()))
    assert run.result.outcome is Outcome.COMPLETED
    starts = [e.request_id for e in events if e.kind == "attempt"]
    ends = [e.request_id for e in events if e.kind == "end"]
    assert starts == ends
    assert len(starts) == 2
    assert len(ep.requests) == 2


def test_progress_events_are_frozen() -> None:
    """An event is a value: it cannot be changed by one observer under another."""
    event = ProgressEvent(kind="attempt", request_id="x-1", attempt=1, elapsed_s=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.attempt = 2  # type: ignore[misc]
