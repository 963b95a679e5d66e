"""Ctrl-C is operator cancellation: the session ends typed, everything closes, exit 130.

The child talks to a fake endpoint that stalls for far longer than the test waits. Once the
fake has the request, the test sends SIGINT and checks that the child reports the cancelled
outcome, closes its connection (the fake sees the client leave), and exits with 130 promptly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal

import pytest

from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import StartCLI, WriteConfig, assert_no_key

#: The fake's stall: far longer than any bound below, so only cancellation can end it.
STALL_S = 30.0
#: How long the child may take, after SIGINT, to report and exit.
EXIT_WITHIN_S = 5.0
#: How long the child may take to start and send its request.
START_WITHIN_S = 15.0


def stalled() -> Reply:
    return dataclasses.replace(Reply.completion("too late"), stall_before_headers_s=STALL_S)


async def interrupt(start_cli: StartCLI, ep: FakeEndpoint, *args: str) -> tuple[int, str, str]:
    """Start the child, wait for its request, send SIGINT; return status and output."""
    process = await start_cli(*args)
    await ep.wait_for_request(0, timeout_s=START_WITHIN_S)
    process.send_signal(signal.SIGINT)
    async with asyncio.timeout(EXIT_WITHIN_S):
        out, err = await process.communicate()
    assert process.returncode is not None
    with pytest.raises(ProcessLookupError):  # reaped: the process is gone
        os.kill(process.pid, 0)
    closed = await ep.wait_closed(0, timeout_s=EXIT_WITHIN_S)
    assert closed.closed_by == "client"
    assert ep.open_connections == 0
    assert_no_key(out.decode(), err.decode())
    return process.returncode, out.decode(), err.decode()


async def test_sigint_cancels_run_with_operator_reason(
    start_cli: StartCLI, write_config: WriteConfig
) -> None:
    """SIGINT during a model request: outcome "cancelled", reason "operator", exit 130.

    Protects the signal handler on the running loop, the typed outcome instead of a
    traceback, the closed connection, and that nothing keeps the process alive.
    """
    async with FakeEndpoint([stalled()]) as ep:
        config = write_config(ep.url)
        status, out, err = await interrupt(
            start_cli, ep, "run", "--goal", "Wait.", "--config", str(config), "--json"
        )
    assert status == 130, err
    data = one_json(out)
    assert (data["outcome"], data["cancel_reason"]) == ("cancelled", "operator")
    assert data["turns"] == 1
    assert data["calls"] == []
    assert "interrupted" in err
    assert "Traceback" not in err


async def test_sigint_cancels_probe(start_cli: StartCLI, write_config: WriteConfig) -> None:
    """SIGINT during a probe: the error kind is "cancelled" and the exit status 130."""
    async with FakeEndpoint([stalled()]) as ep:
        config = write_config(ep.url)
        status, out, err = await interrupt(
            start_cli, ep, "probe", "--config", str(config), "--json"
        )
    assert status == 130, err
    data = one_json(out)
    assert (data["outcome"], data["kind"]) == ("error", "cancelled")
    assert data["request_id"] == "grid-agent-probe-1"
    assert "Traceback" not in err


def one_json(stdout: str) -> dict[str, object]:
    """stdout as exactly one JSON object."""
    lines = stdout.splitlines()
    assert len(lines) == 1, stdout
    data = json.loads(lines[0])
    assert isinstance(data, dict)
    return data
