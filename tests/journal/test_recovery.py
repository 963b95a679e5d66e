"""Recovery of a whole journal directory: ``ToolLoop.resume_pending`` resumes every unfinished
run, a bounded number at once, reports a run another process holds and leaves it alone, and
starts no run once the operator cancelled; the file journal lists lazily and syncs the commits
of runs committing at once together.

The journals are the scripted session's (:mod:`tests.journal.scenario`), run for several
sessions and cut after their first request, as a process killed there leaves them.
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import (
    CancelToken,
    LLMClient,
    LoopEvent,
    LoopResult,
    Outcome,
    SessionGeneration,
)
from metacrate_grid_agent._aio import _recover
from metacrate_grid_agent.errors import ConfigError, JournalError, JournalLockedError
from metacrate_grid_agent.journal import FileJournal
from metacrate_grid_agent.journal._format import MAX_NESTING, _too_deep
from metacrate_grid_agent.testing import FakeEndpoint
from tests.journal.scenario import (
    GOAL,
    KEY,
    LedgerExecutor,
    llm_config,
    make_loop,
    respond,
    shape,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

SESSIONS = tuple(f"avatar-{n}" for n in range(1, 6))
"""The sessions journaled: the first four are cut, the last one finished."""
UNFINISHED = tuple(f"{s}-g0-r1" for s in SESSIONS[:4])


async def _journal_sessions(directory: Path) -> dict[str, Any]:
    async with FakeEndpoint(responder=respond) as ep:
        client = LLMClient(llm_config(ep.url))
        try:
            loop = make_loop(client, LedgerExecutor(lambda _: None))
            journal = FileJournal(directory, secret=KEY)
            results = [
                await loop.run(GOAL, generation=SessionGeneration(s), journal=journal)
                for s in SESSIONS
            ]
        finally:
            await client.aclose()
    return shape(results[0])


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The uncrashed run's shape, and each session's journal and generation file."""
    directory = tmp_path_factory.mktemp("sessions")
    expected = asyncio.run(_journal_sessions(directory))
    return expected, {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.fixture
def crashed(whole: tuple[dict[str, Any], dict[str, bytes]], tmp_path: Path) -> Path:
    """A directory where the first four sessions were cut after their first request."""
    for name, data in whole[1].items():
        kept = data
        if name.removesuffix(".journal") in UNFINISHED:
            kept = b"".join(data.splitlines(keepends=True)[:2])  # header, request
        (tmp_path / name).write_bytes(kept)
        (tmp_path / name).chmod(0o600)
    return tmp_path


def _contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def _session(run_id: str) -> str:
    return run_id.partition("-g")[0]


async def _resume_pending(
    directory: Path, ledger: list[str], **kwargs: Any
) -> dict[str, LoopResult | JournalError]:
    async with FakeEndpoint(responder=respond) as ep:
        client = LLMClient(llm_config(ep.url))
        try:
            loop = make_loop(client, LedgerExecutor(ledger.append))
            return await loop.resume_pending(FileJournal(directory, secret=KEY), **kwargs)
        finally:
            await client.aclose()


async def test_every_unfinished_run_is_resumed_at_most_concurrency_at_once(
    whole: tuple[dict[str, Any], dict[str, bytes]], crashed: Path
) -> None:
    """``resume_pending`` resumes each unfinished run (and not the finished one) to the same
    end as the uncrashed run, its mutating calls once each, with never more than
    ``concurrency`` runs resuming at once (and that many when there is work for them); each
    run gets its own generation, and ``on_result`` hears of each as it ends."""
    active: list[str] = []
    most = 0
    told: list[str] = []

    def on_resume(run_id: str, generation: SessionGeneration) -> list[Callable[[LoopEvent], None]]:
        nonlocal most
        assert (generation.session_id, generation.current) == (_session(run_id), 0)
        active.append(run_id)
        most = max(most, len(active))

        def on_finish(event: LoopEvent) -> None:
            if event.kind == "finish":
                active.remove(run_id)

        return [on_finish]

    def on_result(run_id: str, result: LoopResult | JournalError) -> None:
        told.append(run_id)

    ledger: list[str] = []
    results = await _resume_pending(
        crashed, ledger, concurrency=2, on_resume=on_resume, on_result=on_result
    )
    assert list(results) == list(UNFINISHED)
    assert sorted(told) == sorted(UNFINISHED)
    expected = whole[0]
    for result in results.values():
        assert isinstance(result, LoopResult)
        assert shape(result) == expected
    assert sorted(ledger) == sorted(["c2", "c3"] * len(UNFINISHED))
    assert most == 2
    assert active == []
    again = await _resume_pending(crashed, ledger)
    assert again == {}


async def test_a_run_another_process_holds_is_reported_and_left_alone(crashed: Path) -> None:
    """A run whose journal is locked by another holder comes back as
    ``JournalLockedError``, its journal untouched, while the other runs resume; the
    ``session_id`` filter keeps to one session's runs."""
    held_id = UNFINISHED[1]
    path = crashed / f"{held_id}.journal"
    before = path.read_bytes()
    holder, _ = await FileJournal(crashed, secret=KEY).claim(held_id)
    try:
        ledger: list[str] = []
        results = await _resume_pending(crashed, ledger)
        assert list(results) == list(UNFINISHED)
        assert isinstance(results[held_id], JournalLockedError)
        others = [r for run_id, r in results.items() if run_id != held_id]
        assert all(isinstance(r, LoopResult) and r.outcome is Outcome.COMPLETED for r in others)
        assert path.read_bytes() == before
    finally:
        await holder.close()
    only = await _resume_pending(crashed, [], session_id=_session(held_id))
    assert list(only) == [held_id]


async def test_no_run_starts_once_the_operator_cancelled(crashed: Path) -> None:
    """When the operator's token is cancelled, the runs resuming end ``cancelled`` and no
    other run starts: its journal is not even claimed."""
    cancel = CancelToken()

    def on_resume(run_id: str, generation: SessionGeneration) -> list[Callable[[LoopEvent], None]]:
        cancel.cancel("shutdown")
        return []

    before = _contents(crashed)
    results = await _resume_pending(crashed, [], concurrency=1, cancel=cancel, on_resume=on_resume)
    assert list(results) == [UNFINISHED[0]]
    first = results[UNFINISHED[0]]
    assert isinstance(first, LoopResult)
    assert first.outcome is Outcome.CANCELLED
    for run_id in UNFINISHED[1:]:
        name = f"{run_id}.journal"
        assert (crashed / name).read_bytes() == before[name]


@pytest.mark.parametrize("value", [0, 4097, True, 2.0, "8"])
async def test_the_concurrency_is_a_validated_setting(crashed: Path, value: object) -> None:
    """``concurrency`` is checked against its setting before anything is claimed."""
    before = _contents(crashed)
    with pytest.raises(ConfigError, match="concurrency"):
        await _resume_pending(crashed, [], concurrency=value)
    assert _contents(crashed) == before


async def test_the_concurrency_must_fit_the_file_descriptor_limit(
    crashed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs being resumed hold file descriptors: a concurrency the process's limit cannot
    hold is refused, naming the limit and the largest that fits."""
    monkeypatch.setattr(resource, "getrlimit", lambda _: (200, 200))
    fits = (200 - _recover.FD_RESERVE) // _recover.FDS_PER_RESUME
    with pytest.raises(ConfigError, match=f"use at most {fits}, or raise the limit"):
        await _resume_pending(crashed, [], concurrency=fits + 1)
    results = await _resume_pending(crashed, [], concurrency=fits)
    assert list(results) == list(UNFINISHED)


async def test_pending_runs_are_listed_one_at_a_time(crashed: Path) -> None:
    """``iter_pending`` reads a journal only when its id is asked for (a journal removed
    after the first id was given is not listed), and releases the directory at its end."""
    fds = len(os.listdir("/proc/self/fd"))
    listing = FileJournal(crashed).iter_pending()
    assert next(listing) == UNFINISHED[0]
    (crashed / f"{UNFINISHED[2]}.journal").unlink()
    assert list(listing) == [UNFINISHED[1], UNFINISHED[3]]
    assert len(os.listdir("/proc/self/fd")) == fds
    assert await FileJournal(crashed).pending() == (UNFINISHED[0], UNFINISHED[1], UNFINISHED[3])


async def test_runs_committing_at_once_sync_at_once(
    crashed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit's ``fdatasync`` does not hold the event loop: two runs committing at once
    are both inside their sync together (the filesystem then flushes them together)."""
    both = threading.Barrier(2, timeout=5.0)
    real = os.fdatasync

    def meeting(fd: int) -> None:
        both.wait()
        real(fd)

    monkeypatch.setattr(os, "fdatasync", meeting)
    journal = FileJournal(crashed, secret=KEY)
    claimed = [await journal.claim(run_id) for run_id in UNFINISHED[:2]]
    try:
        await asyncio.gather(*(run.commit(records[-1]) for run, records in claimed))
    finally:
        for run, _ in claimed:
            await run.close()
    assert not both.broken


def test_the_nesting_bound_of_a_journal_line_is_exact() -> None:
    """The shortcut (fewer brackets than the bound) never hides a line nested too deep:
    the bound is exact, brackets inside strings do not count, many shallow ones pass."""
    assert not _too_deep("[" * MAX_NESTING + "]" * MAX_NESTING)
    assert _too_deep("[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1))
    assert not _too_deep('["' + "[" * 200 + '"]')
    assert not _too_deep("[" + "[]," * 200 + "[]]")


class _ProtocolOnly:
    """A journal with only the protocol's methods (no lazy listing), over a file journal."""

    def __init__(self, inner: FileJournal) -> None:
        self.inner = inner

    async def create(self, header: Any) -> Any:
        return await self.inner.create(header)

    async def claim(self, run_id: str) -> Any:
        return await self.inner.claim(run_id)

    async def pending(self) -> tuple[str, ...]:
        return await self.inner.pending()

    async def newest_generation(self, session_id: str) -> int | None:
        return await self.inner.newest_generation(session_id)


async def test_a_journal_without_a_lazy_listing_is_recovered_from_its_pending_list(
    crashed: Path,
) -> None:
    """A backend that implements only the protocol (a database's) is recovered the same
    way, from the list ``pending()`` returns."""
    async with FakeEndpoint(responder=respond) as ep:
        client = LLMClient(llm_config(ep.url))
        try:
            loop = make_loop(client, LedgerExecutor(lambda _: None))
            journal = _ProtocolOnly(FileJournal(crashed, secret=KEY))
            results = await loop.resume_pending(journal, session_id=_session(UNFINISHED[2]))
        finally:
            await client.aclose()
    assert list(results) == [UNFINISHED[2]]
    only = results[UNFINISHED[2]]
    assert isinstance(only, LoopResult)
    assert only.outcome is Outcome.COMPLETED
