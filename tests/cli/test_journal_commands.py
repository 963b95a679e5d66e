"""``grid-agent run --journal DIR`` and ``grid-agent resume DIR``: a session killed during a
mutating MCP call is resumed by a new command, which never calls it again.

The MCP server is the MCP tier's test server over stdio (``tests/mcp/world_server.py``); its
``hang`` tool is mutating and never answers, so the kill falls inside the call, after the
server logged its start. Needs the ``mcp`` extra.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("mcp", reason="the MCP tier needs the mcp extra")

from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import CHILD_TIMEOUT_S, RunCLI, StartCLI, assert_no_key
from tests.cli.test_run_mcp import mcp_config
from tests.mcp.support import EventLog

if TYPE_CHECKING:
    from pathlib import Path

GOAL = "Look around, then wait where you are."
RUN_ID = "cli-session-g0-r1"


def script() -> list[Reply]:
    """The model: look, then the mutating call that hangs (the kill comes during it)."""
    return [
        Reply.completion(tool_calls=[("c1", "w_look", "{}")]),
        Reply.completion(tool_calls=[("c2", "w_hang", "{}")]),
    ]


@pytest.mark.slow
async def test_a_run_killed_during_a_mutating_call_resumes_ambiguous_and_never_repeats_it(
    cli: RunCLI, start_cli: StartCLI, tmp_path: Path
) -> None:
    """``run --journal DIR`` is killed (SIGKILL) while the server runs its mutating call;
    ``resume DIR`` with the same configuration ends the session ``ambiguous_mutation``
    naming that call, exit status 1; the server saw the call once, the model no request
    from the resume; the journal is 0600 and holds no key."""
    log = EventLog(tmp_path / "events.log")
    journal = tmp_path / "journal"
    async with FakeEndpoint(script()) as ep:
        config = str(mcp_config(tmp_path, ep.url, log))
        child = await start_cli(
            "run", "--config", config, "--goal", GOAL, "--journal", str(journal), "--json"
        )
        await log.wait_for("start hang", timeout_s=CHILD_TIMEOUT_S)
        child.kill()
        async with asyncio.timeout(CHILD_TIMEOUT_S):
            await child.communicate()
        sent = len(ep.requests)
        resumed = await cli("resume", str(journal), "--config", config, "--json")
        assert len(ep.requests) == sent == 2
    assert resumed.returncode == 1, resumed.stderr
    data = resumed.json()
    assert data["outcome"] == "ambiguous_mutation"
    assert data["ambiguous_call"] == "c2"
    assert log.starts() == ["look", "hang"]
    path = journal / f"{RUN_ID}.journal"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert_no_key(path.read_text(encoding="utf-8"))
    again = await cli("resume", str(journal), "--config", config)
    assert again.returncode == 0
    assert "no unfinished session" in again.stderr


@pytest.mark.slow
async def test_report_reads_a_journal(cli: RunCLI, tmp_path: Path) -> None:
    """A journal is a transcript: ``report`` reads it and shows the session, ``replay``
    re-runs it and finds no difference; ``resume`` with nothing unfinished says so and
    exits 0."""
    journal = tmp_path / "journal"
    ran = await cli("run", "--goal", "look around", "--journal", str(journal), "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["outcome"] == "completed"
    shown = await cli("report", str(journal / f"{RUN_ID}.journal"))
    assert shown.returncode == 0, shown.stderr
    assert "outcome: completed" in shown.stdout
    replayed = await cli("replay", str(journal / f"{RUN_ID}.journal"))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "no difference" in replayed.stdout
    again = await cli("resume", str(journal))
    assert again.returncode == 0
    assert "no unfinished session" in again.stderr
