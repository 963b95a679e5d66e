"""The journal in a database: :class:`DBOSJournal`, the journal protocol on DBOS's own store.

The records of every run live in three tables beside DBOS's in its system database
(Postgres, or SQLite for one machine), written with SQLAlchemy, which DBOS brings:

- ``grid_agent_runs``: one row per run (its session, generation, the *epoch* of its current
  holder, the next record's number, whether it finished);
- ``grid_agent_records``: the records, one row each, numbered from 0 (the header), as the
  msgspec JSON of :mod:`metacrate_grid_agent._core._journal` (never pickle);
- ``grid_agent_sessions``: per session, the newest generation that created or claimed a run.

Each model request, read-only call and mutating call's intent or result is one transaction,
the *step* of that record (a request's record is held and written with its reply, a
read-only call's with its result). ``append`` commits without waiting for the server's
disk (Postgres ``synchronous_commit = off``: the record survives the death of the process,
not of the database host); ``commit`` waits for it, so a mutating call's intent is durable
on the server before the executor is called, and if the transaction fails the call does
not run.

Exclusivity is by fencing, not by a held lock (a lock held on a connection would cost one
database connection per running session across the fleet). ``create`` gives a run epoch 1,
and every ``claim`` raises the run's epoch by one and hands the claimer the new one; every
write checks, in its transaction, that the run's epoch is still the writer's and that the
record's number is the next one. So when another process claims a run, whatever the first
process still tries to write (after a SIGSTOP, a network partition, a slow executor) is
refused with :class:`~metacrate_grid_agent.errors.JournalFencedError`: it writes no record
and, above all, commits no mutating intent, so it runs no mutating call. The intent commit
also checks that no newer generation of the session has started. DBOS itself admits one
runner per workflow (its queue's dequeue is atomic); the epoch is what keeps that true of
the journal when an operator takes over a stopped, not dead, executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from metacrate_grid_agent._core._journal import (
    Call,
    Finish,
    Header,
    Record,
    Request,
    decode_record,
    encode_record,
    parse_run_id,
)
from metacrate_grid_agent._core._redact import ContentGuard
from metacrate_grid_agent._secret import Secret
from metacrate_grid_agent.errors import JournalError, JournalFencedError

__all__ = ["DBOSJournal", "DBOSJournalRun", "database_url"]

T = TypeVar("T")

#: Longest record accepted, in bytes of JSON (a reply of the largest allowed response and its
#: bookkeeping fits several times over).
MAX_RECORD_BYTES: Final = 64 << 20
#: Most records read back for one run: far above any bounded session's count.
MAX_RECORDS_PER_RUN: Final = 1_000_000
#: How long a SQLite writer waits for another process's transaction, in seconds.
SQLITE_BUSY_TIMEOUT_S: Final = 30.0

_METADATA: Final = sa.MetaData()
RUNS: Final = sa.Table(
    "grid_agent_runs",
    _METADATA,
    sa.Column("run_id", sa.String(120), primary_key=True),
    sa.Column("session_id", sa.String(64), nullable=False, index=True),
    sa.Column("generation", sa.BigInteger, nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("next_seq", sa.BigInteger, nullable=False),
    sa.Column("finished", sa.Boolean, nullable=False),
)
RECORDS: Final = sa.Table(
    "grid_agent_records",
    _METADATA,
    sa.Column("run_id", sa.String(120), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True),
    sa.Column("body", sa.Text, nullable=False),
)
SESSIONS: Final = sa.Table(
    "grid_agent_sessions",
    _METADATA,
    sa.Column("session_id", sa.String(64), primary_key=True),
    sa.Column("newest_generation", sa.BigInteger, nullable=False),
)


def database_url(url: str) -> sa.URL:
    """``url`` (as DBOS takes it: ``postgresql://...`` or ``sqlite:///path``) as a SQLAlchemy
    URL with the driver DBOS brings (psycopg 3) for Postgres."""
    parsed = sa.make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _words(exc: SQLAlchemyError) -> str:
    """What failed, without the statement, its parameters or the URL (they may hold user
    data or a password): the error's class and the driver's class."""
    original = getattr(exc, "orig", None)
    cause = f" ({type(original).__name__})" if original is not None else ""
    return f"{type(exc).__name__}{cause}"


class DBOSJournal:
    """The journal protocol on a database: DBOS's system database, Postgres or SQLite.

    Build it with the same URL as DBOS's ``system_database_url`` (or any other database
    the fleet shares); the tables are created when missing. ``secret`` is the key to
    redact from every record (pass ``llm_config.api_key``): a record whose text shows it is
    stored with it redacted. Every call runs its
    transaction in a worker thread, so the event loop never waits on the database.
    """

    def __init__(
        self, url: str, *, secret: Secret | str | None = None, engine: sa.Engine | None = None
    ) -> None:
        self._guard = ContentGuard(secret)
        self._url = database_url(url)
        self._postgres = self._url.get_backend_name() == "postgresql"
        if engine is None:
            kwargs: dict[str, Any] = {"pool_pre_ping": True}
            if not self._postgres:
                kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
            engine = sa.create_engine(self._url, **kwargs)
        self._engine = engine
        self._ready = False

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine the journal writes through."""
        return self._engine

    async def aclose(self) -> None:
        """Close the journal's database connections (runs already written stay)."""
        await asyncio.to_thread(self._engine.dispose)

    def __repr__(self) -> str:
        return f"DBOSJournal({self._url.render_as_string(hide_password=True)!r})"

    async def _call(self, work: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(work)
        except SQLAlchemyError as exc:
            raise JournalError(
                f"the journal database failed: {_words(exc)}; nothing past the last "
                "written record was done: check the database and resume the run"
            ) from None

    def _ensure_tables(self) -> None:
        if self._ready:
            return
        try:
            _METADATA.create_all(self._engine, checkfirst=True)
        except SQLAlchemyError:  # another process created them at the same moment
            _METADATA.create_all(self._engine, checkfirst=True)
        self._ready = True

    async def setup(self) -> None:
        """Create the journal's tables if they are missing (every other call does it too)."""
        await self._call(self._ensure_tables)

    async def create(self, header: Header) -> DBOSJournalRun:
        """A new run's journal with ``header`` as record 0; refused if the run id has one."""
        body = _encoded(header, self._guard)

        def work() -> None:
            self._ensure_tables()
            with self._engine.begin() as connection:
                try:
                    connection.execute(
                        RUNS.insert().values(
                            run_id=header.run_id,
                            session_id=header.session_id,
                            generation=header.generation,
                            epoch=1,
                            next_seq=1,
                            finished=False,
                        )
                    )
                except IntegrityError:
                    raise JournalError(
                        "this run already has a journal: resume it rather than start it again",
                        run_id=header.run_id,
                    ) from None
                connection.execute(RECORDS.insert().values(run_id=header.run_id, seq=0, body=body))
                self._raise_newest(connection, header.session_id, header.generation)

        await self._call(work)
        return DBOSJournalRun(
            self, header.run_id, header.session_id, header.generation, epoch=1, next_seq=1
        )

    async def claim(self, run_id: str) -> tuple[DBOSJournalRun, tuple[Record, ...]]:
        """An existing run's journal and its records, the header first.

        Claiming raises the run's epoch: from then on, any process that held the run before
        writes nothing more to it (:class:`~metacrate_grid_agent.errors.JournalFencedError`).
        """

        def work() -> tuple[int, int, str, int, list[str]]:
            self._ensure_tables()
            with self._engine.begin() as connection:
                row = connection.execute(
                    _locked(sa.select(RUNS).where(RUNS.c.run_id == run_id), self._postgres)
                ).one_or_none()
                if row is None:
                    raise JournalError("this run id has no journal", run_id=run_id)
                epoch = int(row.epoch) + 1
                connection.execute(RUNS.update().where(RUNS.c.run_id == run_id).values(epoch=epoch))
                self._raise_newest(connection, row.session_id, int(row.generation))
                bodies = list(
                    connection.execute(
                        sa.select(RECORDS.c.body)
                        .where(RECORDS.c.run_id == run_id)
                        .order_by(RECORDS.c.seq)
                        .limit(MAX_RECORDS_PER_RUN + 1)
                    ).scalars()
                )
            return epoch, int(row.next_seq), row.session_id, int(row.generation), bodies

        epoch, next_seq, session_id, generation, bodies = await self._call(work)
        if len(bodies) > MAX_RECORDS_PER_RUN or len(bodies) != next_seq:
            raise JournalError(
                f"the run's journal holds {len(bodies)} records where {next_seq} were written",
                run_id=run_id,
            )
        records = tuple(_decoded(body, run_id) for body in bodies)
        if not records or not isinstance(records[0], Header) or records[0].run_id != run_id:
            raise JournalError("the run's journal does not start with its header", run_id=run_id)
        run = DBOSJournalRun(self, run_id, session_id, generation, epoch=epoch, next_seq=next_seq)
        return run, records

    async def records(self, run_id: str) -> tuple[Record, ...]:
        """The records of run ``run_id`` so far, read only (no claim: the holder is not
        fenced); empty when the run has no journal."""

        def work() -> list[str]:
            self._ensure_tables()
            with self._engine.connect() as connection:
                return list(
                    connection.execute(
                        sa.select(RECORDS.c.body)
                        .where(RECORDS.c.run_id == run_id)
                        .order_by(RECORDS.c.seq)
                        .limit(MAX_RECORDS_PER_RUN + 1)
                    ).scalars()
                )

        bodies = await self._call(work)
        if len(bodies) > MAX_RECORDS_PER_RUN:
            raise JournalError("the run's journal is over the record bound", run_id=run_id)
        return tuple(_decoded(body, run_id) for body in bodies)

    async def exists(self, run_id: str) -> bool:
        """Whether run ``run_id`` has a journal here."""

        def work() -> bool:
            self._ensure_tables()
            with self._engine.connect() as connection:
                found = connection.execute(
                    sa.select(RUNS.c.run_id).where(RUNS.c.run_id == run_id)
                ).scalar_one_or_none()
                return found is not None

        return await self._call(work)

    async def pending(self) -> tuple[str, ...]:
        """The run ids with no finish record, in order."""

        def work() -> tuple[str, ...]:
            self._ensure_tables()
            with self._engine.connect() as connection:
                found = connection.execute(
                    sa.select(RUNS.c.run_id)
                    .where(RUNS.c.finished.is_(False))
                    .order_by(RUNS.c.run_id)
                ).scalars()
                return tuple(found)

        return await self._call(work)

    async def newest_generation(self, session_id: str) -> int | None:
        """The newest generation of ``session_id`` that created or claimed a run, if any."""

        def work() -> int | None:
            self._ensure_tables()
            with self._engine.connect() as connection:
                value = connection.execute(
                    sa.select(SESSIONS.c.newest_generation).where(
                        SESSIONS.c.session_id == session_id
                    )
                ).scalar_one_or_none()
                return None if value is None else int(value)

        return await self._call(work)

    async def start_generation(self, session_id: str, generation: int) -> None:
        """Record that ``generation`` of ``session_id`` has started (before its run exists):
        from then on no run of an older generation commits a mutating intent."""

        def work() -> None:
            self._ensure_tables()
            with self._engine.begin() as connection:
                self._raise_newest(connection, session_id, generation)

        await self._call(work)

    def _raise_newest(self, connection: sa.Connection, session_id: str, generation: int) -> None:
        current = connection.execute(
            _locked(
                sa.select(SESSIONS.c.newest_generation).where(SESSIONS.c.session_id == session_id),
                self._postgres,
            )
        ).scalar_one_or_none()
        if current is None:
            try:
                with connection.begin_nested():
                    connection.execute(
                        SESSIONS.insert().values(
                            session_id=session_id, newest_generation=generation
                        )
                    )
            except IntegrityError:  # inserted by another process meanwhile
                self._raise_newest(connection, session_id, generation)
        elif int(current) < generation:
            connection.execute(
                SESSIONS.update()
                .where(SESSIONS.c.session_id == session_id)
                .values(newest_generation=generation)
            )

    def _write(self, run: DBOSJournalRun, records: list[Record], *, durable: bool) -> None:
        """Write ``records`` (numbered on from the run's next) in one transaction."""
        bodies = [_encoded(record, self._guard) for record in records]
        last = records[-1]
        with self._engine.begin() as connection:
            if self._postgres and not durable:
                connection.execute(sa.text("SET LOCAL synchronous_commit TO OFF"))
            moved = connection.execute(
                RUNS.update()
                .where(
                    RUNS.c.run_id == run.run_id,
                    RUNS.c.epoch == run.epoch,
                    RUNS.c.next_seq == run.next_seq,
                )
                .values(next_seq=run.next_seq + len(records), finished=isinstance(last, Finish))
            ).rowcount
            if moved != 1:
                raise JournalFencedError(
                    "another process took this run over: this one writes nothing more and "
                    "runs no mutating call",
                    run_id=run.run_id,
                )
            if any(isinstance(r, Call) and r.mutating for r in records):
                newest = connection.execute(
                    sa.select(SESSIONS.c.newest_generation).where(
                        SESSIONS.c.session_id == run.session_id
                    )
                ).scalar_one_or_none()
                if newest is not None and int(newest) > run.generation:
                    raise JournalFencedError(
                        f"generation {newest} of the session has started: this run of "
                        f"generation {run.generation} runs no mutating call",
                        run_id=run.run_id,
                    )
            connection.execute(
                RECORDS.insert(),
                [
                    {"run_id": run.run_id, "seq": run.next_seq + n, "body": body}
                    for n, body in enumerate(bodies)
                ],
            )
        run.next_seq += len(records)


def _locked(statement: sa.Select[Any], postgres: bool) -> sa.Select[Any]:
    """``SELECT ... FOR UPDATE`` on Postgres (SQLite serialises writers on its own)."""
    return statement.with_for_update() if postgres else statement


def _encoded(record: Record, guard: ContentGuard) -> str:
    body = encode_record(record)
    if guard.contains_secret_json(body.decode("utf-8", "replace")):
        body = encode_record(
            decode_record(msgspec.json.encode(_scrub(msgspec.to_builtins(record), guard)))
        )
    if len(body) > MAX_RECORD_BYTES:
        raise JournalError(
            f"a {type(record).__name__.lower()} record of {len(body)} bytes is over the "
            f"journal's {MAX_RECORD_BYTES} bytes; nothing was written"
        )
    return body.decode("utf-8")


def _scrub(data: Any, guard: ContentGuard) -> Any:
    """``data`` with the key redacted from every text (never cut: the bound is generous)."""
    if isinstance(data, str):
        return guard.text(data, max(len(data.encode()), 64) * 4)
    if isinstance(data, dict):
        return {key: _scrub(value, guard) for key, value in data.items()}
    if isinstance(data, list):
        return [_scrub(value, guard) for value in data]
    return data


def _decoded(body: str, run_id: str) -> Record:
    if len(body) > MAX_RECORD_BYTES:
        raise JournalError("a record is over the journal's size bound", run_id=run_id)
    try:
        return decode_record(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise JournalError(f"a record does not read back: {exc}", run_id=run_id) from None


class DBOSJournalRun:
    """One run's journal in the database, written by the process that holds its epoch."""

    def __init__(
        self,
        journal: DBOSJournal,
        run_id: str,
        session_id: str,
        generation: int,
        *,
        epoch: int,
        next_seq: int,
    ) -> None:
        self._journal = journal
        self._run_id = run_id
        self.session_id = session_id
        self.generation = generation
        self.epoch = epoch
        self.next_seq = next_seq
        self._held: list[Record] = []
        self._closed = False

    @property
    def run_id(self) -> str:
        """``<session_id>-g<generation>-r<run>``."""
        return self._run_id

    def __repr__(self) -> str:
        return f"DBOSJournalRun({self._run_id!r}, epoch={self.epoch}, records={self.next_seq})"

    async def _write(self, record: Record, *, durable: bool) -> None:
        if self._closed:
            raise JournalError("this run's journal is closed", run_id=self._run_id)
        records = [*self._held, record]
        journal = self._journal
        await journal._call(lambda: journal._write(self, records, durable=durable))  # noqa: SLF001
        self._held.clear()

    async def append(self, record: Record) -> None:
        """Write ``record`` after every earlier one, not waiting for the server's disk.

        A request about to be sent, or a read-only call about to run, is held and written
        with the record that follows it (its reply, its result), in one transaction: one
        write per model request and per read-only call. Losing it in a crash costs what
        losing its write would: the request is sent again with the same id, the read-only
        call runs again.
        """
        if isinstance(record, Request) or (isinstance(record, Call) and not record.mutating):
            if self._closed:
                raise JournalError("this run's journal is closed", run_id=self._run_id)
            self._held.append(record)
            return
        await self._write(record, durable=False)

    async def commit(self, record: Record) -> None:
        """Write ``record`` (after any held one) and wait until it, and every earlier one,
        is durable."""
        await self._write(record, durable=True)

    async def close(self) -> None:
        """Stop writing; idempotent. A held record is dropped (as a crash would drop it);
        no lock is held (see the fencing in the module doc)."""
        self._held.clear()
        self._closed = True


def run_parts(run_id: str) -> tuple[str, int, int]:
    """``(session_id, generation, run)`` of a run id; ValueError if it is not one."""
    parts = parse_run_id(run_id)
    if parts is None:
        raise ValueError(f"{run_id!r} is not a run id (<session>-g<generation>-r<run>)")
    return parts
