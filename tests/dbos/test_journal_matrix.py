"""The crash matrix of ``tests/journal/test_crash_matrix.py`` on the database journal.

The same scripted session (three turns, read-only and mutating calls, one approval, one
compaction, a final text), killed with SIGKILL in a real child process right before and
right after each of its 18 journal records and inside each tool call's effect (44 points),
then resumed by a new child, with its journal in a database: a SQLite file, and a database
on the suite's Postgres cluster. The rules are the file journal's (its ``check``): every
mutating call at most once in the ledger, a kill between a mutating intent and its result
ends ``ambiguous_mutation`` naming it, any other kill ends as the uncrashed run, a request
is sent at most twice with the same id.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import pytest
import sqlalchemy as sa

from metacrate_grid_agent.dbos import DBOSJournal
from metacrate_grid_agent.dbos._store import RECORDS, RUNS
from metacrate_grid_agent.journal import Call, Finish, decode_record
from metacrate_grid_agent.testing import FakeEndpoint
from tests.cli.conftest import together
from tests.dbos.conftest import drop_postgres_database, fresh_postgres_database
from tests.journal import children
from tests.journal.scenario import FINAL_TEXT, RUN_ID, read_ledger, respond
from tests.journal.test_crash_matrix import KILL_POINTS, check, open_intent
from tests.proof_profiles import crash_points

if TYPE_CHECKING:
    from pathlib import Path

    from tests.dbos.postgres import Postgres

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: Bound on one child: it finishes in about a second on loopback.
CHILD_TIMEOUT_S: Final = 60.0
#: Children at once: one per core.
LIMIT: Final = os.cpu_count() or 1
#: The points whose kill falls between a mutating intent and its result (as on files).
AMBIGUOUS_POINTS: Final = (
    "after:7",
    "before:8",
    "effect:c2:before",
    "effect:c2:after",
    "after:11",
    "before:12",
    "effect:c3:before",
    "effect:c3:after",
)


async def child(
    mode: str, database: str, url: str, ledger: Path, cue: str | None = None
) -> tuple[int, dict[str, Any] | None]:
    """Run tests/dbos/matrix_child.py; its exit status and its JSON (None if killed)."""
    args = [mode, database, url, str(ledger), *([] if cue is None else [cue])]
    process = await children.start("tests.dbos.matrix_child", *args)
    return children.killed_or_shape(await children.finish(process, CHILD_TIMEOUT_S))


async def records_of(database: str) -> list[Any]:
    """The run's records as the database holds them (read without claiming)."""
    journal = DBOSJournal(database)
    try:
        return list(await journal.records(RUN_ID))
    finally:
        await journal.aclose()


class Databases:
    """A fresh database per kill point, of the kind under test."""

    def __init__(self, kind: str, folder: Path, postgres: Postgres | None) -> None:
        self.kind = kind
        self.folder = folder
        self.postgres = postgres

    def fresh(self, name: str) -> str:
        if self.postgres is None:
            return f"sqlite:///{self.folder / name}.sqlite"
        return fresh_postgres_database(self.postgres)

    def drop(self, url: str) -> None:
        if self.postgres is not None:
            drop_postgres_database(self.postgres, url)


@pytest.fixture(params=["sqlite", "postgres"])
def databases(request: pytest.FixtureRequest, tmp_path: Path) -> Databases:
    """Where each kill point's journal lives."""
    postgres = request.getfixturevalue("postgres") if request.param == "postgres" else None
    return Databases(str(request.param), tmp_path, postgres)


def lose_what_was_not_committed(database: str) -> None:
    """What a database host crash can lose: every record after the last one whose
    transaction was waited for (a mutating intent, the finish); the later ones committed
    without waiting (``synchronous_commit = off``)."""
    journal = DBOSJournal(database)
    try:
        if not sa.inspect(journal.engine).has_table(RECORDS.name):
            return  # killed before its first record: nothing to lose
        with journal.engine.begin() as connection:
            rows = connection.execute(
                sa.select(RECORDS.c.seq, RECORDS.c.body)
                .where(RECORDS.c.run_id == RUN_ID)
                .order_by(RECORDS.c.seq)
            ).all()
            keep = 1 if rows else 0  # the header's transaction (the run's creation) waits
            for seq, body in rows:
                record = decode_record(body)
                if isinstance(record, Finish) or (isinstance(record, Call) and record.mutating):
                    keep = seq + 1
            if keep == 0:  # not even the header was waited for: the run is gone
                connection.execute(sa.delete(RUNS).where(RUNS.c.run_id == RUN_ID))
            else:
                connection.execute(
                    RUNS.update().where(RUNS.c.run_id == RUN_ID).values(next_seq=keep)
                )
            connection.execute(
                sa.delete(RECORDS).where(RECORDS.c.run_id == RUN_ID, RECORDS.c.seq >= keep)
            )
    finally:
        journal.engine.dispose()


async def crash_and_resume(
    cue: str, databases: Databases, *, host_crash: bool = False, resume_cue: str | None = None
) -> dict[str, Any]:
    """Kill the run at ``cue`` (then lose what a host crash loses, if asked; then kill the
    resume at ``resume_cue``, if given), resume it in a new child; what happened."""
    folder = databases.folder / f"{cue.replace(':', '-')}-{resume_cue or 'once'}"
    folder.mkdir()
    database = await asyncio.to_thread(databases.fresh, folder.name)
    ledger = folder / "ledger"
    async with FakeEndpoint(responder=respond) as ep:
        status, first = await child("run", database, ep.url, ledger, cue)
        if host_crash:
            await asyncio.to_thread(lose_what_was_not_committed, database)
        intent = open_intent(await records_of(database))
        resume_status = None
        if resume_cue is not None:
            resume_status, _ = await child("resume", database, ep.url, ledger, resume_cue)
        status2, shape = await child("resume", database, ep.url, ledger)
        ids = [r.header("X-Request-Id") for r in ep.requests]
    await asyncio.to_thread(databases.drop, database)
    return {
        "cue": cue,
        "killed": status == -signal.SIGKILL,
        "resume_killed": resume_status == -signal.SIGKILL,
        "first": first,
        "intent": intent,
        "shape": shape,
        "status": status2,
        "ledger": read_ledger(ledger),
        "ids": ids,
    }


async def test_a_kill_at_any_point_of_a_database_journal_runs_nothing_twice(
    databases: Databases,
) -> None:
    """The matrix on the database journal (a real SIGKILL at each kill point, resumed in a
    new process; by default every ambiguous point and a fixed sample of the others, all 44
    under ``CRASH_PROFILE=long``), on SQLite and on Postgres: see the module doc for the
    rules.

    Protects: the journal's guarantees hold on the fleet's store, not only on files.
    """
    async with FakeEndpoint(responder=respond) as ep:
        database = await asyncio.to_thread(databases.fresh, "uncrashed")
        status, expected = await child("run", database, ep.url, databases.folder / "ledger0")
    await asyncio.to_thread(databases.drop, database)
    assert status == 0
    assert expected is not None
    assert expected["final_text"] == FINAL_TEXT
    assert read_ledger(databases.folder / "ledger0") == ["c2", "c3"]
    points = crash_points(KILL_POINTS, AMBIGUOUS_POINTS)
    outcomes = await together(*(crash_and_resume(cue, databases) for cue in points), limit=LIMIT)
    broken = {o["cue"]: why for o in outcomes if (why := check(o, expected)) is not None}
    assert broken == {}
    assert all(o["killed"] for o in outcomes), [o["cue"] for o in outcomes if not o["killed"]]
    ambiguous = sorted(o["cue"] for o in outcomes if o["intent"] is not None)
    assert ambiguous == sorted(AMBIGUOUS_POINTS)
    assert all(max(Counter(o["ledger"]).values(), default=0) <= 1 for o in outcomes)


@pytest.fixture
def postgres_databases(postgres: Postgres, tmp_path: Path) -> Databases:
    """Each kill point's journal in a fresh database on the suite's Postgres."""
    return Databases("postgres", tmp_path, postgres)


async def test_a_database_host_crash_loses_only_what_was_not_waited_for(
    postgres_databases: Databases,
) -> None:
    """The matrix again on Postgres, each journal then cut back to its last waited-for
    commit (what a crash of the database host can lose of ``synchronous_commit = off``
    transactions): still no mutating call twice, and the session ends ambiguous, as
    uncrashed, or (nothing durable yet) has no journal to resume.

    Protects: only a mutating intent and the finish need the server's disk; everything
    else may be lost with the database host and costs a re-run, never a duplicate.
    """
    async with FakeEndpoint(responder=respond) as ep:
        database = await asyncio.to_thread(postgres_databases.fresh, "uncrashed")
        ledger = postgres_databases.folder / "ledger0"
        status, expected = await child("run", database, ep.url, ledger)
    await asyncio.to_thread(postgres_databases.drop, database)
    assert status == 0
    assert expected is not None
    outcomes = await together(
        *(
            crash_and_resume(cue, postgres_databases, host_crash=True)
            for cue in crash_points(KILL_POINTS, AMBIGUOUS_POINTS)
        ),
        limit=LIMIT,
    )
    broken = {o["cue"]: why for o in outcomes if (why := check(o, expected)) is not None}
    assert broken == {}


@pytest.mark.parametrize("resume_cue", ["before:2", "after:1"])
async def test_a_crash_during_the_resume_of_a_database_journal_converges(
    resume_cue: str, databases: Databases
) -> None:
    """Killed after turn 1's reply, then killed again while resuming (at two of its first
    records; the file journal's matrix takes each of the first four), then resumed: the
    same end as the uncrashed run, each call executed once.

    Protects: a resume is itself crash-safe on the database journal.
    """
    async with FakeEndpoint(responder=respond) as ep:
        database = await asyncio.to_thread(databases.fresh, "uncrashed")
        status, expected = await child("run", database, ep.url, databases.folder / "ledger0")
    await asyncio.to_thread(databases.drop, database)
    assert status == 0
    assert expected is not None
    outcome = await crash_and_resume("after:3", databases, resume_cue=resume_cue)
    assert outcome["resume_killed"]
    assert check(outcome, expected) is None
    assert outcome["ledger"] == ["c2", "c3"]
