"""A ToolLoop drives a real MCP server (stdio subprocess, loopback streamable HTTP).

The server is written with the SDK's server side (``tests/mcp/world_server.py``) and logs
every call it starts and every cancellation it receives, so the tests assert on what the
server saw, not only on what the adapter returned.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

from typing import TYPE_CHECKING

from metacrate_grid_agent import (
    CancelToken,
    Effect,
    Failure,
    Outcome,
    SessionGeneration,
    Success,
    ToolLoop,
    ValidatedCall,
)
from metacrate_grid_agent.errors import ConfigError, ToolDefinitionError
from metacrate_grid_agent.mcp import McpLimits, McpToolset
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    SESSION,
    call,
    calls_reply,
    loop_config,
    run_loop,
    start_loop,
)
from tests.mcp.support import SHORT_S, WAIT_S, EventLog, Kind, stdio_server, world

if TYPE_CHECKING:
    from pathlib import Path

    from tests.llm_transport.conftest import ClientFactory

pytestmark = pytest.mark.slow

MOVE_ARGS = '{"x": 10, "y": 20}'


def tool_messages(request_body: bytes) -> list[str]:
    """The contents of the tool messages in one chat-completions request body."""
    messages = json.loads(request_body)["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


async def test_tools_come_from_the_listing_with_effects_failing_closed(
    kind: Kind, log_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's tools become loop tools; only readOnlyHint: true is read-only.

    Protects: a missing annotation and readOnlyHint: false are both mutating (fail closed);
    a schema with a remote $ref and a name outside the loop's alphabet are left out with a
    logged reason instead of failing start-up; the schemas are the server's own.
    """
    log = EventLog(log_path)
    caplog.set_level(logging.WARNING, logger="metacrate_grid_agent.mcp")
    async with world(kind, log) as server, McpToolset([server]) as toolset:
        effects = {tool.name: tool.effect for tool in toolset.tools}
        skipped = {entry.name: entry.reason for entry in toolset.skipped}
        move = next(tool for tool in toolset.tools if tool.name == "move")

    assert effects == {
        "look": Effect.READ_ONLY,
        "move": Effect.MUTATING,
        "say": Effect.MUTATING,
        "fail": Effect.READ_ONLY,
        "crash": Effect.MUTATING,
        "hang": Effect.MUTATING,
        "stare": Effect.READ_ONLY,
        "picture": Effect.READ_ONLY,
        "panorama": Effect.READ_ONLY,
    }
    assert set(skipped) == {"remote_ref", "bad_schema", "bad_name.v2"}
    assert "is not local" in skipped["remote_ref"]
    assert "parameters" in skipped["bad_schema"]
    assert "name must be" in skipped["bad_name.v2"]
    assert move.parameters["required"] == ["x", "y"]
    assert move.description == "Walk to (x, y)."
    logged = caplog.text
    assert "'remote_ref' left out" in logged
    assert "'bad_schema' left out" in logged
    assert "'bad_name.v2' left out" in logged
    assert log.starts() == []


async def test_per_tool_effect_override(log_path: Path) -> None:
    """The operator's per-tool override wins over the server's annotation, both ways.

    Protects: a server that under-declares (look marked mutating by the operator) or a
    tool the operator knows is harmless (move declared read-only) is treated as configured.
    """
    log = EventLog(log_path)
    overrides = {"look": Effect.MUTATING, "move": Effect.READ_ONLY}
    async with McpToolset([stdio_server(log, effects=overrides)]) as toolset:
        effects = {tool.name: tool.effect for tool in toolset.tools}
    assert effects["look"] is Effect.MUTATING
    assert effects["move"] is Effect.READ_ONLY
    assert effects["say"] is Effect.MUTATING


async def test_a_policy_naming_a_tool_the_server_does_not_list_is_an_error(
    log_path: Path,
) -> None:
    """A tool named in ``effects``, ``allow_tools`` or ``block_tools`` that the server does
    not list fails start-up with a configuration error naming each one, with the nearest
    listed name; a typo never leaves the real tool running unasked.

    Protects: ``effects = { mvoe = "mutating" }`` no longer leaves ``move`` as the server
    declared it, with nothing said.
    """
    log = EventLog(log_path)
    server = stdio_server(
        log,
        effects={"mvoe": Effect.MUTATING},
        allow_tools=["look", "lok"],
        block_tools=["sya"],
    )
    with pytest.raises(ConfigError) as caught:
        async with McpToolset([server]):
            pass  # pragma: no cover - start-up fails
    problems = {p.key: p.problem for p in caught.value.problems}
    assert set(problems) == {
        "mcp.world.effects.mvoe",
        "mcp.world.allow_tools.lok",
        "mcp.world.block_tools.sya",
    }
    assert "the server lists no tool 'mvoe'" in problems["mcp.world.effects.mvoe"]
    assert "did you mean `move`?" in problems["mcp.world.effects.mvoe"]
    assert "did you mean `look`?" in problems["mcp.world.allow_tools.lok"]
    assert "did you mean `say`?" in problems["mcp.world.block_tools.sya"]
    assert log.starts() == []


async def test_name_collision_between_servers_is_an_error_unless_prefixed(
    tmp_path: Path,
) -> None:
    """Two servers offering the same tool names fail start-up; a prefix tells them apart.

    Protects: a call is never routed to the wrong server by a silent first-wins rule, and a
    prefixed tool reaches the server that offered it.
    """
    first, second = EventLog(tmp_path / "a.log"), EventLog(tmp_path / "b.log")
    with pytest.raises(ToolDefinitionError, match="collide") as caught:
        async with McpToolset([stdio_server(first, "a"), stdio_server(second, "b")]):
            pass  # pragma: no cover - start-up fails
    assert "'look' is offered by MCP servers 'a' and 'b'" in str(caught.value)

    servers = [stdio_server(first, "a"), stdio_server(second, "b", prefix="b_")]
    async with McpToolset(servers) as toolset:
        names = [tool.name for tool in toolset.tools]
        outcome = await toolset.executor.execute(
            ValidatedCall("c-1", "b_look", {}, Effect.READ_ONLY), CancelToken()
        )
    assert "look" in names
    assert "b_look" in names
    assert outcome.observation == "a fountain, two benches and a cat"
    assert first.starts() == []
    assert second.starts() == ["look"]


async def test_loop_runs_read_only_and_mutating_tools(
    kind: Kind, log_path: Path, client_factory: ClientFactory
) -> None:
    """A session looks, moves and reads an error and an image, then finishes.

    Protects: text results are the observations the model gets; isError is a failure
    observation and the session goes on; non-text content is described, not inlined;
    each call reaches the server exactly once.
    """
    log = EventLog(log_path)
    script = [
        calls_reply(call("l-1", "look"), call("m-2", "move", MOVE_ARGS)),
        calls_reply(call("f-3", "fail"), call("p-4", "picture")),
        Reply.completion("I walked to the fountain."),
    ]
    async with (
        world(kind, log) as server,
        McpToolset([server]) as toolset,
        FakeEndpoint(script) as ep,
    ):
        loop = ToolLoop(client_factory(ep.url), toolset.tools, toolset.executor)
        run = await run_loop(loop, timeout_s=WAIT_S)

    result = run.result
    assert result.outcome is Outcome.COMPLETED
    assert [(c.call_id, c.status) for c in result.calls] == [
        ("l-1", "ok"),
        ("m-2", "ok"),
        ("f-3", "failed"),
        ("p-4", "ok"),
    ]
    assert tool_messages(ep.requests[1].body) == [
        "a fountain, two benches and a cat",
        "moved to (10, 20)",
    ]
    failure, picture = tool_messages(ep.requests[2].body)[2:]
    assert failure == "the lamp is out of reach"
    assert picture == "[image: 'image/png', about 900 bytes]"
    assert log.starts() == ["look", "move", "fail", "picture"]


async def test_server_dying_during_a_mutating_call_is_ambiguous(
    kind: Kind, log_path: Path, client_factory: ClientFactory
) -> None:
    """The server process dies mid-call: the session ends as ambiguous, nothing follows.

    Protects: a crash leaves the effect unknown, so no other call of the turn is sent and
    the model is not asked again.
    """
    log = EventLog(log_path)
    script = [
        calls_reply(call("c-1", "crash"), call("l-2", "look")),
        Reply.completion("never sent"),
    ]
    async with (
        world(kind, log) as server,
        McpToolset([server]) as toolset,
        FakeEndpoint(script) as ep,
    ):
        loop = ToolLoop(client_factory(ep.url), toolset.tools, toolset.executor)
        run = await run_loop(loop, timeout_s=WAIT_S)

    result = run.result
    assert result.outcome is Outcome.AMBIGUOUS_MUTATION
    assert result.ambiguous_call is not None
    assert result.ambiguous_call.call_id == "c-1"
    assert "may or may not have happened" in result.ambiguous_call.observation
    assert log.starts() == ["crash"]
    assert len(ep.requests) == 1


HANGS = {
    "mutating": ("hang", Outcome.AMBIGUOUS_MUTATION, "ambiguous"),
    "read_only": ("stare", Outcome.COMPLETED, "failed"),
}


@pytest.mark.parametrize("effect", list(HANGS))
async def test_hanging_server_times_out_and_the_request_is_cancelled(
    kind: Kind, log_path: Path, client_factory: ClientFactory, effect: str
) -> None:
    """A tool that never answers hits the tool timeout; the server's handler is cancelled.

    Protects: a timeout of a mutating call is ambiguous and ends the session; of a
    read-only call it is a failure and the session goes on; either way the MCP request is
    cancelled on the server (the protocol's cancellation), not left running.
    """
    tool, outcome, status = HANGS[effect]
    log = EventLog(log_path)
    script = [calls_reply(call("t-1", tool)), Reply.completion("done looking")]
    async with (
        world(kind, log, tool_timeout_s=SHORT_S) as server,
        McpToolset([server]) as toolset,
        FakeEndpoint(script) as ep,
    ):
        loop = ToolLoop(client_factory(ep.url), toolset.tools, toolset.executor)
        run = await run_loop(loop, timeout_s=WAIT_S)
        await log.wait_for(f"cancelled {tool}")
        if status == "ambiguous":
            ep.failures.clear()

    assert run.result.outcome is outcome
    assert [(c.call_id, c.status) for c in run.result.calls] == [("t-1", status)]
    assert log.starts() == [tool]


@pytest.mark.parametrize("how", ["superseded", "cancelled"])
async def test_supersession_or_cancellation_mid_call_cancels_the_request(
    kind: Kind, log_path: Path, client_factory: ClientFactory, how: str
) -> None:
    """SessionGeneration.advance or the operator's token mid-call cancels the MCP request.

    Protects: the server is told to stop (its handler is cancelled), the session ends as
    superseded or cancelled (not ambiguous), and no other call or request is started.
    """
    log = EventLog(log_path)
    script = [
        calls_reply(call("h-1", "hang"), call("l-2", "look")),
        Reply.completion("never sent"),
    ]
    generation = SessionGeneration(SESSION)
    token = CancelToken()
    async with (
        world(kind, log) as server,
        McpToolset([server]) as toolset,
        FakeEndpoint(script) as ep,
    ):
        loop = ToolLoop(
            client_factory(ep.url),
            toolset.tools,
            toolset.executor,
            config=loop_config(tool_timeout_s=60.0),
        )
        handle = start_loop(loop, generation=generation, cancel=token)
        await log.wait_for("start hang")
        if how == "superseded":
            generation.advance()
        else:
            token.cancel("shutdown")
        run = await handle.finish(timeout_s=WAIT_S)
        await log.wait_for("cancelled hang")
        ep.failures.clear()

    expected = Outcome.SUPERSEDED if how == "superseded" else Outcome.CANCELLED
    assert run.result.outcome is expected
    assert run.pending_cancels == 0
    assert log.starts() == ["hang"]
    assert len(ep.requests) == 1


async def test_a_cancelled_token_never_sends_the_call(log_path: Path) -> None:
    """An executor call whose token is already cancelled is refused without a request.

    Protects: cancellation never starts another call, even when the executor is used
    outside a loop.
    """
    log = EventLog(log_path)
    token = CancelToken()
    token.cancel("shutdown")
    async with McpToolset([stdio_server(log)]) as toolset:
        outcome = await toolset.executor.execute(
            ValidatedCall("m-1", "move", {"x": 1, "y": 2}, Effect.MUTATING), token
        )
    assert isinstance(outcome, Failure)
    assert "not sent" in outcome.observation or "before it was sent" in outcome.observation
    assert log.starts() == []


async def test_token_cancellation_during_a_standalone_call(log_path: Path) -> None:
    """Cancelling the token given to execute cancels the request on the server.

    Protects: the CancelToken passed to execute (not only the loop's own cancellation)
    stops an MCP call in flight, and the cancellation reaches the caller as such.
    """
    from metacrate_grid_agent.errors import CancelledByCallerError

    log = EventLog(log_path)
    token = CancelToken()
    async with McpToolset([stdio_server(log)]) as toolset:

        async def cut() -> None:
            await log.wait_for("start hang")
            token.cancel("shutdown")

        cutter = asyncio.create_task(cut())
        with pytest.raises(CancelledByCallerError):
            await toolset.executor.execute(ValidatedCall("h-1", "hang", {}, Effect.MUTATING), token)
        await cutter
        await log.wait_for("cancelled hang")
    assert log.starts() == ["hang"]


async def test_http_read_timeout_never_cuts_a_call_the_tool_timeout_allows(
    log_path: Path, client_factory: ClientFactory
) -> None:
    """A call silent past http_read_timeout_s but within its tool timeout keeps the connection.

    Protects: a slow tool over HTTP is ended by the loop's tool timeout (one request
    cancelled), not by the HTTP read timeout tearing the whole connection down, so the
    next call still reaches the server.
    """
    from metacrate_grid_agent.mcp import McpLimits

    log = EventLog(log_path)
    script = [
        calls_reply(call("s-1", "stare")),
        calls_reply(call("l-2", "look")),
        Reply.completion("done"),
    ]
    limits = McpLimits(http_read_timeout_s=0.1)
    async with (
        world("http", log, tool_timeout_s=SHORT_S * 2) as server,
        McpToolset([server], limits=limits) as toolset,
        FakeEndpoint(script) as ep,
    ):
        loop = ToolLoop(client_factory(ep.url), toolset.tools, toolset.executor)
        run = await run_loop(loop, timeout_s=WAIT_S)

    assert run.result.outcome is Outcome.COMPLETED
    stare, look = run.result.calls
    assert (stare.status, stare.observation) == (
        "failed",
        f"tool 'stare' timed out after {SHORT_S * 2} s",
    )
    assert (look.status, look.observation) == ("ok", "a fountain, two benches and a cat")
    assert log.starts() == ["stare", "look"]


async def test_an_oversized_result_fails_that_call_and_later_calls_work(
    kind: Kind, log_path: Path
) -> None:
    """A result over max_response_bytes fails that call; the connection stays usable.

    Protects: over HTTP as over stdio, the size cap ends one call, not the connection.
    """
    log = EventLog(log_path)
    limits = McpLimits(max_response_bytes=100_000)
    async with world(kind, log) as server, McpToolset([server], limits=limits) as toolset:
        big = await toolset.executor.execute(
            ValidatedCall("c1", "panorama", {}, Effect.READ_ONLY), CancelToken()
        )
        after = await toolset.executor.execute(
            ValidatedCall("c2", "look", {}, Effect.READ_ONLY), CancelToken()
        )
    assert type(big) is Failure
    assert "max_response_bytes" in big.observation
    assert after == Success("a fountain, two benches and a cat")
