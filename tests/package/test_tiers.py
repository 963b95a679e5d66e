"""Every test tier in one command, and the tiers a run skipped named in its summary.

The README's ``pytest`` runs what the machine has; the tiers that need more (the npm
reference servers and the conformance suite, the package-index servers, a LiteLLM proxy,
Chromium, the OpenTelemetry SDK) skip there. The summary names each tier that skipped and
what it needs (``tests/tiers.py``), and ``scripts/test-all`` runs them all, as ``.ci/run``
does.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Final

from tests.tiers import TIERS, tier_summary

ROOT: Final = Path(__file__).resolve().parents[2]
TEST_ALL: Final = ROOT / "scripts" / "test-all"


def test_the_summary_names_each_skipped_tier_and_what_it_needs() -> None:
    """Skips are grouped by tier, counted, and each tier says what it needs and the one
    command that runs every tier; a skip outside the tiers is left to pytest's own lines."""
    skipped = [
        ("tests/interop/test_litellm_proxy.py::test_a", "the interop group is not installed"),
        ("tests/interop/test_litellm_proxy.py::test_b", "the interop group is not installed"),
        ("tests/transcript/test_report_browser.py::test_page", "chromium is not installed"),
        ("tests/core/test_wire.py::test_x", "something else"),
    ]
    lines = tier_summary(skipped)
    assert "scripts/test-all" in lines[0]
    litellm = next(line for line in lines if "LiteLLM" in line)
    assert "2 skipped" in litellm
    assert "--group interop" in litellm
    chromium = next(line for line in lines if "Chromium" in line)
    assert "1 skipped" in chromium
    assert not any("test_wire" in line for line in lines)
    assert tier_summary([("tests/core/test_wire.py::test_x", "something else")]) == []


def test_every_tier_names_test_files_that_exist() -> None:
    """A tier's paths lead to tests: a file moved away would leave its skips unnamed."""
    for tier in TIERS:
        for path in tier.paths:
            assert (ROOT / path).exists(), (tier.name, path)


def test_test_all_is_there_and_explains_itself() -> None:
    """``scripts/test-all --help`` says what it runs and needs, and runs nothing."""
    assert os.access(TEST_ALL, os.X_OK)
    found = subprocess.run(  # noqa: S603 - the repository's own script
        [str(TEST_ALL), "--help"], capture_output=True, text=True, check=False, timeout=30
    )
    assert found.returncode == 0, found.stderr
    for tier in TIERS:
        assert tier.name in found.stdout, tier.name


def test_test_all_requires_the_tiers_ci_requires() -> None:
    """``scripts/test-all`` installs and requires what ``.ci/run`` does, so a tier that CI
    runs is never skipped by the one local command either."""
    ci, script = (ROOT / ".ci" / "run").read_text(), TEST_ALL.read_text()
    for needed in (
        "uv sync --locked --extra mcp --group interop --group otel-test",
        "npm ci --prefix tests/mcp/npm --no-audit --no-fund",
        "GRID_AGENT_INTEROP=required",
        "GRID_AGENT_OTEL=required",
        "GRID_AGENT_BROWSER=required",
        "GRID_AGENT_POSTGRES=required",
    ):
        assert needed in ci, needed
        assert needed in script, needed
