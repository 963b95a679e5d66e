"""Hostile stdio servers (``tests/mcp/hostile_server.py``): the adapter fails closed on each.

Every test bounds itself with short limits: a regression shows as a clear failure, not a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

from metacrate_grid_agent import (
    Ambiguous,
    CancelToken,
    Effect,
    Failure,
    ValidatedCall,
    __version__,
)
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import ConnectError, ToolDefinitionError
from metacrate_grid_agent.mcp import McpLimits, McpServer, McpToolset
from tests.mcp.support import ROOT, WAIT_S

pytestmark = pytest.mark.slow

#: Start-up limit for a server that answers at once.
STARTUP_S = 5.0


def hostile(mode: str, *args: str, label: str = "hostile") -> McpServer:
    """The hostile server in ``mode`` as a stdio subprocess."""
    return McpServer.stdio(
        label,
        sys.executable,
        ["-m", "tests.mcp.hostile_server", mode, *args],
        env={"PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )


def limits(**overrides: float) -> McpLimits:
    """Short limits for these tests."""
    return McpLimits(**{"startup_timeout_s": STARTUP_S, **overrides})  # type: ignore[arg-type]


async def test_only_a_json_true_read_only_hint_makes_a_tool_read_only() -> None:
    """``readOnlyHint: "yes"`` or ``1`` leaves a tool mutating; only JSON ``true`` does not.

    Protects: effect fails closed on the raw annotation, never on a coerced value.
    """
    async with McpToolset([hostile("coerced")], limits=limits()) as toolset:
        effects = {tool.name: tool.effect for tool in toolset.tools}
    assert effects["ro_true"] is Effect.READ_ONLY
    assert effects["ro_yes"] is Effect.MUTATING
    assert effects["ro_one"] is Effect.MUTATING


async def test_one_bad_tool_is_left_out_and_the_rest_stay_usable() -> None:
    """An invalid annotation value or a non-object ``inputSchema`` skips that tool alone.

    Protects: one bad tool never takes its server down; the reason is in ``skipped``.
    """
    async with McpToolset([hostile("hints")], limits=limits()) as toolset:
        names = [tool.name for tool in toolset.tools]
        skipped = {entry.name: entry.reason for entry in toolset.skipped}
        outcome = await toolset.executor.execute(
            ValidatedCall("c1", "ok", {}, Effect.MUTATING), CancelToken()
        )
    assert names == ["ro_true", "ro_yes", "ro_one", "ok"]
    assert sorted(skipped) == ["ro_maybe", "string_schema"]
    assert "annotations.readOnlyHint" in skipped["ro_maybe"]
    assert "inputSchema" in skipped["string_schema"]
    assert "fine" in getattr(outcome, "observation", "")
    assert not isinstance(outcome, Failure)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_a_server_ignoring_sigterm_fails_start_up_within_the_limit() -> None:
    """A server that ignores SIGTERM and never answers fails start-up at the limit.

    Protects: the start-up limit holds (the process is killed, not waited out), and the
    error says what did not happen within how long.
    """
    started = time.monotonic()
    with pytest.raises(ConnectError, match=r"no initialize answer within 0\.5 s"):
        async with McpToolset([hostile("stubborn")], limits=limits(startup_timeout_s=0.5)):
            pass  # pragma: no cover - start-up fails
    assert time.monotonic() - started < 1.5


async def test_a_servers_helper_process_ends_with_the_block(tmp_path: Path) -> None:
    """A helper process the server started is ended with the server.

    Protects: nothing a stdio server starts outlives the toolset (its process group ends).
    """
    pid_file = tmp_path / "helper.pid"
    async with McpToolset([hostile("helper", str(pid_file))], limits=limits()):
        pid = int(pid_file.read_text(encoding="utf-8"))
        assert alive(pid)
    async with asyncio.timeout(WAIT_S):
        while True:  # another process's end: there is no event to await
            if not alive(pid):
                break
            await asyncio.sleep(0.02)
    assert not alive(pid)


@pytest.mark.parametrize(
    ("effect", "outcome_type"), [(Effect.READ_ONLY, Failure), (Effect.MUTATING, Ambiguous)]
)
async def test_an_oversized_stdio_result_fails_that_call_at_once(
    effect: Effect, outcome_type: type[object]
) -> None:
    """A result line over max_response_bytes is refused at once; later calls still work.

    Protects: a stdio message is bounded at the reader; the call does not wait out its
    timeout; a mutating call that finished with an unreadable result is ambiguous.
    """
    server = hostile("big", "200000")
    async with McpToolset([server], limits=limits(max_response_bytes=100_000)) as toolset:
        started = time.monotonic()
        outcome = await toolset.executor.execute(
            ValidatedCall("c1", "ok", {}, effect), CancelToken()
        )
        elapsed = time.monotonic() - started
    assert type(outcome) is outcome_type
    assert "larger than max_response_bytes (100000)" in getattr(outcome, "observation", "")
    assert elapsed < 2.0


async def test_a_lone_surrogate_in_a_result_fails_the_call_at_once() -> None:
    """A text result holding a lone surrogate is a failed call, reported at once.

    Protects: an unreadable answer never waits out the tool timeout.
    """
    async with McpToolset([hostile("surrogate")], limits=limits()) as toolset:
        started = time.monotonic()
        outcome = await toolset.executor.execute(
            ValidatedCall("c1", "ok", {}, Effect.READ_ONLY), CancelToken()
        )
        elapsed = time.monotonic() - started
    assert type(outcome) is Failure
    assert "could not be read" in outcome.observation
    assert elapsed < 2.0


async def test_a_servers_stderr_is_logged_bounded_and_redacted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each stderr line is logged with the server's label, cut to a bound, secrets hidden.

    Protects: a server's stderr never reaches the log unbounded or with its env's secrets.
    """
    secret = "s3cr3t-value-0123456789abcdef"
    server = McpServer.stdio(
        "noisy",
        sys.executable,
        ["-m", "tests.mcp.hostile_server", "stderr", secret],
        env={"PYTHONPATH": str(ROOT), "API_TOKEN": secret},
        cwd=str(ROOT),
    )
    caplog.set_level(logging.INFO, logger="metacrate_grid_agent.mcp")
    async with McpToolset([server], limits=limits()):
        async with asyncio.timeout(WAIT_S):
            while True:  # another process's output: there is no event to await
                if "yyyy" in caplog.text:
                    break
                await asyncio.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if "stderr" in r.getMessage()]
    assert secret not in caplog.text
    assert any(line.startswith("MCP server 'noisy' stderr: starting with") for line in lines)
    assert max(len(line) for line in lines) < 2_000


async def test_a_tool_listed_twice_by_one_server_says_what_can_help() -> None:
    """A server listing one name twice is an error that does not suggest a prefix.

    Protects: the message names the server and tool and says what can help (the server's
    listing, or blocking the tool), not a prefix, which cannot tell the two apart.
    """
    with pytest.raises(ToolDefinitionError) as caught:
        async with McpToolset([hostile("duplicate")], limits=limits()):
            pass  # pragma: no cover - start-up fails
    text = str(caught.value)
    assert "MCP server 'hostile' lists tool 'ok' more than once" in text
    assert "block_tools=" in text
    assert "prefix" not in text


async def test_a_tool_filter_keeps_a_server_within_the_loops_tool_ceiling() -> None:
    """``allow_tools`` and ``block_tools`` choose a server's tools before any check.

    Protects: a server offering more tools than ``max_tools`` can be used with a filter; a
    blocked tool is neither offered to the loop nor routed; each tool the filter left out is
    in ``skipped`` with the filter's reason.
    """
    config = ToolLoopConfig(max_tools=2)
    with pytest.raises(ToolDefinitionError):
        async with McpToolset([hostile("coerced")], config=config, limits=limits()):
            pass  # pragma: no cover - too many tools
    server = McpServer.stdio(
        "hostile",
        sys.executable,
        ["-m", "tests.mcp.hostile_server", "coerced"],
        env={"PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
        allow_tools={"ok", "ro_true", "ro_yes"},
        block_tools={"ro_yes"},
    )
    async with McpToolset([server], config=config, limits=limits()) as toolset:
        names = [tool.name for tool in toolset.tools]
        refused = await toolset.executor.execute(
            ValidatedCall("c1", "ro_yes", {}, Effect.MUTATING), CancelToken()
        )
    assert names == ["ro_true", "ok"]
    assert refused == Failure("no MCP tool is called 'ro_yes'; the call was not sent")
    reasons = {skip.name: skip.reason for skip in toolset.skipped}
    assert reasons["ro_yes"] == "in the server's block_tools"
    assert set(reasons.values()) >= {"not in the server's allow_tools"}


async def test_a_server_ignoring_the_discover_probe_starts_with_initialize() -> None:
    """A server that never answers ``server/discover`` still starts, within the limit.

    Protects: the protocol probe is bounded well inside the start-up limit and the client
    falls back to the ``initialize`` handshake.
    """
    started = time.monotonic()
    async with McpToolset([hostile("no_discover")], limits=limits(startup_timeout_s=2.0)) as ts:
        names = [tool.name for tool in ts.tools]
    assert names == ["ok"]
    assert time.monotonic() - started < 2.0


async def test_the_client_names_itself_and_declares_no_elicitation(tmp_path: Path) -> None:
    """``initialize`` names this package and its version, and asks for no server requests.

    Protects: a server's logs tell this client apart from others using the same SDK; no
    elicitation, sampling or roots capability is declared, so a compliant server never
    asks this client for input it cannot give.
    """
    record = tmp_path / "initialize.json"
    async with McpToolset([hostile("record", str(record))], limits=limits()):
        pass
    params = json.loads(record.read_text(encoding="utf-8"))
    info = params["clientInfo"]
    assert (info["name"], info["version"]) == ("metacrate-grid-agent", __version__)
    assert set(params["capabilities"]) & {"elicitation", "sampling", "roots"} == set()
