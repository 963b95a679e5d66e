"""The heartbeat: on a terminal, a slow request says how long, which attempt, and what it waits for.

The child's stderr is the slave side of a pseudo-terminal (so ``isatty()`` is true, as for an
operator at a shell); stdout stays a pipe. The fake endpoint answers the first attempt with a
503 (so a retry line must say why and how long it waits), then stalls the second before its
headers for far longer than the heartbeat's tick, so the status line must have been drawn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import os
import pty
import struct
import sys
import termios
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import CHILD_TIMEOUT_S, RunCLI, WriteConfig, assert_no_key, child_env

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

pytestmark = pytest.mark.slow

#: The second attempt's stall: several heartbeat ticks (0.25 s), far below the child's bound.
STALL_S = 1.5


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: every slave side is closed, the child is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


async def run_on_terminal(
    pycache: Path, *args: str, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal; return status, stdout, terminal output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "metacrate_grid_agent",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=slave,
            env=child_env(pycache, {"TERM": "xterm", **(env or {})}),
        )
    finally:
        os.close(slave)
    try:
        reader = asyncio.create_task(asyncio.to_thread(_read_all, master))
        async with asyncio.timeout(CHILD_TIMEOUT_S):
            out, _ = await process.communicate()
            terminal = await reader
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        os.close(master)
    assert process.returncode is not None
    text = terminal.decode(errors="replace")
    assert_no_key(out.decode(), text)
    return process.returncode, out.decode(), text


def slow_script() -> list[Reply]:
    """A 503, then a reply whose headers come only after STALL_S."""
    slow = dataclasses.replace(Reply.completion("late but fine"), stall_before_headers_s=STALL_S)
    return [Reply.error(503, "warming up"), slow]


async def test_probe_shows_a_heartbeat_and_each_retry_on_a_terminal(
    pycache: Path, write_config: WriteConfig
) -> None:
    """On a terminal: the retry says why and how long; the status line says what it waits for.

    Also pins the dim styling when colour is allowed, and that JSON stays alone on stdout.
    """
    async with FakeEndpoint(slow_script()) as ep:
        config = write_config(ep.url, llm={"max_retry_delay_s": 0.05})
        status, out, terminal = await run_on_terminal(
            pycache, "probe", "--config", str(config), "--json"
        )
    assert status == 0, terminal
    assert '"outcome": "ok"' in out
    assert len(out.splitlines()) == 1
    assert "attempt 1 of 3 failed: http_status (HTTP 503); retrying in 0.0" in terminal
    assert "grid-agent: waiting for response headers, 1." in terminal
    assert " s (attempt 2 of 3, grid-agent-probe-1)" in terminal
    assert "\x1b[2m" in terminal


async def test_no_color_turns_the_styling_off(pycache: Path, write_config: WriteConfig) -> None:
    """NO_COLOR set: the same heartbeat, with no escape sequence at all."""
    async with FakeEndpoint(slow_script()) as ep:
        config = write_config(ep.url, llm={"max_retry_delay_s": 0.05})
        status, _, terminal = await run_on_terminal(
            pycache, "probe", "--config", str(config), env={"NO_COLOR": "1"}
        )
    assert status == 0, terminal
    assert "waiting for response headers" in terminal
    assert "\x1b" not in terminal


async def test_quiet_turns_the_heartbeat_off(pycache: Path, write_config: WriteConfig) -> None:
    """--quiet on a terminal: no status line and no retry line."""
    async with FakeEndpoint(slow_script()) as ep:
        config = write_config(ep.url, llm={"max_retry_delay_s": 0.05})
        status, _, terminal = await run_on_terminal(
            pycache, "probe", "--config", str(config), "--quiet"
        )
    assert status == 0, terminal
    assert "waiting for" not in terminal
    assert "retrying in" not in terminal


async def test_no_heartbeat_when_stderr_is_not_a_terminal(
    cli: RunCLI, write_config: WriteConfig
) -> None:
    """stderr to a pipe (a log file, CI): no status line, no carriage returns."""
    async with FakeEndpoint(slow_script()) as ep:
        config = write_config(ep.url, llm={"max_retry_delay_s": 0.05})
        result = await cli("probe", "--config", str(config), env={"TERM": "xterm"})
    assert result.returncode == 0, result.stderr
    assert "waiting for" not in result.stderr
    assert "\r" not in result.stderr


async def test_run_shows_the_heartbeat_during_a_session(
    pycache: Path, write_config: WriteConfig
) -> None:
    """A ToolLoop session reports through its client: the heartbeat covers `run` too."""
    async with FakeEndpoint(slow_script()) as ep:
        config = write_config(ep.url, llm={"max_retry_delay_s": 0.05})
        status, _, terminal = await run_on_terminal(
            pycache, "run", "--goal", "Wait.", "--config", str(config)
        )
    assert status == 0, terminal
    assert "attempt 1 of 3 failed: http_status (HTTP 503)" in terminal
    assert "waiting for response headers" in terminal
