"""Sessions as DBOS workflows: :class:`DurableSessions`, the queue, approvals, takeover.

A session run is the DBOS workflow ``metacrate_grid_agent.session`` whose id is the run's
id, ``<session>-g<generation>-r1``: starting it twice is harmless (DBOS keeps one workflow
per id). The workflow's body builds the application's :class:`~metacrate_grid_agent.ToolLoop`
and either runs it with a :class:`~metacrate_grid_agent.dbos.DBOSJournal` or, when the run
already has a journal (DBOS re-ran the workflow after its process died), resumes it from
that journal: the journal, not DBOS's step replay, decides what is re-run, and a mutating
call whose intent is journaled without its result ends ``ambiguous_mutation``, never runs
twice. DBOS brings what one machine cannot: the queue that admits one running session per
avatar across the fleet, recovery of a dead process's sessions, durable approvals
(``DBOS.recv``) and cancellation of a superseded generation.

Sessions enter through one queue, partitioned by avatar (``partition_concurrency=1``), with
an optional cap on the sessions running at once fleet-wide (``global_concurrency``): each
running session has at most one model request in flight, so that cap is also the cap on
concurrent model requests across the fleet (and ``LLMConfig.max_in_flight`` caps them per
process).

An approval waits in its own small workflow, ``<run id>-approval-<call id>``, which receives
the operator's answer with ``DBOS.recv`` (timing out after the approval timeout); a crash
while it waits loses nothing, and :meth:`DurableSessions.approve` answers it from any
process. It runs apart from the session's workflow (started from an empty context) because
DBOS matches a workflow's operations to their records by position, and a resumed session
does not repeat the operations of the run before the crash.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from dbos import (
    DBOS,
    DBOSClient,
    SetEnqueueOptions,
    SetWorkflowID,
    WorkflowHandleAsync,
    error,
)
from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._aio._generation import SessionGeneration
from metacrate_grid_agent._aio._tool_loop import ToolLoop
from metacrate_grid_agent._core._journal import (
    Call,
    Finish,
    Header,
    Record,
    Request,
    Result,
    parse_run_id,
    run_id,
)
from metacrate_grid_agent._core._results import LoopResult
from metacrate_grid_agent._core._tools import ApprovalRequest, Approved, Denied
from metacrate_grid_agent.dbos._serializer import MsgspecJSON
from metacrate_grid_agent.dbos._store import DBOSJournal
from metacrate_grid_agent.errors import JournalError

__all__ = [
    "APPROVAL_WORKFLOW",
    "DEFAULT_QUEUE",
    "SESSION_WORKFLOW",
    "CallSummary",
    "DBOSApprover",
    "DurableSessions",
    "LoopBuilder",
    "SessionOutcome",
    "SessionSpec",
    "take_over",
]

logger = logging.getLogger("metacrate_grid_agent.dbos")

#: The workflows' names in DBOS's tables (they outlive deploys: never rename them).
SESSION_WORKFLOW: Final = "metacrate_grid_agent.session"
APPROVAL_WORKFLOW: Final = "metacrate_grid_agent.approval"
#: The topic an approval's answer is sent on.
APPROVAL_TOPIC: Final = "approval"
#: The queue sessions enter by default.
DEFAULT_QUEUE: Final = "grid_agent_sessions"
#: How often a running session looks for a newer generation of itself, in seconds (one
#: indexed read; a mutating call is fenced at its intent commit whatever this is).
SUPERSESSION_POLL_S: Final = 1.0
#: How often the queue is polled for sessions to start, in seconds (DBOS's default).
QUEUE_POLL_S: Final = 1.0
#: Supersession polls a cancelled run's outcome is waited for in the journal.
CANCELLED_FINISH_WAIT: Final = 20
#: Every session runs as generation run 1: a new attempt at a session is a new generation.
RUN: Final = 1


class SessionSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a session workflow is started with (its input, stored as JSON by DBOS).

    ``app`` names the :class:`DurableSessions` that runs it (registered in every process of
    the fleet); ``avatar`` is the queue partition (one running session per avatar).
    """

    app: str
    session_id: str
    generation: int
    goal: str
    avatar: str

    @property
    def run_id(self) -> str:
        """``<session_id>-g<generation>-r1``: the workflow's id and the journal's run id."""
        return run_id(self.session_id, self.generation, RUN)


class CallSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One call of a finished session: its id, tool and what became of it."""

    call_id: str
    name: str
    status: str


class SessionOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a session workflow ended (its output, stored as JSON by DBOS).

    ``ambiguous_call`` is the id of the mutating call whose result is unknown, for
    ``ambiguous_mutation``; ``error_kind`` the stable kind of the error that ended it.
    """

    run_id: str
    outcome: str
    final_text: str | None
    turns: int
    calls: tuple[CallSummary, ...]
    ambiguous_call: str | None = None
    bound: str | None = None
    cancel_reason: str | None = None
    error_kind: str | None = None

    @classmethod
    def of(cls, run: str, result: LoopResult) -> SessionOutcome:
        """The summary of ``result``, the loop's result of run ``run``."""
        ambiguous = result.ambiguous_call
        return cls(
            run_id=run,
            outcome=result.outcome,
            final_text=result.final_text,
            turns=result.turns,
            calls=tuple(
                CallSummary(call_id=c.call_id, name=c.name, status=c.status) for c in result.calls
            ),
            ambiguous_call=None if ambiguous is None else ambiguous.call_id,
            bound=result.bound,
            cancel_reason=result.cancel_reason,
            error_kind=None if result.error is None else result.error.kind,
        )


#: Builds a process's loop for a session; given the approver that waits durably.
LoopBuilder = Callable[[SessionSpec, "DBOSApprover"], ToolLoop | Awaitable[ToolLoop]]

#: The DurableSessions of this process, by name: the workflows find theirs here.
_APPS: dict[str, DurableSessions] = {}


def approval_workflow_id(run: str, call_id: str) -> str:
    """The id of the workflow that waits for the answer about ``call_id`` in run ``run``."""
    return f"{run}-approval-{call_id}"


@DBOS.workflow(name=APPROVAL_WORKFLOW)
async def _approval(timeout_s: float) -> Any:
    """Wait for the operator's answer (or None at the timeout)."""
    return await DBOS.recv_async(APPROVAL_TOPIC, timeout_seconds=timeout_s)


@DBOS.workflow(name=SESSION_WORKFLOW)
async def _session(spec: dict[str, Any]) -> dict[str, Any]:
    """Run, or resume from its journal, one session (see the module docstring)."""
    parsed = msgspec.convert(spec, SessionSpec)
    app = _APPS.get(parsed.app)
    if app is None:
        raise LookupError(
            f"no DurableSessions named {parsed.app!r} in this process: create it before "
            "DBOS.launch() in every process of the fleet"
        )
    outcome = await app.execute(parsed)
    return msgspec.to_builtins(outcome)  # type: ignore[no-any-return]


def _outside_workflow(work: Awaitable[Any]) -> asyncio.Task[Any]:
    """``work`` as a task in an empty context: DBOS sees no enclosing workflow there."""
    return asyncio.get_running_loop().create_task(work, context=contextvars.Context())  # type: ignore[arg-type]


_STATUS_OF_RESULT: Final = {"success": "ok", "failure": "failed", "ambiguous": "ambiguous"}


def outcome_of_records(
    run: str, records: tuple[Record, ...], newest_generation: int | None
) -> SessionOutcome:
    """A session's outcome as its journal tells it (for a run DBOS cancelled): the finish
    record's, else ``superseded`` (a newer generation started) or ``cancelled``."""
    names: dict[str, str] = {}
    statuses: dict[str, str] = {}
    requests: set[str] = set()
    finish: Finish | None = None
    generation = 0
    for record in records:
        if isinstance(record, Header):
            generation = record.generation
        elif isinstance(record, Request):
            requests.add(record.request_id)
        elif isinstance(record, Call):
            names[record.call_id] = record.name
            statuses.setdefault(record.call_id, "cancelled")
        elif isinstance(record, Result):
            statuses[record.call_id] = _STATUS_OF_RESULT.get(record.status, record.status)
        elif isinstance(record, Finish):
            finish = record
    if finish is not None:
        outcome = finish.outcome
    elif newest_generation is not None and newest_generation > generation:
        outcome = "superseded"
    else:
        outcome = "cancelled"
    report = None if finish is None else finish.report
    return SessionOutcome(
        run_id=run,
        outcome=outcome,
        final_text=None if report is None else report.final_text,
        turns=len(requests),
        calls=tuple(
            CallSummary(call_id=call_id, name=name, status=statuses[call_id])
            for call_id, name in names.items()
        ),
        ambiguous_call=None if report is None else report.ambiguous_call,
        bound=None if report is None else report.bound,
        cancel_reason=None if report is None else report.cancel_reason,
        error_kind=None if report is None else report.error_kind,
    )


class DBOSApprover:
    """An :class:`~metacrate_grid_agent.Approver` whose wait survives the process.

    Each question is a workflow, ``<run id>-approval-<call id>``, waiting for the answer
    :meth:`DurableSessions.approve` sends (a dict ``{"approved": bool, "reason": str}``);
    asked again after a crash, it gets the same workflow and so the same answer.
    """

    def __init__(self, run: str, *, default_timeout_s: float) -> None:
        self.run_id = run
        self._default_timeout_s = default_timeout_s

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved | Denied:
        """The operator's answer about ``request``; no answer in time is a denial."""
        del cancel  # the loop's own timer and token bound the wait
        timeout = request.timeout_s if request.timeout_s is not None else self._default_timeout_s
        question = approval_workflow_id(self.run_id, request.call.id)

        async def wait() -> Any:
            handle: WorkflowHandleAsync[Any]
            with SetWorkflowID(question):
                handle = await DBOS.start_workflow_async(_approval, timeout)
            return await handle.get_result()

        answer = await _outside_workflow(wait())
        if not isinstance(answer, dict):
            return Denied("no answer in time")
        if answer.get("approved") is True:
            return Approved()
        reason = answer.get("reason")
        return Denied(reason if isinstance(reason, str) and reason else "denied by the operator")


class DurableSessions:
    """Sessions of one application as DBOS workflows over a :class:`DBOSJournal`.

    Create it in every process of the fleet *before* ``DBOS.launch()`` (DBOS recovers the
    process's pending sessions as soon as it launches, and they look for it by ``name``),
    then call :meth:`setup` once launched. ``build`` makes the process's
    :class:`~metacrate_grid_agent.ToolLoop` for a session (the same tools and configuration
    everywhere: a resumed journal is checked against them); pass it the approver it is given
    to make approvals durable.
    """

    def __init__(
        self,
        *,
        name: str,
        journal: DBOSJournal,
        build: LoopBuilder,
        queue: str = DEFAULT_QUEUE,
        max_running_sessions: int | None = None,
        max_sessions_per_executor: int | None = None,
        queue_poll_s: float = QUEUE_POLL_S,
        supersession_poll_s: float = SUPERSESSION_POLL_S,
        approval_timeout_s: float = 120.0,
    ) -> None:
        if name in _APPS:
            raise ValueError(f"a DurableSessions named {name!r} already exists in this process")
        self.name = name
        self.journal = journal
        self._build = build
        self.queue_name = queue
        self._max_running = max_running_sessions
        self._max_per_executor = max_sessions_per_executor
        self._queue_poll_s = queue_poll_s
        self._supersession_poll_s = supersession_poll_s
        self._approval_timeout_s = approval_timeout_s
        _APPS[name] = self

    def close(self) -> None:
        """Forget this instance in the process (its sessions stay in the database)."""
        if _APPS.get(self.name) is self:
            del _APPS[self.name]

    async def setup(self) -> None:
        """Register the queue (partitioned by avatar) and create the journal's tables; call
        it once DBOS is launched."""
        await self.journal.setup()
        await DBOS.register_queue_async(
            self.queue_name,
            partition_concurrency=1,
            global_concurrency=self._max_running,
            worker_concurrency=self._max_per_executor,
            polling_interval_sec=self._queue_poll_s,
        )

    async def start(
        self, session_id: str, goal: str, *, generation: int, avatar: str | None = None
    ) -> str:
        """Enqueue generation ``generation`` of ``session_id``; return its run id.

        Starting the same generation again returns the same run id and starts nothing new.
        A newer generation supersedes the older ones: it is recorded first (from then on no
        older run commits a mutating intent), then their workflows are cancelled, and a
        running one ends ``superseded`` at its next look (``supersession_poll_s``).
        """
        spec = SessionSpec(
            app=self.name,
            session_id=session_id,
            generation=generation,
            goal=goal,
            avatar=session_id if avatar is None else avatar,
        )
        await self.journal.start_generation(session_id, generation)
        await self._cancel_older(session_id, generation)
        queue = await DBOS.retrieve_queue_async(self.queue_name)
        if queue is None:
            raise RuntimeError(f"queue {self.queue_name!r} is not registered: call setup() first")
        with SetWorkflowID(spec.run_id), SetEnqueueOptions(queue_partition_key=spec.avatar):
            await queue.enqueue_async(_session, msgspec.to_builtins(spec))
        return spec.run_id

    async def _cancel_older(self, session_id: str, generation: int) -> None:
        found = await DBOS.list_workflows_async(
            workflow_id_prefix=f"{session_id}-g",
            status=["PENDING", "ENQUEUED"],
            name=SESSION_WORKFLOW,
        )
        for status in found:
            parts = parse_run_id(status.workflow_id)
            if parts is not None and parts[0] == session_id and parts[1] < generation:
                await DBOS.cancel_workflow_async(status.workflow_id)

    async def outcome(self, run: str) -> SessionOutcome:
        """Wait for run ``run`` to end and return how it ended.

        A workflow cancelled by DBOS (a newer generation started, or an operator cancelled
        it) has no result in DBOS: its outcome is read from the journal's finish record,
        waited for up to ``CANCELLED_FINISH_WAIT`` supersession polls (the run notices the
        newer generation at its next poll); without one it is ``superseded`` or
        ``cancelled``.
        """
        handle: WorkflowHandleAsync[Any] = await DBOS.retrieve_workflow_async(run)
        try:
            return msgspec.convert(await handle.get_result(), SessionOutcome)
        except error.DBOSAwaitedWorkflowCancelledError:
            return await self._cancelled_outcome(run)

    async def _cancelled_outcome(self, run: str) -> SessionOutcome:
        records: tuple[Record, ...] = ()
        for _ in range(CANCELLED_FINISH_WAIT):
            records = await self.journal.records(run)
            if records and isinstance(records[-1], Finish):
                break
            await asyncio.sleep(self._supersession_poll_s)
        return outcome_of_records(run, records, await self._newest(run))

    async def _newest(self, run: str) -> int | None:
        parts = parse_run_id(run)
        return None if parts is None else await self.journal.newest_generation(parts[0])

    async def approve(self, run: str, call_id: str, *, approved: bool, reason: str = "") -> None:
        """Answer the approval asked about ``call_id`` in run ``run`` (from any process).

        Raises LookupError when that question was never asked (nothing is sent).
        """
        question = approval_workflow_id(run, call_id)
        if await DBOS.get_workflow_status_async(question) is None:
            raise LookupError(
                f"no approval was asked about call {call_id!r} of run {run!r}: "
                "pending_approvals(run) lists the calls waiting"
            )
        await DBOS.send_async(
            question,
            {"approved": approved, "reason": reason},
            topic=APPROVAL_TOPIC,
        )

    async def pending_approvals(self, run: str) -> tuple[str, ...]:
        """The call ids of run ``run`` waiting for an answer."""
        prefix = approval_workflow_id(run, "")
        found = await DBOS.list_workflows_async(
            workflow_id_prefix=prefix, status="PENDING", name=APPROVAL_WORKFLOW
        )
        return tuple(sorted(s.workflow_id[len(prefix) :] for s in found))

    async def take_over(self, executor_id: str) -> tuple[str, ...]:
        """Resume, on this process's executors, the pending sessions (and their pending
        approvals) of executor ``executor_id``, which must be dead; return their ids.

        Only workflows of this application version are taken (DBOS runs a workflow only on
        its own version). Safe even if that executor is merely stopped: claiming a run's
        journal fences the old holder, which then writes nothing and runs no mutating call.
        """
        taken: list[str] = []
        for name, queue in ((SESSION_WORKFLOW, self.queue_name), (APPROVAL_WORKFLOW, None)):
            found = await DBOS.list_workflows_async(
                status="PENDING", executor_id=executor_id, name=name
            )
            for status in found:
                await DBOS.resume_workflow_async(status.workflow_id, queue_name=queue)
                taken.append(status.workflow_id)
        return tuple(taken)

    async def execute(self, spec: SessionSpec) -> SessionOutcome:
        """The session workflow's body: run the session, or resume it from its journal."""
        approver = DBOSApprover(spec.run_id, default_timeout_s=self._approval_timeout_s)
        built = self._build(spec, approver)
        loop = await built if inspect.isawaitable(built) else built
        generation = SessionGeneration(spec.session_id, start=spec.generation)
        watcher = _outside_workflow(self._watch(spec, generation))
        try:
            if await self.journal.exists(spec.run_id):
                result = await loop.resume(self.journal, spec.run_id, generation=generation)
            else:
                result = await loop.run(spec.goal, generation=generation, journal=self.journal)
        finally:
            watcher.cancel()
        logger.info("session %s ended %s", spec.run_id, result.outcome)
        return SessionOutcome.of(spec.run_id, result)

    async def _watch(self, spec: SessionSpec, generation: SessionGeneration) -> None:
        """Supersede the running session when a newer generation of it has started."""
        while True:
            await asyncio.sleep(self._supersession_poll_s)
            try:
                newest = await self.journal.newest_generation(spec.session_id)
            except JournalError as exc:  # a busy or unreachable database: look again later
                logger.warning("session %s: generation check failed (%s)", spec.run_id, exc.kind)
                continue
            if newest is not None and newest > spec.generation:
                generation.advance()
                return


async def take_over(
    database_url: str, executor_id: str, *, queue: str = DEFAULT_QUEUE
) -> tuple[str, ...]:
    """Hand the pending sessions (and pending approvals) of executor ``executor_id``, which
    must be dead, to the live executors of the fleet; return their workflow ids.

    For an operator's script or a one-off process (``grid-agent takeover`` calls it): it
    talks to the system database only (a ``DBOSClient``), runs no workflow and needs no
    :class:`DurableSessions`; the sessions go back on their queue (``queue``), where a live
    executor of the same application version picks them up and resumes each from its
    journal. Safe even if that executor is merely stopped: the resume's claim fences it.
    Taking over again is harmless (a session already handed over is no longer pending).

    Raises :class:`~metacrate_grid_agent.errors.JournalError` when the database cannot be
    used (unreachable, not a DBOS system database, a SQLite file that does not exist: none
    is created); its message never holds the URL (it may hold a password).
    """
    _check_sqlite_file(database_url)
    taken: list[str] = []
    try:
        client = await asyncio.to_thread(
            DBOSClient, system_database_url=database_url, serializer=MsgspecJSON()
        )
        try:
            for name, target in ((SESSION_WORKFLOW, queue), (APPROVAL_WORKFLOW, None)):
                found = await client.list_workflows_async(
                    status="PENDING",
                    executor_id=executor_id,
                    name=name,
                    load_input=False,
                    load_output=False,
                )
                for status in found:
                    await client.resume_workflow_async(status.workflow_id, queue_name=target)
                    taken.append(status.workflow_id)
        finally:
            await asyncio.to_thread(client.destroy)
    except (SQLAlchemyError, error.DBOSException) as exc:
        handed = f"{len(taken)} handed over before it failed" if taken else "none handed over"
        raise JournalError(
            f"the system database failed ({_failure(exc)}); {handed}: check that the URL "
            "names the fleet's DBOS system database and that it is reachable, then take "
            "over again"
        ) from None
    return tuple(taken)


def _check_sqlite_file(database_url: str) -> None:
    """Refuse a SQLite URL whose file does not exist (SQLite would create an empty one)."""
    try:
        url = make_url(database_url)
    except ArgumentError:
        raise JournalError(
            "the system database URL is not a database URL (postgresql://... or "
            "sqlite:///path): nothing was taken over"
        ) from None
    path = url.database
    if url.get_backend_name() == "sqlite" and path and not os.path.isfile(path):
        raise JournalError(
            "the SQLite system database the URL names does not exist (none was created): "
            "check the path; nothing was taken over"
        )


def _failure(exc: Exception) -> str:
    """What failed, without the message (it may quote the URL or a statement): the error's
    class and the driver's class."""
    original = getattr(exc, "orig", None)
    cause = f" ({type(original).__name__})" if original is not None else ""
    return f"{type(exc).__name__}{cause}"
