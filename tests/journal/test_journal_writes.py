"""What a journaled run writes, and when: a mutating call's intent is durable before the
executor is called, a failed write keeps the call from running, and the only syncs are one
per mutating call and one at the finish."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import LLMClient, Outcome, SessionGeneration
from metacrate_grid_agent.errors import JournalError
from metacrate_grid_agent.journal import Call, FileJournal, Header, JournalRun, Record
from metacrate_grid_agent.testing import FakeEndpoint
from tests.journal.scenario import (
    GOAL,
    KEY,
    RUN_ID,
    SESSION,
    LedgerExecutor,
    llm_config,
    make_loop,
    respond,
)

if TYPE_CHECKING:
    from pathlib import Path


class FailingRun:
    """A journal run whose commit of a mutating intent fails (a full disk, say)."""

    def __init__(self, inner: JournalRun) -> None:
        self.inner = inner

    @property
    def run_id(self) -> str:
        """The inner run's id."""
        return self.inner.run_id

    async def append(self, record: Record) -> None:
        """Append through."""
        await self.inner.append(record)

    async def commit(self, record: Record) -> None:
        """Fail an intent; commit anything else."""
        if isinstance(record, Call) and record.mutating:
            raise JournalError("no space left on device", run_id=self.run_id)
        await self.inner.commit(record)

    async def close(self) -> None:
        """Close through."""
        await self.inner.close()


class FailingJournal:
    """A file journal whose runs fail every intent."""

    def __init__(self, inner: FileJournal) -> None:
        self.inner = inner

    async def create(self, header: Header) -> JournalRun:
        """Create through, wrapped."""
        return FailingRun(await self.inner.create(header))

    async def claim(self, run_id: str) -> tuple[JournalRun, tuple[Record, ...]]:
        """Claim through, wrapped."""
        run, records = await self.inner.claim(run_id)
        return FailingRun(run), records

    async def pending(self) -> tuple[str, ...]:
        """Through."""
        return await self.inner.pending()

    async def newest_generation(self, session_id: str) -> int | None:
        """Through."""
        return await self.inner.newest_generation(session_id)


async def _run(journal: Any, ledger: list[str], executor: LedgerExecutor | None = None) -> Any:
    async with FakeEndpoint(responder=respond) as ep:
        client = LLMClient(llm_config(ep.url))
        try:
            loop = make_loop(client, executor or LedgerExecutor(ledger.append))
            return await loop.run(GOAL, generation=SessionGeneration(SESSION), journal=journal)
        finally:
            await client.aclose()


async def test_a_failed_intent_write_keeps_the_call_from_running(tmp_path: Path) -> None:
    """Fail closed: the intent of ``move`` cannot be committed, so the executor never sees
    it; the session ends ``cancelled`` (``journal_failed``) with the call recorded not run."""
    ledger: list[str] = []
    executor = LedgerExecutor(ledger.append)
    result = await _run(FailingJournal(FileJournal(tmp_path, secret=KEY)), ledger, executor)
    assert executor.calls == ["c1"]
    assert ledger == []
    assert result.outcome is Outcome.CANCELLED
    assert result.cancel_reason == "journal_failed"
    assert [(c.call_id, c.status) for c in result.calls] == [("c1", "ok"), ("c2", "cancelled")]


async def test_one_sync_per_mutating_call_and_one_at_the_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two mutating calls and a finish: three ``fdatasync`` calls (and one ``fsync`` of the
    directory, for the new file's name), none for the model turns and read-only calls;
    each mutating call's intent is the journal's last line, synced, when its executor runs."""
    syncs: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    dir_syncs: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        dir_syncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    seen: list[tuple[str, int, str]] = []
    path = tmp_path / f"{RUN_ID}.journal"

    def at_effect(call_id: str, when: str) -> None:
        if when == "before":
            last = path.read_text().splitlines()[-1]
            seen.append((call_id, len(syncs), last[: len('{"type":"tool_call"')]))

    ledger: list[str] = []
    result = await _run(
        FileJournal(tmp_path, secret=KEY), ledger, LedgerExecutor(ledger.append, at_effect)
    )
    assert result.outcome is Outcome.COMPLETED
    assert len(syncs) == 3
    assert len(dir_syncs) == 1
    assert seen == [
        ("c1", 0, '{"type":"tool_call"'),
        ("c2", 1, '{"type":"tool_call"'),
        ("c3", 2, '{"type":"tool_call"'),
        ("c4", 2, '{"type":"tool_call"'),
    ]


async def test_a_journal_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """Every file a journal opens for a run (the run's file, its directory, the session's
    generation file) is closed when the run ends, whether it ran, resumed or was refused."""
    before = len(os.listdir("/proc/self/fd"))
    ledger: list[str] = []
    await _run(FileJournal(tmp_path, secret=KEY), ledger)
    journal = FileJournal(tmp_path, secret=KEY)
    assert await journal.pending() == ()
    assert await journal.newest_generation(SESSION) == 0
    with pytest.raises(JournalError):
        await _run(journal, ledger)  # the run id already has a journal
    assert len(os.listdir("/proc/self/fd")) == before


#: How long a test's sync hook waits to be released before giving up (a much longer stall
#: than any loop turn: only reached when the sync blocks the event loop).
_RELEASE_WAIT_S = 2.0


def _header() -> Header:
    return Header(
        library="test",
        session_id=SESSION,
        generation=0,
        run=1,
        anchor=0.0,
        config={},
        tools=(),
        tools_hash="",
        approval=False,
        history=(),
    )


async def test_the_event_loop_runs_other_tasks_while_a_sync_is_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mutating intent's ``fdatasync`` runs off the event loop: while the disk syncs,
    other sessions' tasks run; the commit returns only once the sync has. (The sync hook
    blocks until this test, running on the loop, releases it.)"""
    entered = threading.Event()
    release = threading.Event()
    order: list[str] = []
    real = os.fdatasync

    def blocking(fd: int) -> None:
        entered.set()
        order.append("synced" if release.wait(_RELEASE_WAIT_S) else "sync blocked the loop")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", blocking)
    run = await FileJournal(tmp_path, secret=KEY).create(_header())
    try:
        intent = Call(t=1.0, call_id="c2", name="move", arguments="{}", effect="mutating")
        commit = asyncio.create_task(run.commit(intent))
        assert await asyncio.to_thread(entered.wait, _RELEASE_WAIT_S)
        order.append("another task ran")
        assert not commit.done()
        release.set()
        await commit
    finally:
        await run.close()
    assert order == ["another task ran", "synced"]
    last = (tmp_path / f"{RUN_ID}.journal").read_text().splitlines()[-1]
    assert last.startswith('{"type":"tool_call"')


async def test_a_failing_sync_keeps_the_call_from_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed on the disk itself: ``fdatasync`` of the first mutating intent raises
    (EIO), so its executor is never called; the session ends ``cancelled``
    (``journal_failed``) and the error names no key."""

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    ledger: list[str] = []
    executor = LedgerExecutor(ledger.append)
    result = await _run(FileJournal(tmp_path, secret=KEY), ledger, executor)
    assert executor.calls == ["c1"]
    assert ledger == []
    assert result.outcome is Outcome.CANCELLED
    assert result.cancel_reason == "journal_failed"


async def test_closing_a_run_waits_for_its_pending_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit cancelled while its sync runs leaves the sync to finish; ``close`` waits
    for it before closing the file, so the sync never meets a closed (or reused)
    descriptor."""
    entered = threading.Event()
    release = threading.Event()
    synced: list[int] = []
    real = os.fdatasync

    def blocking(fd: int) -> None:
        entered.set()
        release.wait(_RELEASE_WAIT_S)
        real(fd)  # EBADF if the file was closed under it
        synced.append(fd)

    monkeypatch.setattr(os, "fdatasync", blocking)
    run = await FileJournal(tmp_path, secret=KEY).create(_header())
    intent = Call(t=1.0, call_id="c2", name="move", arguments="{}", effect="mutating")
    commit = asyncio.create_task(run.commit(intent))
    assert await asyncio.to_thread(entered.wait, _RELEASE_WAIT_S)
    commit.cancel()
    with pytest.raises(asyncio.CancelledError):
        await commit
    closing = asyncio.create_task(run.close())
    await asyncio.sleep(0)
    assert not closing.done()
    release.set()
    await closing
    assert len(synced) == 1


async def test_a_running_journaled_run_holds_one_descriptor(tmp_path: Path) -> None:
    """A thousand concurrent sessions hold a thousand journal descriptors, not three
    thousand: an open run keeps only its own file (its lock); the directory and the
    session's generation file are opened when needed and closed at once."""
    journal = FileJournal(tmp_path, secret=KEY)
    before = len(os.listdir("/proc/self/fd"))
    run = await journal.create(_header())
    try:
        assert len(os.listdir("/proc/self/fd")) == before + 1
        intent = Call(t=1.0, call_id="c2", name="move", arguments="{}", effect="mutating")
        await run.commit(intent)
        assert len(os.listdir("/proc/self/fd")) == before + 1
    finally:
        await run.close()
    assert len(os.listdir("/proc/self/fd")) == before


async def test_too_many_open_files_is_a_journal_error_saying_what_to_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process past its descriptor limit cannot open a run's journal: a JournalError
    (before any action) that says each session holds one descriptor and what to raise."""
    journal = FileJournal(tmp_path, secret=KEY)
    real = os.open

    def exhausted(path: str, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".journal"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", exhausted)
    with pytest.raises(JournalError, match=r"one descriptor.*ulimit -n"):
        await journal.create(_header())


async def test_creating_a_run_leaves_the_loop_free_and_a_cancelled_create_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's file is created off the event loop (creating a file waits for the file
    system while other sessions sync): other tasks run meanwhile. A create cancelled
    meanwhile leaves no journal behind (no run for ``pending`` to resume)."""
    entered = threading.Event()
    release = threading.Event()
    order: list[str] = []
    real = os.fchmod

    def blocking(fd: int, mode: int) -> None:
        entered.set()
        order.append("created" if release.wait(_RELEASE_WAIT_S) else "create blocked the loop")
        real(fd, mode)

    removed = threading.Event()
    real_unlink = os.unlink

    def unlink(path: str, *, dir_fd: int | None = None) -> None:
        real_unlink(path, dir_fd=dir_fd)
        removed.set()

    monkeypatch.setattr(os, "fchmod", blocking)
    monkeypatch.setattr(os, "unlink", unlink)
    journal = FileJournal(tmp_path, secret=KEY)
    creating = asyncio.create_task(journal.create(_header()))
    assert await asyncio.to_thread(entered.wait, _RELEASE_WAIT_S)
    order.append("another task ran")
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    release.set()
    assert await asyncio.to_thread(removed.wait, _RELEASE_WAIT_S)
    assert order == ["another task ran", "created"]
    assert await journal.pending() == ()
    assert not (tmp_path / f"{RUN_ID}.journal").exists()
