"""Each module of the transcript package imports first, on its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The ``transcript`` package re-exports what its modules define; they import one another,
# never the package: whichever a program imports first, all of them load.
CYCLE = (
    "transcript",
    "transcript._replay",
    "transcript._report",
    "transcript._load",
    "transcript._writer",
    "transcript._schema",
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", CYCLE)
def test_each_module_of_the_transcript_package_imports_first(name: str) -> None:
    """Importing ``_replay`` or ``_report`` before ``transcript`` (a fresh interpreter, a
    checker walking the package in name order) does not fail on a partly loaded module."""
    script = (
        f"import metacrate_grid_agent.{name}\n"
        "from metacrate_grid_agent.transcript import replay, report, report_html, Difference\n"
        "print('ok')\n"
    )
    done = subprocess.run(  # noqa: S603 - our own interpreter and a fixed script
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr
