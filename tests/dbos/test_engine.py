"""What DBOS alone does with a mutating step cut by a crash: the behaviour we guard against."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.dbos.crash import finish, kill_inside, ledger, spawn

if TYPE_CHECKING:
    from pathlib import Path

# Several child processes each launch DBOS (seconds each on a loaded two-core machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_dbos_runs_a_step_cut_by_a_crash_again(database_url: str, tmp_path: Path) -> None:
    """A DBOS step killed (SIGKILL) while it runs is run a second time when its workflow is
    recovered: the ledger shows the effect twice.

    Protects: the reason the adapter never puts a mutating call in a plain DBOS step; if a
    DBOS release stopped re-running such a step, this test says so (and the docs change).
    """
    (tmp_path / "hang").write_text("build")
    kill_inside(spawn("engine", database_url, tmp_path), tmp_path)
    assert ledger(tmp_path) == ["build"]
    recovered = finish(spawn("engine-recover", database_url, tmp_path))
    assert recovered == {"result": "the wall stands"}
    assert ledger(tmp_path) == ["build", "build"]
