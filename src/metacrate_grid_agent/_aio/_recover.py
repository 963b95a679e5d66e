"""Recovery: every unfinished run of a journal resumed, a bounded number at a time.

:meth:`ToolLoop.resume_pending <metacrate_grid_agent.ToolLoop.resume_pending>` lists the
journal's unfinished runs and hands them to :func:`resume_each`, which keeps at most
``concurrency`` of them resuming at once (each its own task, in one task group owned by the
caller's await): the first run acts as soon as its own journal is read, not after the
10,000th. A run that cannot be resumed for a journal reason (held by another process,
damaged, diverging from the loop) is reported as its :class:`JournalError`, and the others
go on. Once the operator's token is cancelled no further run starts.

The bound is :data:`RESUME_CONCURRENCY` (a validated setting), and it must fit the process's
file descriptors: a run being resumed holds :data:`FDS_PER_RESUME` of them.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Awaitable, Callable, Iterator
from typing import Final, Protocol, runtime_checkable

from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._aio._journal import Journal
from metacrate_grid_agent._core._journal import parse_run_id
from metacrate_grid_agent._core._results import LoopResult
from metacrate_grid_agent._settings import Setting, check_numbers
from metacrate_grid_agent.errors import ConfigError, ConfigProblem, JournalError

__all__ = [
    "FDS_PER_RESUME",
    "FD_RESERVE",
    "RESUME_CONCURRENCY",
    "ListsLazily",
    "check_concurrency",
    "pending_of",
    "resume_each",
    "session_of",
]

#: How many runs :meth:`ToolLoop.resume_pending` resumes at once, by default and at most.
RESUME_CONCURRENCY: Final = Setting(
    "concurrency",
    int,
    64,
    1,
    4096,
    "runs",
    "enough to keep one core busy while requests wait on the endpoint; each run holds files",
)
#: File descriptors one run holds while it resumes: its journal, its session's generation
#: file, the journal directory, and a connection to the endpoint.
FDS_PER_RESUME: Final = 4
#: File descriptors left for everything else the process has open (standard streams, the
#: event loop, the client's other connections, the application's own files).
FD_RESERVE: Final = 64


def check_concurrency(concurrency: object) -> int:
    """``concurrency`` checked against its setting and the process's descriptor limit.

    Raises :class:`~metacrate_grid_agent.errors.ConfigError` naming the problem.
    """
    problems = check_numbers((RESUME_CONCURRENCY,), {"concurrency": concurrency}, "")
    if problems:
        raise ConfigError(problems)
    assert isinstance(concurrency, int)  # noqa: S101 - checked just above
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        usable = (soft - FD_RESERVE) // FDS_PER_RESUME
        if concurrency > usable:
            problem = (
                f"{concurrency} runs at once need about {concurrency * FDS_PER_RESUME} file "
                f"descriptors and {FD_RESERVE} more, but the process may open {soft} "
                f"(ulimit -n): use at most {max(usable, 0)}, or raise the limit"
            )
            raise ConfigError([ConfigProblem("concurrency", problem)])
    return concurrency


@runtime_checkable
class ListsLazily(Protocol):
    """A journal that can list its unfinished runs one at a time (the file journal)."""

    def iter_pending(self) -> Iterator[str]:
        """The ids :meth:`Journal.pending` returns, each found when asked for."""
        ...


async def pending_of(journal: Journal, session_id: str | None) -> Iterator[str]:
    """The unfinished run ids of ``journal`` (of ``session_id``, or that run id, only),
    listed lazily when the journal can."""
    if isinstance(journal, ListsLazily):
        run_ids: Iterator[str] = journal.iter_pending()
    else:
        run_ids = iter(await journal.pending())
    if session_id is None:
        return run_ids
    return (r for r in run_ids if session_id in (r, session_of(r)))


def session_of(run_id: str) -> str:
    """The session id of ``run_id`` (``<session>-g<generation>-r<run>``)."""
    parsed = parse_run_id(run_id)
    return run_id if parsed is None else parsed[0]


async def resume_each(
    run_ids: Iterator[str],
    resume: Callable[[str], Awaitable[LoopResult]],
    *,
    concurrency: int,
    cancel: CancelToken | None,
    on_result: Callable[[str, LoopResult | JournalError], None] | None = None,
) -> dict[str, LoopResult | JournalError]:
    """``resume(run_id)`` for each run id, at most ``concurrency`` at once.

    Returns each run's result, or the :class:`JournalError` that kept it from resuming, in
    the order of ``run_ids`` (``on_result`` is told of each as it ends); runs not started
    because ``cancel`` was cancelled are absent.
    Any other exception ends the others (the task group cancels them) and is raised.
    """
    pending = run_ids
    order: list[str] = []
    done: dict[str, LoopResult | JournalError] = {}

    async def worker() -> None:
        for run_id in pending:
            if cancel is not None and cancel.cancelled:
                return
            order.append(run_id)
            result: LoopResult | JournalError
            try:
                result = await resume(run_id)
            except JournalError as exc:
                result = exc
            done[run_id] = result
            if on_result is not None:
                on_result(run_id, result)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
                # Let the run just started reach its first action before the next one reads
                # its journal: otherwise the first request waits for every other worker's
                # read and replay (63 of them by default) before it is sent.
                await asyncio.sleep(0)
    except BaseExceptionGroup as group_error:
        # One failure cancels the others (each then raises CancelledError, not collected):
        # raise it as itself, as a sequential resume would.
        first = group_error.exceptions[0]
        raise first from first.__cause__
    finally:
        close = getattr(pending, "close", None)
        if close is not None:
            close()  # a lazy listing releases the directory
    return {run_id: done[run_id] for run_id in order if run_id in done}
