"""Deterministic ids: the same session sends the same requests, byte for byte.

Request ids are ``<session>-g<generation>-t<turn>``; tool-call ids minted for calls that
came without one (``mint_missing_call_ids``) derive from the request id, so they are the
same on every run and distinct across turns. Without the setting, a call with no id is
refused before anything runs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import LoopResult, Outcome, SessionGeneration
from metacrate_grid_agent.errors import MissingCallIdError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    SESSION,
    RecordingExecutor,
    call,
    calls_reply,
    make_loop,
    request_ids,
    run_loop,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory


def session_script() -> list[Reply]:
    """A three-turn session: a look, a move plus a look, then the answer."""
    return [
        calls_reply(call("c-1", "look", '{"radius": 5}'), usage=(10, 2)),
        calls_reply(call("c-2", "move", '{"x": 1, "y": 2}'), call("c-3", "look"), usage=(20, 3)),
        Reply.completion("done", usage=(30, 4)),
    ]


def no_id(name: str, arguments: str = "{}") -> dict[str, Any]:
    """A tool call without an id, as some providers send them."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def without_latency(result: LoopResult) -> LoopResult:
    """``result`` with its timing fields zeroed (the only fields allowed to differ)."""
    calls = tuple(dataclasses.replace(record, latency_s=0.0) for record in result.calls)
    return dataclasses.replace(result, latency_s=0.0, calls=calls)


async def test_identical_runs_send_identical_requests(client_factory: ClientFactory) -> None:
    """Two runs of the same session send the same request ids and the same body bytes.

    Protects: requests are reproducible (for replaying, caching and comparing logs): no
    clock, counter or random value leaks into an id or a body.
    """
    records = []
    for _ in range(2):
        executor = RecordingExecutor()
        async with FakeEndpoint(session_script()) as ep:
            run = await run_loop(make_loop(client_factory(ep.url), executor))
        records.append(
            (
                [(r.header("X-Request-Id"), r.body) for r in ep.requests],
                [(c.id, dict(c.arguments)) for c in executor.calls],
                without_latency(run.result),
            )
        )

    assert records[0] == records[1]
    assert [rid for rid, _ in records[0][0]] == [
        "agent-1-g0-r1-t1",
        "agent-1-g0-r1-t2",
        "agent-1-g0-r1-t3",
    ]
    assert records[0][2].outcome is Outcome.COMPLETED


async def test_request_ids_name_session_and_generation(client_factory: ClientFactory) -> None:
    """Request ids carry the session id and the run's generation, which ``advance`` bumps.

    Protects: requests of a replaced avatar session can be told apart from the new one's.
    """
    generation = SessionGeneration("avatar.eu-1:7", start=7)
    script = [*session_script()[2:], *session_script()[2:]]
    async with FakeEndpoint(script) as ep:
        loop = make_loop(client_factory(ep.url), RecordingExecutor())
        first = await run_loop(loop, generation=generation)
        generation.advance()
        second = await run_loop(loop, generation=generation)

    assert request_ids(ep) == ["avatar.eu-1:7-g7-r1-t1", "avatar.eu-1:7-g8-r1-t1"]
    assert [(r.session_id, r.generation) for r in (first.result, second.result)] == [
        ("avatar.eu-1:7", 7),
        ("avatar.eu-1:7", 8),
    ]


async def test_request_ids_differ_between_runs_of_one_generation(
    client_factory: ClientFactory,
) -> None:
    """Two runs in one generation send different request ids; a new generation starts at r1.

    Protects: request ids stay deterministic but unique per session, so the provider's
    logs and billing never see one id for two different requests.
    """
    generation = SessionGeneration(SESSION)
    script = [*session_script()[1:], *session_script()[1:], Reply.completion("again")]
    async with FakeEndpoint(script) as ep:
        loop = make_loop(client_factory(ep.url), RecordingExecutor())
        for _ in range(2):
            await run_loop(loop, generation=generation)
        generation.advance()
        await run_loop(loop, generation=generation)

    ids = request_ids(ep)
    assert ids == [
        "agent-1-g0-r1-t1",
        "agent-1-g0-r1-t2",
        "agent-1-g0-r2-t1",
        "agent-1-g0-r2-t2",
        "agent-1-g1-r1-t1",
    ]
    assert len(set(ids)) == len(ids)


async def test_minted_call_ids_are_stable_across_runs(client_factory: ClientFactory) -> None:
    """Calls without ids get minted ids that are the same on every run and unique per turn.

    Protects: with ``mint_missing_call_ids`` a provider that omits ids still gets exact
    tool-message pairing, minted ids never collide across turns (no false duplicate), and
    replays stay byte-identical.
    """
    runs = []
    for _ in range(2):
        script = [
            calls_reply(no_id("look")),
            calls_reply(no_id("look", '{"radius": 1}'), no_id("move", '{"x": 3, "y": 4}')),
            Reply.completion("done"),
        ]
        executor = RecordingExecutor()
        async with FakeEndpoint(script) as ep:
            client = client_factory(ep.url, mint_missing_call_ids=True)
            run = await run_loop(make_loop(client, executor))
        runs.append((executor.call_ids, [r.body for r in ep.requests], run, ep))

    (ids, request_bodies, run, ep), (ids_again, bodies_again, _, _) = runs
    assert ids == ids_again
    assert request_bodies == bodies_again
    assert run.result.outcome is Outcome.COMPLETED
    assert len(set(ids)) == 3
    assert all(i.startswith("minted-") for i in ids)
    second = ep.requests[1].json()["messages"]
    assert [ids[0]] == [c["id"] for c in second[2]["tool_calls"]]
    assert ids[0] == second[3]["tool_call_id"]
    third = ep.requests[2].json()["messages"]
    assert ids[1:] == [c["id"] for c in third[4]["tool_calls"]]
    assert ids[1:] == [m["tool_call_id"] for m in third[5:]]


@pytest.mark.parametrize(
    "spec",
    [no_id("move", '{"x": 3, "y": 4}'), {**no_id("move", '{"x": 3, "y": 4}'), "id": ""}],
    ids=["absent", "empty"],
)
async def test_call_without_id_is_refused_unless_minting(
    client_factory: ClientFactory, spec: dict[str, Any]
) -> None:
    """Without ``mint_missing_call_ids``, a reply with an id-less call runs nothing.

    Protects: a call that cannot be paired with its result is never executed, the model
    is not asked again, and the error says which setting to change.
    """
    executor = RecordingExecutor()
    async with FakeEndpoint([calls_reply(spec)]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))

    assert run.result.outcome is Outcome.TRANSPORT_ERROR
    assert isinstance(run.result.error, MissingCallIdError)
    assert "mint_missing_call_ids" in str(run.result.error)
    assert executor.calls == []
    assert len(ep.requests) == 1
