"""Ctrl-C is operator cancellation (exit 130), SIGTERM is shutdown (exit 143): the session ends
typed, everything closes, and a second signal quits at once.

The child talks to a fake endpoint that stalls for far longer than the test waits. Once the
fake has the request, the test sends SIGINT and checks that the child reports the cancelled
outcome, closes its connection (the fake sees the client leave), and exits with 130 promptly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import signal

import pytest

from metacrate_grid_agent import CancelToken
from metacrate_grid_agent.cli._output import Console, Redactor
from metacrate_grid_agent.cli._process import operator_interrupts
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


async def interrupt(
    start_cli: StartCLI, ep: FakeEndpoint, *args: str, signum: int = signal.SIGINT
) -> tuple[int, str, str]:
    """Start the child, wait for its request, send ``signum``; return status and output."""
    process = await start_cli(*args)
    await ep.wait_for_request(0, timeout_s=START_WITHIN_S)
    process.send_signal(signum)
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


async def test_sigterm_cancels_run_with_shutdown_reason(
    start_cli: StartCLI, write_config: WriteConfig
) -> None:
    """SIGTERM does what Ctrl-C does, with reason "shutdown": summary printed, exit 143.

    Protects a service manager's stop: the session ends typed, the connection closes, and
    the status is the conventional 128 + SIGTERM.
    """
    async with FakeEndpoint([stalled()]) as ep:
        config = write_config(ep.url)
        status, out, err = await interrupt(
            start_cli, ep, "run", "--goal", "Wait.", "--config", str(config), "--json",
            signum=signal.SIGTERM,
        )  # fmt: skip
    assert status == 143, err
    data = one_json(out)
    assert (data["outcome"], data["cancel_reason"]) == ("cancelled", "shutdown")
    assert "terminated (SIGTERM); cancelling" in err
    assert "Traceback" not in err


async def test_sigterm_cancels_run_with_a_human_summary(
    start_cli: StartCLI, write_config: WriteConfig
) -> None:
    """Without --json the summary on stdout names the outcome and the shutdown reason."""
    async with FakeEndpoint([stalled()]) as ep:
        config = write_config(ep.url)
        status, out, err = await interrupt(
            start_cli, ep, "run", "--goal", "Wait.", "--config", str(config),
            signum=signal.SIGTERM,
        )  # fmt: skip
    assert status == 143, err
    assert "outcome:   cancelled" in out
    assert "cancelled: shutdown" in out


async def test_sigterm_cancels_probe(start_cli: StartCLI, write_config: WriteConfig) -> None:
    """SIGTERM during a probe: the error kind is "cancelled" and the exit status 143."""
    async with FakeEndpoint([stalled()]) as ep:
        config = write_config(ep.url)
        status, out, err = await interrupt(
            start_cli, ep, "probe", "--config", str(config), "--json", signum=signal.SIGTERM
        )
    assert status == 143, err
    data = one_json(out)
    assert (data["outcome"], data["kind"]) == ("error", "cancelled")


@pytest.mark.parametrize(
    ("first", "second", "reason", "status"),
    [
        (signal.SIGTERM, signal.SIGTERM, "shutdown", 143),
        (signal.SIGTERM, signal.SIGINT, "shutdown", 130),
        (signal.SIGINT, signal.SIGTERM, "operator", 143),
    ],
)
async def test_a_second_signal_quits_at_once(
    monkeypatch: pytest.MonkeyPatch,
    first: signal.Signals,
    second: signal.Signals,
    reason: str,
    status: int,
) -> None:
    """The first signal cancels with its reason; the second exits at once with its status.

    In-process, with the process exit replaced: a child that still cancels when the second
    signal arrives cannot be arranged without timing luck.
    """
    exits: list[int] = []
    exited = asyncio.Event()

    def fake_exit(code: int) -> None:
        exits.append(code)
        exited.set()

    monkeypatch.setattr(os, "_exit", fake_exit)
    cancel = CancelToken()
    console = Console(Redactor(), stdout=io.StringIO(), stderr=io.StringIO())
    with operator_interrupts(cancel, console):
        os.kill(os.getpid(), first)
        async with asyncio.timeout(EXIT_WITHIN_S):
            assert await cancel.wait() == reason
        assert exits == []
        os.kill(os.getpid(), second)
        async with asyncio.timeout(EXIT_WITHIN_S):
            await exited.wait()
    assert exits == [status]
