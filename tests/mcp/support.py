"""Helpers for the MCP tier: start the test server (stdio or HTTP) and read its event log.

Nothing sleeps on luck: waits poll the server's log with a bound only a hang reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from metacrate_grid_agent.mcp import McpServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ROOT: Final = Path(__file__).resolve().parents[2]
#: Bound on waiting for something the server does at once; only a hang reaches it.
WAIT_S: Final = 10.0
#: A tool timeout, always set against a tool that never answers.
SHORT_S: Final = 0.3

Kind = Literal["stdio", "http"]


class EventLog:
    """The lines the test server appends: ``start <tool> <args>``, ``cancelled <tool>``..."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        """Every line written so far."""
        if not self.path.exists():
            return []
        return self.path.read_text(encoding="utf-8").splitlines()

    def starts(self) -> list[str]:
        """The tools started, in order."""
        return [line.split()[1] for line in self.lines() if line.startswith("start ")]

    async def wait_for(self, line: str, *, timeout_s: float = WAIT_S) -> None:
        """Wait until a line starting with ``line`` appears."""
        async with asyncio.timeout(timeout_s):
            # The server is another process writing a file: there is no event to await.
            while True:
                if any(entry.startswith(line) for entry in self.lines()):
                    return
                await asyncio.sleep(0.02)


def stdio_server(log: EventLog, label: str = "world", **options: Any) -> McpServer:
    """The test server as a subprocess over stdio."""
    return McpServer.stdio(
        label,
        sys.executable,
        ["-m", "tests.mcp.world_server", "stdio", str(log.path)],
        env={"PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
        **options,
    )


@contextlib.asynccontextmanager
async def http_server_url(log: EventLog) -> AsyncIterator[str]:
    """Run the test server over streamable HTTP on a loopback port; yield its URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.mcp.world_server",
        "http",
        str(log.path),
        cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(WAIT_S):
            line = await process.stdout.readline()
        port = int(line.decode().split()[1])
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


@contextlib.asynccontextmanager
async def world(kind: Kind, log: EventLog, **options: Any) -> AsyncIterator[McpServer]:
    """The test server over ``kind``, configured with ``options``."""
    if kind == "stdio":
        yield stdio_server(log, **options)
        return
    async with http_server_url(log) as url:
        yield McpServer.http("world", url, **options)
