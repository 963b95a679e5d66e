"""The client the protocol's conformance suite runs: ``python -m tests.mcp.conformance_client``.

The suite (npm ``@modelcontextprotocol/conformance``, ``client`` mode) starts a conformance
server for one scenario, runs this command with the server's URL as its last argument and
the scenario's name in ``MCP_CONFORMANCE_SCENARIO``, then checks what the server saw. The
client does what the library does for an application: ``McpToolset`` over ``McpServer.http``
(initialize, list the tools), then each listed tool called once through the executor, with
the arguments the scenario expects. Each outcome is printed, one line per tool; the exit
status is 0 when every call succeeded.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, Final

from metacrate_grid_agent import CancelToken, Success, ValidatedCall
from metacrate_grid_agent.mcp import McpLimits, McpServer, McpToolset

#: The arguments a scenario's tool expects (by the tool's name); every other tool gets {}.
ARGUMENTS: Final[dict[str, dict[str, Any]]] = {"add_numbers": {"a": 5, "b": 3}}
#: Bounds well inside the suite's own per-scenario timeout (30 s by default).
LIMITS: Final = McpLimits(startup_timeout_s=10.0, http_read_timeout_s=10.0)
#: The longest one call may take.
CALL_S: Final = 10.0


async def run(url: str) -> int:
    """Start, list, call every tool once; 0 when every call succeeded."""
    failed = 0
    async with McpToolset([McpServer.http("conformance", url)], limits=LIMITS) as toolset:
        for tool in toolset.tools:
            call = ValidatedCall(
                "c-" + tool.name, tool.name, ARGUMENTS.get(tool.name, {}), tool.effect
            )
            async with asyncio.timeout(CALL_S):
                outcome = await toolset.executor.execute(call, CancelToken())
            failed += not isinstance(outcome, Success)
            print(f"{tool.name}: {type(outcome).__name__}: {outcome}", flush=True)  # noqa: T201
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    """The command: the URL is the last argument."""
    if not argv:
        print("usage: python -m tests.mcp.conformance_client URL", file=sys.stderr)  # noqa: T201
        return 2
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "?")
    print(f"scenario {scenario}: {argv[-1]}", flush=True)  # noqa: T201
    return asyncio.run(run(argv[-1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
