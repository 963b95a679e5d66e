"""The tool loop drives MCP servers nobody here wrote, from the package registries, pinned.

``mcp-server-time`` (PyPI, through ``uvx``), ``@modelcontextprotocol/server-everything``
over stdio and over streamable HTTP, and ``@modelcontextprotocol/server-filesystem`` (npm,
``tests/mcp/npm``). Each is started, its tools listed through ``McpToolset`` (effects from
its own annotations), and a read-only and a mutating tool called through ``ToolLoop`` with
the fake endpoint as the model; the tests check the effects the servers had. Where to get
the packages, and the skip/fail rule: ``tests/mcp/reference.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from typing import TYPE_CHECKING, Final

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

from metacrate_grid_agent import Effect, Outcome, ToolLoop
from metacrate_grid_agent.mcp import McpLimits, McpServer, McpToolset
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import call, calls_reply, run_loop
from tests.mcp.reference import TIME_SERVER, UVX_START_S, npm_bin, uvx_env

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from metacrate_grid_agent import LoopResult
    from tests.llm_transport.conftest import ClientFactory

pytestmark = pytest.mark.slow

#: Bound on one whole session against a reference server (a start, a few calls).
SESSION_S: Final = 60.0
#: Bound on the HTTP server's start (Node.js loads, then listens).
LISTEN_S: Final = 30.0


async def drive(
    server: McpServer, script: list[Reply], client_factory: ClientFactory, *, start_s: float = 30.0
) -> tuple[dict[str, Effect], LoopResult]:
    """The server's tools with their effects, and the session the script plays against it."""
    async with (
        McpToolset([server], limits=McpLimits(startup_timeout_s=start_s)) as toolset,
        FakeEndpoint(script) as ep,
    ):
        loop = ToolLoop(client_factory(ep.url), toolset.tools, toolset.executor)
        run = await run_loop(loop, timeout_s=SESSION_S)
    return {tool.name: tool.effect for tool in toolset.tools}, run.result


def observations(result: LoopResult) -> dict[str, str]:
    """Each call's observation, by call id."""
    return {record.call_id: record.observation for record in result.calls}


async def test_the_time_server_converts_a_time(client_factory: ClientFactory) -> None:
    """``mcp-server-time``: both tools read-only by the server's own hints; a conversion
    between fixed-offset zones gives the right time, and ``get_current_time`` answers.

    Protects: a Python server of the reference set, another SDK generation than ours, works
    through the loop.
    """
    server = McpServer.stdio(
        "time", "uvx", ["--quiet", TIME_SERVER, "--local-timezone", "UTC"], env=uvx_env()
    )
    convert = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Kolkata"}
    script = [
        calls_reply(call("t-1", "convert_time", convert), call("t-2", "get_current_time",
                                                                {"timezone": "UTC"})),
        Reply.completion("It is 17:30 in Kolkata."),
    ]  # fmt: skip
    effects, result = await drive(server, script, client_factory, start_s=UVX_START_S)
    assert effects == {"get_current_time": Effect.READ_ONLY, "convert_time": Effect.READ_ONLY}
    assert result.outcome is Outcome.COMPLETED
    assert [(c.call_id, c.status) for c in result.calls] == [("t-1", "ok"), ("t-2", "ok")]
    converted = json.loads(observations(result)["t-1"])
    assert converted["target"]["datetime"].split("T")[1].startswith("17:30")
    assert json.loads(observations(result)["t-2"])["timezone"] == "UTC"


def _free_port() -> int:
    # The server takes its port from PORT and cannot be given 0; a port just freed on
    # loopback is the usual way, and a clash is seen (the server says so) and retried.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def everything_over_http() -> AsyncIterator[str]:
    """``server-everything`` over streamable HTTP on a free port: its URL, while it runs."""
    command = npm_bin("mcp-server-everything")
    for _ in range(3):
        port = _free_port()
        child = await asyncio.create_subprocess_exec(
            command, "streamableHttp",
            env={"PORT": str(port), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert child.stderr is not None
        try:
            async with asyncio.timeout(LISTEN_S):
                line = b""
                while b"listening on port" not in line and b"in use" not in line:
                    line = await child.stderr.readline()
                    assert line, "server-everything ended before it listened"
            if b"in use" in line:
                continue
            yield f"http://127.0.0.1:{port}/mcp"
            return
        finally:
            if child.returncode is None:
                child.kill()
            await child.wait()
    pytest.fail("server-everything found no free port in 3 tries")


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_server_everything_echoes_adds_and_takes_its_effects_from_annotations(
    transport: str, client_factory: ClientFactory
) -> None:
    """``server-everything``: the effect of each tool follows its ``readOnlyHint`` (``echo``
    and ``get-sum`` read-only, the ``toggle-*`` tools mutating); ``echo`` and ``get-sum``
    answer through the loop, and a mutating toggle runs once.

    Protects: the TypeScript SDK's servers, over both transports, work through the loop.
    """
    script = [
        calls_reply(
            call("e-1", "echo", {"message": "hello from the loop"}),
            call("e-2", "get-sum", {"a": 2, "b": 40}),
            call("e-3", "toggle-subscriber-updates", {}),
        ),
        Reply.completion("Echoed, added and toggled."),
    ]
    async with contextlib.AsyncExitStack() as stack:
        if transport == "http":
            url = await stack.enter_async_context(everything_over_http())
            server = McpServer.http("everything", url)
        else:
            server = McpServer.stdio("everything", str(npm_bin("mcp-server-everything")), ["stdio"])
        effects, result = await drive(server, script, client_factory)
    assert (effects["echo"], effects["get-sum"]) == (Effect.READ_ONLY, Effect.READ_ONLY)
    assert effects["toggle-subscriber-updates"] is Effect.MUTATING
    assert effects["toggle-simulated-logging"] is Effect.MUTATING
    assert result.outcome is Outcome.COMPLETED
    assert [c.status for c in result.calls] == ["ok", "ok", "ok"]
    seen = observations(result)
    assert seen["e-1"] == "Echo: hello from the loop"
    assert "42" in seen["e-2"]


async def test_server_filesystem_writes_inside_its_root_and_is_denied_outside(
    tmp_path: Path, client_factory: ClientFactory
) -> None:
    """``server-filesystem`` rooted in a temporary folder: ``write_file`` (mutating) makes
    the file there, the same call outside the root is refused (a failed call, nothing
    written), and ``read_text_file`` (read-only) reads back what was written.

    Protects: a server's own refusal reaches the model as a failure and the session goes on;
    the effects are the ones the server's annotations give.
    """
    root = tmp_path / "root"
    root.mkdir()
    inside, outside = root / "note.txt", tmp_path / "outside.txt"
    server = McpServer.stdio("fs", str(npm_bin("mcp-server-filesystem")), [str(root)])
    script = [
        calls_reply(call("f-1", "write_file", {"path": str(inside), "content": "kept"})),
        calls_reply(call("f-2", "write_file", {"path": str(outside), "content": "never"})),
        calls_reply(call("f-3", "read_text_file", {"path": str(inside)})),
        Reply.completion("Wrote the note inside the root; outside was refused."),
    ]
    effects, result = await drive(server, script, client_factory)
    assert (effects["write_file"], effects["read_text_file"]) == (
        Effect.MUTATING, Effect.READ_ONLY,
    )  # fmt: skip
    assert result.outcome is Outcome.COMPLETED
    assert [(c.call_id, c.status) for c in result.calls] == [
        ("f-1", "ok"), ("f-2", "failed"), ("f-3", "ok"),
    ]  # fmt: skip
    assert inside.read_text(encoding="utf-8") == "kept"
    assert not outside.exists()
    seen = observations(result)
    assert "denied" in seen["f-2"].lower()
    assert seen["f-3"] == "kept"
