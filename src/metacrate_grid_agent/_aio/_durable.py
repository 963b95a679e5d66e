"""The tool loop's journal side: what a journaled run writes, and what a resume prepares.

:class:`Recorder` turns each input the driver feeds :class:`~._loop.LoopMachine` into its
record (:mod:`metacrate_grid_agent._core._journal`) and writes it *before* the machine sees
it: ``append`` for model turns, verdicts, summaries, read-only calls and results; ``commit``
(durable before it returns) for a mutating call's intent, before the executor is called, and
for the finish. The session time ``t`` of a record is the ``now`` the machine is fed minus
its ``started_at``: the resumed machine is fed the same times.

:func:`prepare_resume` claims a run's journal, checks it against the loop, replays it
(:mod:`metacrate_grid_agent._core._resume`), moves the machine to the event loop's clock
(the downtime counts against ``max_session_s``: the wall clock since the header's anchor)
and settles the tail that needs no action (a finish journaled; a newer generation; a
mutating intent without its result, which becomes ``Ambiguous`` and is never run).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from metacrate_grid_agent._aio._generation import SUPERSEDED
from metacrate_grid_agent._aio._journal import Journal, JournalRun
from metacrate_grid_agent._core._journal import (
    AMBIGUOUS_ON_RESUME,
    Call,
    Cut,
    DroppedArguments,
    Finish,
    Header,
    ModelError,
    Record,
    Reply,
    Request,
    Result,
    Summary,
    ToolPrint,
    Verdict,
    config_of,
    report_of,
    tools_hash,
)
from metacrate_grid_agent._core._loop import CallModel, Decision, LoopMachine
from metacrate_grid_agent._core._loop import Finish as FinishDecision
from metacrate_grid_agent._core._redact import bounded_text, valid_text
from metacrate_grid_agent._core._resume import canonical_arguments, check_header, replay
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent._core._tools import (
    Ambiguous,
    Approved,
    Denied,
    Effect,
    Failure,
    Success,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent._core._types import Completion
from metacrate_grid_agent._core._wire import OversizedToolCall
from metacrate_grid_agent._version import __version__
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import GridAgentError, HTTPStatusError, JournalError

__all__ = ["JOURNAL_FAILED", "SUPERSEDED", "Prepared", "Recorder", "header_of", "prepare_resume"]

logger = logging.getLogger("metacrate_grid_agent.loop")

#: The cancel reason of a session whose journal could not be written: the action the record
#: guarded did not run.
JOURNAL_FAILED: Final = "journal_failed"


def header_of(machine: LoopMachine, prints: Sequence[ToolPrint], config: ToolLoopConfig) -> Header:
    """The header of the run ``machine`` is about to start."""
    return Header(
        library=__version__,
        session_id=machine.session_id,
        generation=machine.generation,
        run=machine.run,
        anchor=time.time(),
        config=config_of(config),
        tools=tuple(prints),
        tools_hash=tools_hash(prints),
        approval=machine.approval,
        history=tuple(machine.history),
    )


class Recorder:
    """Writes a run's records through its :class:`JournalRun`; see the module doc."""

    __slots__ = ("_write", "cut", "journal", "machine")

    def __init__(self, journal: JournalRun, machine: LoopMachine) -> None:
        self.journal = journal
        self.machine = machine
        # A run whose append never waits (the file journal's one ``write``) offers it as a
        # plain call: no coroutine per record.
        self._write: Callable[[Record], object] | None = getattr(journal, "append_now", None)
        self.cut: Cut | None = None
        """The cut that ended the session, once one did (kept in the finish record)."""

    def _t(self, now: float) -> float:
        return now - self.machine.started_at

    async def request(self, decision: CallModel, now: float) -> None:
        """Before a request is sent."""
        record = Request(
            t=now - self.machine.started_at, turn=decision.turn, request_id=decision.request_id
        )
        if self._write is not None:
            self._write(record)
        else:
            await self.journal.append(record)

    async def reply(self, completion: Completion, now: float) -> None:
        """Before the reply is acted on."""
        dropped = tuple(
            DroppedArguments(index, call.argument_bytes)
            for index, call in enumerate(completion.tool_calls)
            if isinstance(call, OversizedToolCall)
        )
        record = Reply(t=now - self.machine.started_at, completion=completion, dropped=dropped)
        if self._write is not None:
            self._write(record)
        else:
            await self.journal.append(record)

    async def model_error(self, error: GridAgentError, now: float) -> None:
        """A request that failed for good, before the machine ends the session with it."""
        record = ModelError(
            t=self._t(now),
            request_id=error.request_id,
            error_kind=error.kind,
            message=valid_text(error.message),
            status=error.status if isinstance(error, HTTPStatusError) else None,
            retryable=error.retryable,
            attempts=error.attempts,
            elapsed_s=error.elapsed_s,
        )
        if self._write is not None:
            self._write(record)
        else:
            await self.journal.append(record)

    async def summary(self, text: str | None, now: float) -> None:
        """A compaction's summary, before it is applied."""
        kept = valid_text(text) if isinstance(text, str) else None
        record = Summary(t=self._t(now), text=kept)
        if self._write is not None:
            self._write(record)
        else:
            await self.journal.append(record)

    async def verdict(
        self, call: ValidatedCall, verdict: Approved | Denied, now: float, latency_s: float
    ) -> None:
        """The approver's answer, before the call it allows."""
        record = Verdict(
            t=self._t(now),
            call_id=call.id,
            approved=isinstance(verdict, Approved),
            reason=valid_text(verdict.reason)
            if isinstance(verdict, Denied) and isinstance(verdict.reason, str)
            else None,
            latency_s=latency_s,
        )
        if self._write is not None:
            self._write(record)
        else:
            await self.journal.append(record)

    async def call(self, call: ValidatedCall, now: float) -> None:
        """Before the executor is called: a mutating call's intent is committed (durable),
        a read-only call's appended. Raises: the call must then not run."""
        record = Call(
            t=now - self.machine.started_at,
            call_id=call.id,
            name=call.name,
            arguments=canonical_arguments(call.arguments),
            effect=call.effect._value_,  # the plain value: Enum.value is a slow descriptor
        )
        if call.effect is Effect.MUTATING:
            await self.journal.commit(record)
        elif self._write is not None:
            self._write(record)
        else:
            await self.journal.append(record)

    async def result(
        self, call: ValidatedCall, outcome: ToolOutcome, now: float, latency_s: float
    ) -> None:
        """What the executor returned, before the machine is told."""
        status: Literal["success", "failure", "ambiguous"] = "ambiguous"
        if isinstance(outcome, Success):
            status = "success"
        elif isinstance(outcome, Failure):
            status = "failure"
        record = Result(
            t=now - self.machine.started_at,
            call_id=call.id,
            status=status,
            # What the machine appends (valid, bounded): the same when fed again.
            observation=bounded_text(
                outcome.observation, self.machine.config.max_observation_bytes
            ),
            latency_s=latency_s,
        )
        if self._write is not None:
            self._write(record)
        else:
            await self.journal.append(record)

    async def finish(self, decision: FinishDecision, now: float) -> None:
        """The session's end, committed; a failure is logged (a resume re-derives it)."""
        result = decision.result
        record = Finish(
            t=self._t(now), outcome=result.outcome.value, cut=self.cut, report=report_of(result)
        )
        try:
            await self.journal.commit(record)
        except JournalError as exc:
            logger.warning(
                "run %s: its finish was not journaled (%s); resuming it ends it again",
                self.journal.run_id,
                exc.kind,
            )

    async def close(self) -> None:
        """Release the run's journal; a failure is logged."""
        try:
            await self.journal.close()
        except (OSError, JournalError):
            logger.warning("run %s: closing its journal failed", self.journal.run_id)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A claimed run, replayed: its recorder, machine and next decision."""

    recorder: Recorder
    decision: Decision
    header: Header
    sends: int
    """How many times the pending request was journaled as sent (a resend makes one more)."""
    finished: bool = False
    """The finish was journaled already: nothing to do (the journal is released)."""


async def prepare_resume(
    journal: Journal,
    run_id: str,
    *,
    config: ToolLoopConfig,
    registry: ToolRegistry,
    prints: Sequence[ToolPrint],
    approval: bool,
    current_generation: int | None,
) -> Prepared:
    """Claim ``run_id``, check and replay its journal, settle what needs no action.

    ``current_generation`` is the caller's idea of the session's generation (its
    :class:`~._generation.SessionGeneration`); with the journal's own newest generation, a
    newer one than the run's ends it ``superseded`` without a request or a call. The
    decision returned is a :class:`~._loop.Finish` (already journaled) when nothing is left
    to do. Raises :class:`~metacrate_grid_agent.errors.JournalLockedError`,
    :class:`~metacrate_grid_agent.errors.JournalDivergenceError` or
    :class:`~metacrate_grid_agent.errors.JournalError` before any action.
    """
    run, records = await journal.claim(run_id)
    try:
        header = _header(records, run_id)
        check_header(header, config=config, prints=prints, approval=approval)
        replayed = replay(records, config=config, registry=registry, approval=approval)
        machine = replayed.machine
        recorder = Recorder(run, machine)
        loop = asyncio.get_running_loop()
        session_now = max(replayed.last_t, time.time() - header.anchor)
        machine.started_at = loop.time() - session_now
        decision = replayed.decision
        if replayed.finished:
            await recorder.close()
            return Prepared(recorder, decision, header, replayed.sends, finished=True)
        newest = await journal.newest_generation(header.session_id)
        newer = max(current_generation or 0, newest or 0)
        if not isinstance(decision, FinishDecision) and newer > header.generation:
            recorder.cut = Cut(
                reason=SUPERSEDED, superseded=True, tool_in_flight=replayed.intent is not None
            )
            decision = machine.on_cancelled(
                SUPERSEDED,
                loop.time(),
                superseded=True,
                tool_in_flight=replayed.intent is not None,
            )
        elif replayed.intent is not None and not isinstance(decision, FinishDecision):
            # The process ended while the call ran: it may have taken effect. Never re-run.
            outcome = Ambiguous(AMBIGUOUS_ON_RESUME)
            now = loop.time()
            call = _validated(replayed.intent, decision)
            await recorder.result(call, outcome, now, 0.0)
            decision = machine.on_tool_result(outcome, now, 0.0)
    except BaseException:
        await run.close()
        raise
    return Prepared(recorder, decision, header, replayed.sends)


def _header(records: Sequence[Record], run_id: str) -> Header:
    """The journal's header, its first record."""
    if not records or not isinstance(records[0], Header):
        raise JournalError(f"run {run_id}: its journal has no header", run_id=run_id)
    return records[0]


def _validated(intent: Call, decision: Decision) -> ValidatedCall:
    """The validated call the pending decision holds (it matched ``intent`` in the replay)."""
    call = getattr(decision, "call", None)
    if isinstance(call, ValidatedCall) and call.id == intent.call_id:
        return call
    raise JournalError(f"call {intent.call_id}: its intent has no pending call")  # pragma: no cover
