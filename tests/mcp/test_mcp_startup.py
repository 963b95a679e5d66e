"""Starting MCP servers is bounded, and a server that cannot start is a clear error."""

from __future__ import annotations

import sys
import time

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

from metacrate_grid_agent.errors import ConnectError
from metacrate_grid_agent.mcp import McpLimits, McpServer, McpToolset

#: The start-up limit set against a server that never answers.
STARTUP_S = 0.5


@pytest.mark.slow
async def test_a_silent_server_fails_start_up_within_the_limit() -> None:
    """A process that never speaks MCP fails start-up at startup_timeout_s, and is stopped.

    Protects: start-up is bounded: a wrong command cannot hang the agent, and the process
    it started does not outlive the failed toolset.
    """
    silent = McpServer.stdio("silent", sys.executable, ["-c", "import time; time.sleep(60)"])
    started = time.monotonic()
    with pytest.raises(
        ConnectError, match=r"did not start and list its tools: no initialize answer within 0\.5 s"
    ):
        async with McpToolset([silent], limits=McpLimits(startup_timeout_s=STARTUP_S)):
            pass  # pragma: no cover - start-up fails
    assert time.monotonic() - started < 10.0


async def test_a_missing_command_is_a_connect_error() -> None:
    """A command that does not exist is a ConnectError naming the server, not a raw OSError.

    Protects: every start-up failure reaches the caller as one typed error.
    """
    missing = McpServer.stdio("ghost", "/nonexistent/region-mcp")
    with pytest.raises(ConnectError, match="MCP server 'ghost' could not be started"):
        async with McpToolset([missing]):
            pass  # pragma: no cover - start-up fails
