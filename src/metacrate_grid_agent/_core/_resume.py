"""Resume, the pure half: rebuild a :class:`~._loop.LoopMachine` from a run's journal.

:func:`check_header` compares the journal's header with the resuming loop (tools and their
schemas, loop configuration, approval) and :func:`replay` feeds the recorded inputs, with
their recorded session times, to a new machine, checking each decision it derives against
the record that names the same action (a request id; a call's id, name, arguments and
effect; the call an approval was about). Any difference is a
:class:`~metacrate_grid_agent.errors.JournalDivergenceError` naming it, raised before the
driver takes any action.

What :func:`replay` leaves for the driver (:class:`Replayed`):

- the finish is journaled: nothing to do (``finished``; ``decision`` is the
  :class:`~._loop.Finish` rebuilt, with the whole result);
- a request journaled without its reply: ``decision`` is that :class:`~._loop.CallModel`,
  sent again with the same request id (``sends`` says how often it was journaled);
- a read-only call journaled without its result: ``decision`` is that
  :class:`~._loop.RunTool`, run again;
- a mutating intent without its result: ``intent`` is set; the driver feeds
  :class:`~._tools.Ambiguous` (:data:`~._journal.AMBIGUOUS_ON_RESUME`) and never runs it;
- an approval asked but not answered, a summary not returned: asked again;
- the machine finished but its finish was not journaled: ``decision`` is the
  :class:`~._loop.Finish`, to journal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from metacrate_grid_agent._core._journal import (
    FORMAT_VERSION,
    Call,
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
    tools_hash,
)
from metacrate_grid_agent._core._loop import (
    AskApproval,
    CallModel,
    Decision,
    LoopMachine,
    RunTool,
    Summarize,
)
from metacrate_grid_agent._core._loop import (
    Finish as FinishDecision,
)
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent._core._tools import (
    Ambiguous,
    Approved,
    Denied,
    Failure,
    Success,
    ToolOutcome,
)
from metacrate_grid_agent._core._types import Completion
from metacrate_grid_agent._core._wire import OversizedToolCall
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import (
    GridAgentError,
    HTTPStatusError,
    JournalDivergenceError,
    JournalError,
    TransportError,
    error_kinds,
)

__all__ = [
    "Replayed",
    "canonical_arguments",
    "check_header",
    "completion_of",
    "error_of",
    "outcome_of",
    "replay",
]


@dataclass(frozen=True, slots=True)
class Replayed:
    """A machine rebuilt from a journal, and what is left to do (see the module doc)."""

    machine: LoopMachine
    decision: Decision
    finished: bool
    """The finish is journaled: nothing to do."""
    intent: Call | None
    """A mutating intent journaled without its result: it resumes as ``Ambiguous``."""
    sends: int
    """How many times the pending request (``decision``) was journaled as sent."""
    last_t: float
    """The session time of the last record."""


def canonical_arguments(arguments: Any) -> str:
    """A validated call's arguments as the journal keeps them: JSON, keys sorted."""
    return msgspec.json.encode(arguments, order="sorted").decode()


def _diverged(header: Header, difference: str) -> JournalDivergenceError:
    return JournalDivergenceError(
        f"run {header.run_id} cannot be resumed by this loop: {difference}; nothing was "
        "done. Resume it with the tools and configuration it started with",
        run_id=header.run_id,
        difference=difference,
    )


def check_header(
    header: Header,
    *,
    config: ToolLoopConfig,
    prints: Sequence[ToolPrint],
    approval: bool,
) -> None:
    """Raise :class:`JournalDivergenceError` naming the first difference between the
    journal's header and the resuming loop (format, tools, schemas, settings, approval)."""
    if header.version != FORMAT_VERSION:
        raise JournalError(
            f"run {header.run_id}: journal format {header.version}; this library reads "
            f"{FORMAT_VERSION}",
            run_id=header.run_id,
        )
    if tools_hash(header.tools) != header.tools_hash:
        raise JournalError(
            f"run {header.run_id}: the header's tools do not match their hash (edited?)",
            run_id=header.run_id,
        )
    recorded = {p.name: p for p in header.tools}
    current = {p.name: p for p in prints}
    for name in recorded.keys() - current.keys():
        raise _diverged(header, f"tool {name!r} is no longer registered")
    for name in current.keys() - recorded.keys():
        raise _diverged(header, f"tool {name!r} was not registered when the run started")
    for name, was in recorded.items():
        now = current[name]
        for member in ("schema", "effect", "needs_approval", "timeout_s"):
            if getattr(was, member) != getattr(now, member):
                what = "description or parameter schema" if member == "schema" else member
                raise _diverged(header, f"tool {name!r} changed its {what}")
    if [p.name for p in header.tools] != [p.name for p in prints]:
        raise _diverged(header, "the tools are registered in another order")
    settings = config_of(config)
    for key in sorted(header.config.keys() | settings.keys()):
        if header.config.get(key) != settings.get(key):
            raise _diverged(
                header,
                f"loop setting {key}: the journal has {header.config.get(key)!r}, this loop "
                f"{settings.get(key)!r}",
            )
    if header.approval != approval:
        had = "had an approver" if header.approval else "had no approver"
        raise _diverged(header, f"the run {had}, this loop {'has' if approval else 'has none'}")


def completion_of(record: Reply) -> Completion:
    """The completion a :class:`Reply` record holds, its dropped calls rebuilt."""
    completion = record.completion
    if not record.dropped:
        return completion
    calls = list(completion.tool_calls)
    for dropped in record.dropped:
        if 0 <= dropped.index < len(calls):
            call = calls[dropped.index]
            calls[dropped.index] = OversizedToolCall.dropped(
                call.id, call.name, dropped.argument_bytes
            )
    return msgspec.structs.replace(completion, tool_calls=tuple(calls))


def error_of(record: ModelError) -> GridAgentError:
    """The error a :class:`ModelError` record holds, as its class (by its stable kind)."""
    cls = error_kinds().get(record.error_kind)
    if cls is None or not issubclass(cls, GridAgentError):
        cls = TransportError
    error = cls.__new__(cls)
    Exception.__init__(error, record.message)
    error.message = record.message
    error.retryable = record.retryable
    error.request_id = record.request_id
    error.attempts = record.attempts
    error.elapsed_s = record.elapsed_s
    if isinstance(error, HTTPStatusError):
        error.status = record.status or 0
        error.error_message = error.error_type = error.error_code = error.excerpt = None
        error.retry_after_s = None
    return error


def outcome_of(record: Result) -> ToolOutcome:
    """The executor's outcome a :class:`Result` record holds."""
    if record.status == "success":
        return Success(record.observation)
    if record.status == "failure":
        return Failure(record.observation)
    return Ambiguous(record.observation)


def replay(
    records: Sequence[Record],
    *,
    config: ToolLoopConfig,
    registry: ToolRegistry,
    approval: bool,
) -> Replayed:
    """Feed a run's journaled inputs (header first) to a new machine; see the module doc.

    The machine's clock is the session time (``started_at`` 0): the driver moves it to its
    own clock before going on. Raises :class:`JournalDivergenceError` at the first record
    that does not match the decision re-derived before it.
    """
    if not records or not isinstance(records[0], Header):
        raise JournalError("a journal starts with its header; this one does not")
    header = records[0]
    machine = LoopMachine(
        config=config,
        registry=registry,
        session_id=header.session_id,
        generation=header.generation,
        started_at=0.0,
        history=list(header.history),
        run=header.run,
        approval=approval,
    )
    decision: Decision | None = None
    intent: Call | None = None
    sent = 0
    finished = False
    last_t = 0.0
    for number, record in enumerate(records[1:], 2):
        if finished or isinstance(record, Header):
            raise _diverged(header, f"record {number} follows the finish or repeats the header")
        last_t = max(last_t, record.t)
        if decision is None and not (isinstance(record, Finish) and record.cut is not None):
            decision = machine.start(0.0)
        if isinstance(record, Request):
            if not isinstance(decision, CallModel) or decision.request_id != record.request_id:
                raise _diverged(header, _expected(number, decision, f"request {record.request_id}"))
            sent += 1
        elif isinstance(record, Reply | ModelError):
            if not isinstance(decision, CallModel) or not sent:
                raise _diverged(header, _expected(number, decision, "a reply"))
            if isinstance(record, Reply):
                decision = machine.on_reply(completion_of(record), record.t)
            else:
                decision = machine.on_model_error(error_of(record), record.t)
            sent = 0
        elif isinstance(record, Summary):
            if not isinstance(decision, Summarize):
                raise _diverged(header, _expected(number, decision, "a summary"))
            decision = machine.on_summary(record.text, record.t)
        elif isinstance(record, Verdict):
            if not isinstance(decision, AskApproval) or decision.request.call.id != record.call_id:
                raise _diverged(
                    header, _expected(number, decision, f"approval of {record.call_id}")
                )
            verdict = Approved() if record.approved else Denied(record.reason or "")
            decision = machine.on_approval(verdict, record.t, record.latency_s)
        elif isinstance(record, Call):
            _check_call(header, number, decision, record)
            if intent is not None and intent.mutating:
                raise _diverged(header, f"record {number}: mutating call {record.call_id} twice")
            intent = record
        elif isinstance(record, Result):
            if intent is None or intent.call_id != record.call_id:
                raise _diverged(header, f"record {number}: result of a call not journaled")
            decision = machine.on_tool_result(outcome_of(record), record.t, record.latency_s)
            intent = None
        elif isinstance(record, Finish):
            if record.cut is not None and not isinstance(decision, FinishDecision):
                cut = record.cut
                decision = machine.on_cancelled(
                    cut.reason,
                    record.t,
                    superseded=cut.superseded,
                    wall_clock=cut.wall_clock,
                    tool_in_flight=cut.tool_in_flight,
                )
            if (
                not isinstance(decision, FinishDecision)
                or decision.result.outcome != record.outcome
            ):
                raise _diverged(header, _expected(number, decision, f"finish {record.outcome}"))
            finished = True
            intent = None
    if decision is None:
        decision = machine.start(0.0)
    pending = intent if intent is not None and intent.mutating and not finished else None
    return Replayed(
        machine=machine,
        decision=decision,
        finished=finished,
        intent=pending,
        sends=sent,
        last_t=last_t,
    )


def _check_call(header: Header, number: int, decision: Decision | None, record: Call) -> None:
    if not isinstance(decision, RunTool):
        raise _diverged(header, _expected(number, decision, f"call {record.call_id}"))
    call = decision.call
    for member, derived, kept in (
        ("id", call.id, record.call_id),
        ("tool", call.name, record.name),
        ("effect", call.effect.value, record.effect),
        ("arguments", canonical_arguments(call.arguments), record.arguments),
    ):
        if derived != kept:
            raise _diverged(
                header, f"record {number}: call {record.call_id} has another {member} now"
            )


def _expected(number: int, decision: Decision | None, found: str) -> str:
    """What record ``number`` holds against what the machine decided there."""
    if isinstance(decision, CallModel):
        wanted = f"request {decision.request_id}"
    elif isinstance(decision, RunTool):
        wanted = f"call {decision.call.id} ({decision.call.name})"
    elif isinstance(decision, AskApproval):
        wanted = f"approval of {decision.request.call.id}"
    elif isinstance(decision, Summarize):
        wanted = "a summary"
    elif isinstance(decision, FinishDecision):
        wanted = f"the finish ({decision.result.outcome})"
    else:
        wanted = "the start"
    return f"record {number} holds {found}, the loop decided {wanted}"
