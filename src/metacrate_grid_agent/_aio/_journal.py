"""The journal protocol: what a durable-session backend implements.

A :class:`Journal` is a store of run journals (the file journal's directory, a database).
A run takes one :class:`JournalRun` from it, exclusively, either new (:meth:`Journal.create`)
or to resume (:meth:`Journal.claim`, which also gives back the records written so far), and
writes the records of :mod:`metacrate_grid_agent._core._journal` through it, in order:

- :meth:`JournalRun.append`: the record is written in order after every earlier one; the
  call need not wait for it to be durable (the file journal hands it to the OS: it survives
  the death of the process, not of the host). Model turns, read-only calls, verdicts. A
  run whose append never waits may also offer it as a plain method, ``append_now(record)``
  (same promise, same errors): the loop's recorder then calls that, no coroutine per record.
- :meth:`JournalRun.commit`: append, then make it and every earlier record durable
  (``fdatasync``, or the engine's commit) before returning. A mutating call's intent and
  the finish. **If ``commit`` raises, the action it guards does not happen**: the loop never
  calls the executor for an intent that was not committed (fail closed).

Records are read back exactly as written: :meth:`Journal.claim` returns them (the header
first) as far as they were written; a record cut by a crash at the tail is left out; a
journal whose content does not check (not JSON, a broken hash chain, a record of the wrong
shape, past a bound) is a :class:`~metacrate_grid_agent.errors.JournalError`.

Exclusivity and fencing. A run's journal has one writer at a time: ``create`` and ``claim``
take an exclusive hold on the run id (the file journal: ``flock`` on the run's file, held
until ``close`` or the death of the process) and raise
:class:`~metacrate_grid_agent.errors.JournalLockedError` if another holds it; nothing is
written or run then. A process that was stopped (SIGSTOP) still holds its lock, so no other
can take its run over while it lives. What can take over is a newer *generation* of the same
session (a new run the operator started): a backend records, per session, the newest
generation that created or claimed a run, and ``commit`` of a mutating intent raises
:class:`~metacrate_grid_agent.errors.JournalFencedError` when a newer generation than the
run's own has started since. A stopped process that wakes after such a takeover therefore
runs no mutating call; its run ends ``superseded``.

What a backend stores is user data (prompts, replies, arguments, results): it never stores
the API key (the file journal is given it and redacts it from every record), and it stores
records as their msgspec JSON (:func:`~metacrate_grid_agent._core._journal.encode_record`),
never a pickle. Records are never cut: the journal rebuilds the exact history.

Run ids are ``<session_id>-g<generation>-r<run>``
(:func:`~metacrate_grid_agent._core._journal.run_id`); ``create`` refuses an id that
already has a journal (:class:`~metacrate_grid_agent.errors.JournalError`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from metacrate_grid_agent._core._journal import Header, Record

__all__ = ["Journal", "JournalRun"]


@runtime_checkable
class JournalRun(Protocol):
    """One run's journal, held exclusively by the run writing it."""

    @property
    def run_id(self) -> str:
        """The run's id, ``<session_id>-g<generation>-r<run>``."""
        ...

    async def append(self, record: Record) -> None:
        """Write ``record`` after every earlier one; durability is not waited for.

        Raises :class:`~metacrate_grid_agent.errors.JournalError` if it cannot be written.
        """
        ...

    async def commit(self, record: Record) -> None:
        """Write ``record`` and make it and every earlier record durable before returning.

        Raises :class:`~metacrate_grid_agent.errors.JournalError` (the action it guards then
        does not happen), :class:`~metacrate_grid_agent.errors.JournalFencedError` for a
        mutating intent of a run whose session a newer generation has taken over.
        """
        ...

    async def close(self) -> None:
        """Release the run (its lock); idempotent. What was appended stays written."""
        ...


@runtime_checkable
class Journal(Protocol):
    """A store of run journals (a directory, a database): see the module docstring."""

    async def create(self, header: Header) -> JournalRun:
        """A new run's journal, held exclusively, with ``header`` written (appended).

        Raises :class:`~metacrate_grid_agent.errors.JournalError` if the run id already has
        a journal, :class:`~metacrate_grid_agent.errors.JournalLockedError` if held.
        """
        ...

    async def claim(self, run_id: str) -> tuple[JournalRun, tuple[Record, ...]]:
        """An existing run's journal, held exclusively, and its records (header first).

        Raises :class:`~metacrate_grid_agent.errors.JournalLockedError` if another process
        holds it (nothing is done), :class:`~metacrate_grid_agent.errors.JournalError` if it
        does not exist or does not read back.
        """
        ...

    async def pending(self) -> tuple[str, ...]:
        """The run ids whose journal has no finish record, in a stable order."""
        ...

    async def newest_generation(self, session_id: str) -> int | None:
        """The newest generation of ``session_id`` that created or claimed a run, if any."""
        ...
