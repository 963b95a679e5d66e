"""The test tiers that need more than the README's ``pytest`` gives, and what each needs.

A run that skips tests of a tier ends with one line per such tier (``tests/conftest.py``'s
summary hook calls :func:`tier_summary`): how many of its tests skipped and what would run
them. ``scripts/test-all`` installs and requires every tier, as ``.ci/run`` does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable

#: The one command that runs every tier (on this machine's project Python).
TEST_ALL: Final = "scripts/test-all"


@dataclass(frozen=True)
class Tier:
    """A tier: its name, the test paths it covers (first match wins), what it needs."""

    name: str
    paths: tuple[str, ...]
    needs: str


TIERS: Final = (
    Tier(
        "npm reference servers and the MCP conformance suite",
        ("tests/mcp/test_mcp_reference_servers.py", "tests/mcp/test_mcp_conformance.py"),
        "Node.js and npm ci --prefix tests/mcp/npm --no-audit --no-fund (uvx and the "
        "package index for mcp-server-time)",
    ),
    Tier(
        "mcp-server-git sessions",
        ("tests/cli/test_mcp_git.py", "tests/docs/test_sessions.py"),
        "git, uvx and the package index (mcp-server-git is started with uvx)",
    ),
    Tier(
        "LiteLLM proxy",
        ("tests/interop/",),
        "the interop group: uv sync --locked --extra mcp --group interop --group otel-test",
    ),
    Tier(
        "Chromium report page",
        ("tests/transcript/test_report_browser.py",),
        "the chromium command (apt-get install chromium)",
    ),
    Tier(
        "OpenTelemetry SDK and opentelemetry-instrument",
        ("tests/otel/", "tests/cli/test_tracing.py", "tests/docs/test_trace_picture.py"),
        "the otel-test group (a default group: uv sync --locked --group otel-test)",
    ),
    Tier(
        "Postgres (DBOS tier)",
        ("tests/dbos/",),
        "initdb and pg_ctl from the postgresql package (apt-get install postgresql); the "
        "suite starts its own throwaway cluster on loopback",
    ),
    Tier(
        "MCP SDK",
        ("tests/mcp/", "tests/cli/test_run_mcp.py", "tests/cli/test_model_script.py"),
        "the mcp extra: uv sync --locked --extra mcp",
    ),
)


def _tier_of(nodeid: str) -> Tier | None:
    path = nodeid.split("::", 1)[0]
    return next((t for t in TIERS if any(path.startswith(p) for p in t.paths)), None)


def tier_summary(skipped: Iterable[tuple[str, str]]) -> list[str]:
    """The summary lines for ``skipped`` (node id, reason): one per tier that skipped, or
    none when no tier did (other skips keep pytest's own lines)."""
    counts: Counter[Tier] = Counter()
    for nodeid, _reason in skipped:
        tier = _tier_of(nodeid)
        if tier is not None:
            counts[tier] += 1
    if not counts:
        return []
    lines = [f"test tiers skipped here ({TEST_ALL} runs them all, as CI does):"]
    lines += [
        f"  {tier.name}: {counts[tier]} skipped; needs {tier.needs}"
        for tier in TIERS
        if tier in counts
    ]
    return lines
