"""The journal protocol on a database (DBOSJournal), on SQLite and on the suite's Postgres."""

from __future__ import annotations

import json
import time

import pytest
import sqlalchemy as sa

from metacrate_grid_agent import Effect, Tool
from metacrate_grid_agent._aio._journal import Journal, JournalRun
from metacrate_grid_agent._core._journal import (
    Call,
    Finish,
    Header,
    Record,
    Request,
    Result,
    config_of,
    tool_prints,
    tools_hash,
)
from metacrate_grid_agent._core._types import UserMessage
from metacrate_grid_agent.config import Secret, ToolLoopConfig
from metacrate_grid_agent.dbos import DBOSJournal
from metacrate_grid_agent.errors import JournalError, JournalFencedError

pytestmark = pytest.mark.slow

TOOLS = (
    Tool(
        name="look",
        description="Look around.",
        parameters={"type": "object"},
        effect=Effect.READ_ONLY,
    ),
    Tool(
        name="build",
        description="Build a wall.",
        parameters={"type": "object"},
        effect=Effect.MUTATING,
    ),
)


def header(session: str = "avatar-1", generation: int = 1, run: int = 1) -> Header:
    prints = tool_prints(TOOLS)
    return Header(
        library="test",
        session_id=session,
        generation=generation,
        run=run,
        anchor=time.time(),
        config=config_of(ToolLoopConfig()),
        tools=prints,
        tools_hash=tools_hash(prints),
        approval=False,
        history=(UserMessage(content="build a wall"),),
    )


def intent(call_id: str = "call-1", t: float = 1.0) -> Call:
    return Call(t=t, call_id=call_id, name="build", arguments="{}", effect="mutating")


def looked(t: float = 0.2) -> Result:
    """A read-only call's result: a record written at once."""
    return Result(t=t, call_id="call-0", status="success", observation="a sign")


async def test_a_request_and_a_read_only_call_are_written_with_what_follows_them(
    database_url: str,
) -> None:
    """A request's record is written with its reply, a read-only call's with its result,
    each pair in one transaction; a mutating intent is written at once, with anything held.

    Protects: one database write per model request and per read-only call, two per
    mutating call (the DBOS targets), with the records still in order.
    """
    journal = DBOSJournal(database_url)
    run = await journal.create(header())
    request = Request(t=0.1, turn=1, request_id="avatar-1-g1-r1-t1")
    look = Call(t=0.2, call_id="call-0", name="look", arguments="{}", effect="read_only")
    await run.append(request)
    await run.append(look)
    assert len(await journal.records("avatar-1-g1-r1")) == 1
    await run.append(looked(t=0.3))
    assert (await journal.records("avatar-1-g1-r1"))[1:] == (request, look, looked(t=0.3))
    await run.append(Request(t=0.4, turn=2, request_id="avatar-1-g1-r1-t2"))
    await run.commit(intent(t=0.5))
    assert len(await journal.records("avatar-1-g1-r1")) == 6
    await journal.aclose()


async def test_records_read_back_in_order_after_a_new_journal_object(database_url: str) -> None:
    """Records appended and committed by one journal object read back, header first and in
    order, through another (as a new process would), and the run is pending until finished.

    Protects: the database backend keeps the whole run, so a resume on another host has the
    exact inputs to replay.
    """
    first = DBOSJournal(database_url)
    assert isinstance(first, Journal)
    run = await first.create(header())
    assert isinstance(run, JournalRun)
    written: list[Record] = [
        Request(t=0.1, turn=1, request_id="avatar-1-g1-r1-t1"),
        intent(),
        Result(t=1.5, call_id="call-1", status="success", observation="built"),
    ]
    await run.append(written[0])
    await run.commit(written[1])
    await run.append(written[2])
    await run.close()

    second = DBOSJournal(database_url)
    assert await second.pending() == ("avatar-1-g1-r1",)
    claimed, records = await second.claim("avatar-1-g1-r1")
    assert records == (header_of(records), *written)
    await claimed.commit(Finish(t=2.0, outcome="completed"))
    assert await second.pending() == ()
    assert await second.newest_generation("avatar-1") == 1
    assert await second.newest_generation("nobody") is None
    await first.aclose()
    await second.aclose()


def header_of(records: tuple[object, ...]) -> Header:
    assert isinstance(records[0], Header)
    assert records[0].run_id == "avatar-1-g1-r1"
    return records[0]


async def test_a_run_is_created_once(database_url: str) -> None:
    """Creating a run id that already has a journal is refused, and the first one stays.

    Protects: starting a session twice (a retried start, two hosts) never makes two journals
    for one run.
    """
    journal = DBOSJournal(database_url)
    await journal.create(header())
    with pytest.raises(JournalError, match="already has a journal"):
        await journal.create(header())
    _, records = await journal.claim("avatar-1-g1-r1")
    assert len(records) == 1
    with pytest.raises(JournalError, match="no journal"):
        await journal.claim("avatar-1-g1-r9")
    await journal.aclose()


async def test_a_claim_fences_the_previous_holder(database_url: str) -> None:
    """Once another process claims a run, the first holder can write nothing, above all no
    mutating intent, and the journal is left exactly as the claimer found it.

    Protects: a stopped process that wakes after another took its run over runs no mutating
    call (its intent commit is refused before the executor could be called).
    """
    journal = DBOSJournal(database_url)
    stale = await journal.create(header())
    await stale.append(looked())
    other = DBOSJournal(database_url)
    taker, before = await other.claim("avatar-1-g1-r1")
    with pytest.raises(JournalFencedError, match="took this run over"):
        await stale.commit(intent())
    with pytest.raises(JournalFencedError):
        await stale.append(looked(t=0.3))
    await taker.commit(intent())
    _, after = await journal.claim("avatar-1-g1-r1")
    assert after == (*before, intent())
    await journal.aclose()
    await other.aclose()


async def test_a_newer_generation_fences_mutating_intents_only(database_url: str) -> None:
    """When a newer generation of the session has started, an older run may still append
    (its model turn, its read-only calls) but its mutating intent commit is refused.

    Protects: supersession across processes: the old generation's run never changes the
    world after the new one started, even before its workflow is cancelled.
    """
    journal = DBOSJournal(database_url)
    old = await journal.create(header(generation=1))
    await journal.start_generation("avatar-1", 2)
    assert await journal.newest_generation("avatar-1") == 2
    await old.append(looked())
    with pytest.raises(JournalFencedError, match="generation 2"):
        await old.commit(intent())
    _, records = await journal.claim("avatar-1-g1-r1")
    assert [type(r).__name__ for r in records] == ["Header", "Result"]
    await journal.aclose()


async def test_a_failed_write_is_a_journal_error_that_names_no_data(database_url: str) -> None:
    """A database failure is a JournalError that says what failed without quoting the
    statement, the record or the URL, and the record is not half written.

    Protects: fail closed (a failed intent write means the call does not run) and no user
    data or password in an error message.
    """
    journal = DBOSJournal(database_url)
    run = await journal.create(header())
    with journal.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE grid_agent_records"))
    with pytest.raises(JournalError) as caught:
        await run.commit(intent())
    assert "the journal database failed" in str(caught.value)
    assert "build" not in str(caught.value)
    assert "INSERT" not in str(caught.value)
    await journal.aclose()


@pytest.mark.parametrize(
    "key",
    [
        "sk-dbos-journal-canary-0123456789abcdef",
        'sk-dbos-quote"canary-0123456789abcdef',
        "sk-dbos-back\\slash-canary-0123456789ab",
    ],
)
async def test_the_key_is_never_written_to_the_database(database_url: str, key: str) -> None:
    """A record whose text shows the key (an endpoint echoing it in a reply or an
    observation) is stored with the key redacted; nothing else changes. A key holding a
    character JSON escapes (a quote, a backslash) is found as JSON writes it.

    Protects: the journal holds user data but never the credential, in a database as in a
    file.
    """
    journal = DBOSJournal(database_url, secret=Secret(key))
    run = await journal.create(header())
    await run.append(Result(t=0.2, call_id="call-0", status="success", observation=f"k={key}"))
    with journal.engine.connect() as connection:
        stored = " ".join(
            connection.execute(sa.text("SELECT body FROM grid_agent_records")).scalars()
        )
    assert key not in stored
    assert json.dumps(key)[1:-1] not in stored
    assert key[:16] not in stored
    records = await journal.records("avatar-1-g1-r1")
    assert isinstance(records[1], Result)
    assert records[1].observation.startswith("k=")
    assert key not in repr(journal)
    await journal.aclose()
