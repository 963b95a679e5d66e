"""Durable sessions on DBOS survive SIGKILL without running a mutating call twice.

Every session runs in a real child process (tests/dbos/worker.py) on SQLite and on the
suite's Postgres; every effect is appended to a ledger file outside the process; kills are
SIGKILL to the worker's whole process group, at a point the worker itself reports.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Final

import pytest

from tests.dbos.crash import finish, kill_inside, ledger, spawn, wait_inside
from tests.dbos.worker import FINAL_TEXT

if TYPE_CHECKING:
    from pathlib import Path

# Several child processes each launch DBOS (seconds each on a loaded two-core machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: The fleet's scenarios (takeover, supersession, approvals, starting twice) run on Postgres,
#: the fleet's database; the crash tests above them run on SQLite too (each test starts DBOS
#: in several processes, seconds apiece, and the tier must fit the CI run).
ON_POSTGRES: Final = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)

RUN_ID = "avatar-7-g1-r1"


def test_an_uncrashed_session_runs_each_call_once(database_url: str, tmp_path: Path) -> None:
    """The reference run: look, build, the final text; each effect once.

    Protects: a session as a DBOS workflow over the database journal completes like a
    plain one (the outcome every crash below is compared with).
    """
    done = finish(spawn("start", database_url, tmp_path))
    outcome = done["outcome"]
    assert outcome["run_id"] == RUN_ID
    assert outcome["outcome"] == "completed"
    assert outcome["final_text"] == FINAL_TEXT
    assert [(c["name"], c["status"]) for c in outcome["calls"]] == [
        ("look", "ok"),
        ("build", "ok"),
    ]
    assert ledger(tmp_path) == ["look", "build"]


def test_a_kill_inside_a_mutating_call_ends_ambiguous_and_never_reruns_it(
    database_url: str, tmp_path: Path
) -> None:
    """SIGKILL while ``build`` runs; DBOS recovers the workflow in a new process, which
    resumes the journal: the outcome is ``ambiguous_mutation`` naming that call, and the
    ledger shows ``build`` once.

    Protects: the issue's central guarantee on DBOS (on SQLite and on Postgres): the intent
    is committed before the call, and an intent without its result is a verdict, not a
    retry, where DBOS alone runs the step again (test_engine.py).
    """
    (tmp_path / "hang").write_text("build")
    assert kill_inside(spawn("start", database_url, tmp_path), tmp_path) == "build"
    assert ledger(tmp_path) == ["look", "build"]
    done = finish(spawn("recover", database_url, tmp_path, "--run", RUN_ID))
    outcome = done["outcome"]
    assert outcome["outcome"] == "ambiguous_mutation"
    assert outcome["ambiguous_call"] == "call-build"
    assert ledger(tmp_path) == ["look", "build"]


def test_a_kill_inside_a_read_only_call_resumes_to_the_uncrashed_end(
    database_url: str, tmp_path: Path
) -> None:
    """SIGKILL while ``look`` runs; the recovered session runs ``look`` again (it changes
    nothing), then ``build`` once, and ends exactly as the uncrashed run.

    Protects: a kill anywhere but inside a mutating call costs a re-run of what was lost,
    never a different end.
    """
    (tmp_path / "hang").write_text("look")
    assert kill_inside(spawn("start", database_url, tmp_path), tmp_path) == "look"
    done = finish(spawn("recover", database_url, tmp_path, "--run", RUN_ID))
    outcome = done["outcome"]
    assert outcome["outcome"] == "completed"
    assert outcome["final_text"] == FINAL_TEXT
    assert [(c["name"], c["status"]) for c in outcome["calls"]] == [
        ("look", "ok"),
        ("build", "ok"),
    ]
    assert ledger(tmp_path) == ["look", "look", "build"]


@ON_POSTGRES
def test_a_live_executor_takes_over_a_dead_ones_session(database_url: str, tmp_path: Path) -> None:
    """Executor A is killed inside ``look``; executor B calls ``take_over("executor-a")``
    and finishes the session: ``build`` runs once, on B, and the end is the uncrashed one.

    Protects: the operator's one call that moves a dead executor's pending sessions to a
    live one (DBOS itself recovers only its own executor id's at launch).
    """
    (tmp_path / "hang").write_text("look")
    kill_inside(spawn("start", database_url, tmp_path), tmp_path)
    done = finish(
        spawn(
            "takeover",
            database_url,
            tmp_path,
            "--run",
            RUN_ID,
            "--executor",
            "executor-b",
            "--dead",
            "executor-a",
        )
    )
    assert done["outcome"]["outcome"] == "completed"
    assert ledger(tmp_path) == ["look", "look", "build"]


@ON_POSTGRES
def test_a_newer_generation_supersedes_a_running_one_across_processes(
    database_url: str, tmp_path: Path
) -> None:
    """Generation 1 runs on executor A and waits inside ``look``; executor B starts
    generation 2 of the same session. Generation 1 ends ``superseded`` and never builds;
    generation 2 runs to its end.

    Protects: supersession across processes: the new generation is recorded before the old
    workflow is cancelled, so the old run stops and commits no mutating intent.
    """
    (tmp_path / "hang").write_text("look")
    first = spawn("start", database_url, tmp_path)
    assert wait_inside(first, tmp_path) == "look"
    second = finish(
        spawn("start", database_url, tmp_path, "--generation", "2", "--executor", "executor-b")
    )
    (tmp_path / "release").write_text("go")
    old = finish(first)
    assert old["outcome"]["outcome"] == "superseded", old
    assert second["outcome"]["run_id"] == "avatar-7-g2-r1"
    assert second["outcome"]["outcome"] == "completed"
    assert ledger(tmp_path) == ["look", "look", "build"]


@ON_POSTGRES
def test_starting_a_session_twice_runs_it_once(database_url: str, tmp_path: Path) -> None:
    """Two starts of the same generation return the same run id and run one session: each
    effect once.

    Protects: the workflow id is the run id, so a retried start (a lost answer, two
    schedulers) never doubles a session.
    """
    done = finish(spawn("start", database_url, tmp_path, "--twice"))
    assert done["outcome"]["outcome"] == "completed"
    assert ledger(tmp_path) == ["look", "build"]


@ON_POSTGRES
def test_an_approval_awaited_across_a_crash_is_answered_once(
    database_url: str, tmp_path: Path
) -> None:
    """The session is killed while it waits for the approval of ``build``; the operator
    answers from another process while no executor runs it; the recovered session gets that
    answer and runs ``build`` once.

    Protects: approvals wait durably (DBOS.recv in the approval's own workflow): neither
    the question nor the answer is lost with the process, and the call is not run unasked.
    """
    assert kill_inside(spawn("start", database_url, tmp_path, "--approval"), tmp_path) == (
        "approval"
    )
    assert ledger(tmp_path) == ["look"]
    answered = finish(
        spawn("approve", database_url, tmp_path, "--run", RUN_ID, "--executor", "executor-c")
    )
    assert answered == {"waiting": ["call-build"]}
    done = finish(spawn("recover", database_url, tmp_path, "--run", RUN_ID, "--approval"))
    assert done["outcome"]["outcome"] == "completed"
    assert ledger(tmp_path) == ["look", "build"]


@ON_POSTGRES
def test_a_stopped_executor_runs_no_mutating_call_after_a_takeover(
    database_url: str, tmp_path: Path
) -> None:
    """Executor A is stopped (SIGSTOP) inside ``look``; B takes its session over and ends
    it; A is continued (SIGCONT) and let out of ``look``: A's run is fenced, writes nothing
    more and never builds.

    Protects: a stopped, not dead, process that wakes after another took its run over runs
    no mutating call (the run's epoch, raised by the takeover's claim).
    """
    (tmp_path / "hang").write_text("look")
    first = spawn("start", database_url, tmp_path)
    wait_inside(first, tmp_path)
    os.killpg(first.pid, signal.SIGSTOP)
    try:
        taken = finish(
            spawn(
                "takeover",
                database_url,
                tmp_path,
                "--run",
                RUN_ID,
                "--executor",
                "executor-b",
                "--dead",
                "executor-a",
            )
        )
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    assert taken["outcome"]["outcome"] == "completed"
    (tmp_path / "release").write_text("go")
    finish(first)
    assert ledger(tmp_path) == ["look", "look", "build"]
