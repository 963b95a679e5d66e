"""Hostile stdio servers (``tests/mcp/hostile_server.py``): the adapter fails closed on each.

Every test bounds itself with short limits: a regression shows as a clear failure, not a hang.
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

from metacrate_grid_agent import CancelToken, Effect, Failure, ValidatedCall
from metacrate_grid_agent.mcp import McpLimits, McpServer, McpToolset
from tests.mcp.support import ROOT

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
