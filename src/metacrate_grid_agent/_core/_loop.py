"""The tool loop's state machine: pure, deterministic, no I/O.

Rule 1: all the loop's state lives here, in :class:`LoopMachine`. It never awaits, never
reads a clock and never touches a socket. The driver (:mod:`._tool_loop`) feeds it events
with the current time and carries out the decisions it returns:

- :class:`CallModel`: send the history and tools to the model;
- :class:`Summarize`: summarise a span of old history (compaction);
- :class:`AskApproval`: ask the approver whether one validated call may run;
- :class:`RunTool`: run one validated call through the executor;
- :class:`Finish`: the session is over; here is the result (its types are in
  :mod:`._results`).

States and transitions::

    start ──► READY ──(bounds ok, history fits)──► CallModel ──► AWAIT_REPLY
      READY ──(history too big)──► Summarize ──► AWAIT_SUMMARY ──► READY
      AWAIT_REPLY ──(no tool calls, text)──► Finish(completed | truncated | content_filtered)
      AWAIT_REPLY ──(tool calls, bounds ok, ids new)──► TOOLS
      TOOLS ──(next call invalid)──► observation appended, stay in TOOLS
      TOOLS ──(next call valid)──► RunTool ──► AWAIT_TOOL ──► TOOLS
      TOOLS ──(next call valid, needs approval)──► AskApproval ──► AWAIT_APPROVAL
      AWAIT_APPROVAL ──(approved)──► RunTool ──► AWAIT_TOOL
      AWAIT_APPROVAL ──(denied, timed out)──► "denied" observation appended, TOOLS
      TOOLS ──(no call left)──► READY
      AWAIT_TOOL ──(ambiguous)──► Finish(ambiguous_mutation)
      any ──(bound, error, cancel)──► Finish(...)

Where each bound is enforced: turns, wall clock and history envelope in READY before every
request; calls per turn, calls per session and call-id uniqueness in AWAIT_REPLY before any
call of the turn runs; observation size when a tool message is appended; usage records on
every reply.

The wall clock and the cancellation token are checked by the machine itself, before every
action: each decision point (before returning ``CallModel``, ``Summarize``, ``AskApproval``
or ``RunTool``) compares the ``now`` it was given with ``max_session_s``, and the driver calls
:meth:`LoopMachine.check` (with the time and the token's reason) right before it carries a
decision out, after any event sink or other code has run. A result that arrives after the
deadline (an executor that blocked the event loop, or swallowed its cancellation) is never
appended: the call is recorded as cut mid-flight, as if the bound had cut it.

Approval (when the loop has an approver): a call that passed validation, of a tool that asks
for approval (mutating, or ``needs_approval``), is held in AWAIT_APPROVAL until
:meth:`LoopMachine.on_approval`; its request shows the validated arguments, the value the
executor will get, encoded once. Approved gives the ``RunTool`` (checked again before it
starts); denied records the call ``denied`` and appends the operator's reason as its
observation. A cut while waiting records the call ``cancelled`` ("not run"): nothing started,
so it is never ambiguous.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Final

import msgspec

from metacrate_grid_agent._core import _compaction
from metacrate_grid_agent._core._check import Rejection, check_call
from metacrate_grid_agent._core._redact import bounded_text, valid_text
from metacrate_grid_agent._core._results import (
    Bound,
    CallRecord,
    CallStatus,
    LoopResult,
    Outcome,
    UsageRecord,
    UsageTotals,
)
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent._core._tools import (
    Ambiguous,
    ApprovalRequest,
    Approved,
    Denied,
    Effect,
    Success,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent._core._types import (
    AssistantMessage,
    Completion,
    Message,
    ToolCall,
    ToolMessage,
)
from metacrate_grid_agent._core._wire import OversizedToolCall
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import (
    DuplicateCallIdError,
    EmptyReplyError,
    GridAgentError,
    HistoryOverflowError,
    HTTPStatusError,
)

__all__ = [
    "AskApproval",
    "CallModel",
    "Decision",
    "Finish",
    "LoopMachine",
    "RunTool",
    "Summarize",
]

#: Compaction rounds before one request; each round strictly shortens the history.
MAX_COMPACTION_ROUNDS: Final = 4


# The decisions are frozen msgspec structs the collector does not track (gc=False): made for
# every action, they hold only what was built before them (strings, numbers, tuples of
# frozen messages, a ValidatedCall or ApprovalRequest whose arguments are plain decoded JSON)
# and nothing they hold is ever given the decision, so no reference cycle can pass through
# one. (Finish stays a dataclass: its result may hold an error whose traceback holds frames.)
class CallModel(msgspec.Struct, frozen=True, gc=False):
    """Decision: send ``messages`` (and the registry's tools) as request ``request_id``."""

    messages: tuple[Message, ...]
    request_id: str
    turn: int


class Summarize(msgspec.Struct, frozen=True, gc=False):
    """Decision: summarise ``span`` (the oldest compactable history) into one message."""

    span: tuple[Message, ...]


class RunTool(msgspec.Struct, frozen=True, gc=False):
    """Decision: run ``call`` through the executor, within ``timeout_s``."""

    call: ValidatedCall
    timeout_s: float
    turn: int


class AskApproval(msgspec.Struct, frozen=True, gc=False):
    """Decision: ask the approver about ``request``; wait at most ``timeout_s``."""

    request: ApprovalRequest
    timeout_s: float
    turn: int


@dataclass(frozen=True, slots=True)
class Finish:
    """Decision: the session is over."""

    result: LoopResult


Decision = CallModel | Summarize | AskApproval | RunTool | Finish


class _State(enum.Enum):
    READY = enum.auto()
    AWAIT_REPLY = enum.auto()
    AWAIT_SUMMARY = enum.auto()
    AWAIT_APPROVAL = enum.auto()
    AWAIT_TOOL = enum.auto()
    FINISHED = enum.auto()


@dataclass(slots=True)
class LoopMachine:
    """The tool loop's state. Feed it events; it returns the next :data:`Decision`."""

    config: ToolLoopConfig
    registry: ToolRegistry
    session_id: str
    generation: int
    started_at: float
    history: list[Message]
    run: int = 0
    """The run's sequence number within its generation (part of every request id)."""
    summary_budget: int = 0
    approval: bool = False
    """Whether the loop has an approver: calls of tools that ask for approval wait for it."""
    _state: _State = _State.READY
    _sizes: list[int] = field(default_factory=list)
    _turn: int = 0
    _calls: list[CallRecord] = field(default_factory=list)
    _call_count: int = 0
    _seen_ids: set[str] = field(default_factory=set)
    # Lists, not deques: a deque is 760 bytes empty and a session keeps both while it lives.
    _pending: list[ToolCall] = field(default_factory=list)
    """The calls of the turn still to decide, the next one last."""
    _reissued: dict[str, str] = field(default_factory=dict)
    _running: ValidatedCall | None = None
    _running_arguments: str = ""
    _running_timeout: float = 0.0
    _finish_reason: str | None = None
    _usage: UsageTotals = field(default_factory=UsageTotals)
    _usage_records: list[UsageRecord] = field(default_factory=list)
    _usage_dropped: int = 0
    _attempts: int = 0
    _compactions: int = 0
    _rounds: int = 0
    _plan: _compaction.CompactionPlan | None = None
    _envelope: _compaction.Envelope | None = None

    def __post_init__(self) -> None:
        self._sizes = [_compaction.message_size(m) for m in self.history]
        self._envelope = _compaction.Envelope(
            max_messages=self.config.max_history_messages,
            max_bytes=self.config.max_history_bytes,
            keep_recent=self.config.keep_recent_messages,
        )
        self.summary_budget = _compaction.message_size(
            _compaction.summary_message("x" * self.config.max_summary_bytes)
        )

    # --- events ---------------------------------------------------------------------------

    def start(self, now: float) -> Decision:
        """Begin the session."""
        self._expect(_State.READY)
        return self._next_request(now)

    def on_reply(self, completion: Completion, now: float) -> Decision:
        """The model answered."""
        self._expect(_State.AWAIT_REPLY)
        self._attempts += completion.attempts
        self._record_usage(completion)
        self._finish_reason = completion.finish_reason
        if self._expired(now):
            # Arrived after the deadline: counted (usage, attempts), never appended.
            return self._finish(Outcome.BOUND_REACHED, now, bound="wall_clock")
        calls = completion.tool_calls
        if not calls:
            final = {"length": Outcome.TRUNCATED, "content_filter": Outcome.CONTENT_FILTERED}
            ending = final.get(completion.finish_reason or "")
            if not completion.text:
                if ending is not None:
                    return self._finish(ending, now)
                empty = EmptyReplyError(
                    f"the model ended turn {self._turn} with neither tool calls nor text; "
                    "an action summary is required"
                )
                return self._finish(Outcome.EMPTY_REPLY, now, error=self._stamp(empty, completion))
            self._append(completion.to_message())
            return self._finish(ending or Outcome.COMPLETED, now, final_text=completion.text)
        if len(calls) > self.config.max_calls_per_turn:
            self._append(completion.to_message())
            return self._finish(Outcome.BOUND_REACHED, now, bound="calls_per_turn")
        if self._call_count + len(calls) > self.config.max_calls_per_session:
            self._append(completion.to_message())
            return self._finish(Outcome.BOUND_REACHED, now, bound="calls_per_session")
        if not self.config.reissue_reused_call_ids:
            for index, call in enumerate(calls):
                if call.id in self._seen_ids:
                    self._append(completion.to_message())
                    # The id is not quoted: it is endpoint text, and this error has no key
                    # to redact it with.
                    error = DuplicateCallIdError(
                        f"tool call {index} of turn {self._turn} reuses the id of a call from "
                        "an earlier turn; no call of this turn was run",
                        path=f"$.choices[0].message.tool_calls[{index}].id",
                    )
                    return self._finish(
                        Outcome.DUPLICATE_CALL_ID, now, error=self._stamp(error, completion)
                    )
        calls = self._reissue(calls)
        # The history gets plain wire calls: an oversized one is echoed with "{}" arguments.
        echo = tuple(
            ToolCall.create(c.id, c.name, c.arguments) if isinstance(c, OversizedToolCall) else c
            for c in calls
        )
        self._append(AssistantMessage(content=completion.text, tool_calls=echo))
        self._seen_ids.update(call.id for call in calls)
        self._call_count += len(calls)
        self._pending.extend(reversed(calls))
        return self._next_call(now)

    def _reissue(self, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
        """``calls`` with every id used in an earlier turn replaced by a new, unique one.

        The new id is derived from the session, generation, run, turn, position and the old
        id, so the same session replayed gets the same ids; it is what the executor, the
        history sent back and the call record use (the record keeps the old one too).
        """
        seen = self._seen_ids
        if not any(call.id in seen for call in calls):
            return calls  # the common case: no id is reused (and no copy of every id seen)
        taken = seen | {call.id for call in calls}
        result: list[ToolCall] = []
        for index, call in enumerate(calls):
            if call.id not in self._seen_ids:
                result.append(call)
                continue
            salt = 0
            while True:  # ends: each retry needs a distinct taken id, and there are few
                seed = (
                    f"{self.session_id}:{self.generation}:{self.run}:{self._turn}:{index}:"
                    f"{salt}:{call.id}"
                )
                digest = hashlib.blake2b(seed.encode(), digest_size=8).hexdigest()
                new_id = f"reissued-{digest}"
                if new_id not in taken:
                    break
                salt += 1
            taken.add(new_id)
            self._reissued[new_id] = call.id
            if isinstance(call, OversizedToolCall):
                result.append(OversizedToolCall.dropped(new_id, call.name, call.argument_bytes))
            else:
                result.append(ToolCall.create(new_id, call.name, call.arguments))
        return tuple(result)

    def on_model_error(self, error: GridAgentError, now: float) -> Decision:
        """The request failed for good (after the transport's own retries)."""
        self._expect(_State.AWAIT_REPLY)
        self._attempts += error.attempts
        if isinstance(error, DuplicateCallIdError):
            return self._finish(Outcome.DUPLICATE_CALL_ID, now, error=error)
        if isinstance(error, HTTPStatusError):  # the endpoint answered: not a transport fault
            return self._finish(Outcome.HTTP_STATUS, now, error=error)
        return self._finish(Outcome.TRANSPORT_ERROR, now, error=error)

    def on_summary(self, text: str | None, now: float) -> Decision:
        """The summarizer returned ``text``, or failed (None): apply it or the marker."""
        self._expect(_State.AWAIT_SUMMARY)
        plan = self._plan
        assert plan is not None  # noqa: S101 - set with the Summarize decision
        self._plan = None
        if self._expired(now):
            return self._finish(Outcome.BOUND_REACHED, now, bound="wall_clock")
        replacement: Message = _compaction.marker_message()
        if text is not None:
            text = valid_text(text)
        if text is not None and len(text.encode()) <= self.config.max_summary_bytes:
            summary = _compaction.summary_message(text)
            if _compaction.message_size(summary) <= self.summary_budget:
                replacement = summary
        self._apply(plan, replacement)
        self._state = _State.READY
        return self._next_request(now)

    def _apply(self, plan: _compaction.CompactionPlan, replacement: Message) -> None:
        history, sizes = _compaction.apply(self.history, self._sizes, plan, replacement)
        self.history[:] = history
        self._sizes[:] = sizes
        self._compactions += 1

    def on_tool_result(self, outcome: ToolOutcome, now: float, latency_s: float) -> Decision:
        """The executor finished the running call."""
        self._expect(_State.AWAIT_TOOL)
        call = self._running
        assert call is not None  # noqa: S101 - set with the RunTool decision
        if self._expired(now):
            # The result came after the deadline (the executor blocked the event loop or
            # swallowed its cancellation): never appended; recorded as cut mid-flight.
            return self._out_of_time(now, tool_in_flight=True)
        self._running = None
        observation = bounded_text(outcome.observation, self.config.max_observation_bytes)
        status: CallStatus
        if isinstance(outcome, Ambiguous):
            record = self._record(call, "ambiguous", observation, latency_s)
            return self._finish(Outcome.AMBIGUOUS_MUTATION, now, ambiguous=record)
        status = "ok" if isinstance(outcome, Success) else "failed"
        self._record(call, status, observation, latency_s)
        self._append(ToolMessage(tool_call_id=call.id, content=observation))
        return self._next_call(now)

    def on_approval(self, verdict: Approved | Denied, now: float, latency_s: float) -> Decision:
        """The approver answered about the waiting call (a timeout comes as a denial)."""
        self._expect(_State.AWAIT_APPROVAL)
        call = self._running
        assert call is not None  # noqa: S101 - set with the AskApproval decision
        if self._expired(now):
            # The answer came after the deadline: the call never starts.
            return self._out_of_time(now)
        if isinstance(verdict, Approved):
            self._state = _State.AWAIT_TOOL
            return RunTool(call=call, timeout_s=self._running_timeout, turn=self._turn)
        self._running = None
        reason = verdict.reason if isinstance(verdict.reason, str) else ""
        observation = bounded_text(
            f"not run: the operator denied this call ({reason.strip() or 'no reason given'})",
            self.config.max_observation_bytes,
        )
        self._record(call, "denied", observation, latency_s)
        self._append(ToolMessage(tool_call_id=call.id, content=observation))
        return self._next_call(now)

    def on_cancelled(
        self,
        reason: str,
        now: float,
        *,
        superseded: bool,
        wall_clock: bool = False,
        tool_in_flight: bool = False,
    ) -> Finish:
        """The session was cut from outside (or by its wall-clock bound).

        ``tool_in_flight`` says the executor had been called for the running call: a
        mutating call cut then is ambiguous. A call decided but not started was never run,
        nor was one still waiting for its approval.
        """
        if self._state is _State.FINISHED:
            raise RuntimeError("tool loop event in state FINISHED")
        reason = valid_text(reason)
        ambiguous = None
        waiting = self._state is _State.AWAIT_APPROVAL
        call = self._running  # set exactly while AWAIT_APPROVAL or AWAIT_TOOL; _finish clears it
        if call is not None:
            if waiting or not tool_in_flight:
                self._record(call, "cancelled", f"not run ({reason})", 0.0)
            elif call.effect is Effect.MUTATING:
                ambiguous = self._record(call, "ambiguous", f"cut mid-flight ({reason})", 0.0)
            else:
                self._record(call, "cancelled", f"cut ({reason})", 0.0)
        if wall_clock:
            return self._finish(Outcome.BOUND_REACHED, now, bound="wall_clock", ambiguous=ambiguous)
        outcome = Outcome.SUPERSEDED if superseded else Outcome.CANCELLED
        return self._finish(outcome, now, cancel_reason=reason, ambiguous=ambiguous)

    def _out_of_time(self, now: float, *, tool_in_flight: bool = False) -> Finish:
        """The wall clock ran out: end the session, recording the running call as cut by it."""
        return self.on_cancelled(
            "wall_clock", now, superseded=False, wall_clock=True, tool_in_flight=tool_in_flight
        )

    def check(
        self, now: float, cancel_reason: str | None = None, *, superseded: bool = False
    ) -> Finish | None:
        """Right before the driver carries out the decision it holds: may it go ahead?

        ``cancel_reason`` is the session token's reason if it was cancelled (``superseded``
        when its generation was replaced). None: go ahead. A :class:`Finish`: the wall clock
        ran out or the session was cut since the decision was made; the pending action
        (request, summary, tool call) never starts, and a tool call is recorded "not run".
        """
        if self._state in (_State.READY, _State.FINISHED):
            raise RuntimeError(f"nothing to check in state {self._state.name}")
        if cancel_reason is not None:
            return self.on_cancelled(cancel_reason, now, superseded=superseded)
        if self._expired(now):
            return self._out_of_time(now)
        return None

    @property
    def finished(self) -> bool:
        """Whether the session is over."""
        return self._state is _State.FINISHED

    @property
    def turn(self) -> int:
        """The current turn (1 for the first request)."""
        return self._turn

    @property
    def call_count_recorded(self) -> int:
        """How many call records exist (calls run, rejected, cut)."""
        return len(self._calls)

    def records_since(self, count: int) -> tuple[CallRecord, ...]:
        """The call records made after the first ``count``."""
        return tuple(self._calls[count:])

    # --- internals ------------------------------------------------------------------------

    def _expect(self, state: _State) -> None:
        if self._state is not state:
            raise RuntimeError(f"tool loop event in state {self._state.name}, not {state.name}")

    def _append(self, message: Message) -> None:
        self.history.append(message)
        self._sizes.append(_compaction.message_size(message))

    def _expired(self, now: float) -> bool:
        return now - self.started_at >= self.config.max_session_s

    def _record(
        self,
        call: ToolCall | ValidatedCall,
        status: CallStatus,
        observation: str,
        latency_s: float,
    ) -> CallRecord:
        if isinstance(call, ValidatedCall):
            arguments = self._running_arguments
        elif isinstance(call, OversizedToolCall):
            arguments = ""
        else:
            arguments = bounded_text(call.arguments, self.config.max_observation_bytes)
        record = CallRecord(
            self._turn,
            call.id,
            call.name,
            status,
            observation,
            latency_s,
            arguments=arguments,
            reissued_from=self._reissued.get(call.id),
        )
        self._calls.append(record)
        return record

    @staticmethod
    def _stamp(error: GridAgentError, completion: Completion) -> GridAgentError:
        """Give an error about a reply the context of the request that brought it."""
        return error.with_context(
            request_id=completion.request_id,
            attempts=completion.attempts,
            elapsed_s=completion.latency_s,
        )

    def _record_usage(self, completion: Completion) -> None:
        self._usage = self._usage.add(completion.usage)
        self._usage_records.append(
            UsageRecord(turn=self._turn, request_id=completion.request_id, usage=completion.usage)
        )
        if len(self._usage_records) > self.config.max_usage_records:
            del self._usage_records[0]  # at most max_usage_records (<= 4096) moved
            self._usage_dropped += 1

    def _next_request(self, now: float) -> Decision:
        if self._expired(now):
            return self._finish(Outcome.BOUND_REACHED, now, bound="wall_clock")
        if self._turn >= self.config.max_turns:
            return self._finish(Outcome.BOUND_REACHED, now, bound="turns")
        envelope = self._envelope
        assert envelope is not None  # noqa: S101 - set in __post_init__
        while not _compaction.fits(self._sizes, envelope):
            if self._rounds >= MAX_COMPACTION_ROUNDS:
                return self._overflow(now)
            self._rounds += 1
            plan = _compaction.plan(
                self.history, self._sizes, envelope, replacement_budget=self.summary_budget
            )
            if isinstance(plan, _compaction.CompactionPlan):
                self._plan = plan
                self._state = _State.AWAIT_SUMMARY
                return Summarize(span=plan.span)
            # Even a full-size summary cannot fit: try the (smaller) marker, with no summary.
            plan = _compaction.plan(
                self.history, self._sizes, envelope, replacement_budget=_compaction.MARKER_SIZE
            )
            if not isinstance(plan, _compaction.CompactionPlan):
                return self._overflow(now)
            self._apply(plan, _compaction.marker_message())
        self._rounds = 0
        self._turn += 1
        self._state = _State.AWAIT_REPLY
        request_id = f"{self.session_id}-g{self.generation}-r{self.run}-t{self._turn}"
        return CallModel(messages=tuple(self.history), request_id=request_id, turn=self._turn)

    def _overflow(self, now: float) -> Decision:
        error = HistoryOverflowError(
            f"the history ({len(self._sizes)} messages, {sum(self._sizes)} bytes) cannot fit "
            f"max_history_messages = {self.config.max_history_messages} and "
            f"max_history_bytes = {self.config.max_history_bytes} even after compaction; "
            "nothing was sent. Raise the limits or lower keep_recent_messages"
        )
        return self._finish(Outcome.HISTORY_OVERFLOW, now, error=error)

    def _next_call(self, now: float) -> Decision:
        """Decide the next pending call of the turn, or the next request when none is left.

        Every event that comes here (reply, tool result, denial) has just compared ``now``
        with the deadline, and rejecting a call takes no time: no second check is needed
        before a RunTool or an AskApproval. The next request checks it again.
        """
        while self._pending:
            call = self._pending.pop()
            checked = check_call(
                self.registry, call, max_observation_bytes=self.config.max_observation_bytes
            )
            if isinstance(checked, Rejection):
                self._record(call, "rejected", checked.observation, 0.0)
                self._append(ToolMessage(tool_call_id=call.id, content=checked.observation))
                continue
            tool = self.registry.get(checked.name)
            assert tool is not None  # noqa: S101 - check_call found it
            timeout = tool.tool.timeout_s or self.config.tool_timeout_s
            self._running_arguments = bounded_text(
                call.arguments, self.config.max_observation_bytes
            )
            self._running = checked
            self._running_timeout = timeout
            if self.approval and tool.tool.asks_approval():
                self._state = _State.AWAIT_APPROVAL
                left_s = self.config.max_session_s - (now - self.started_at)
                request = ApprovalRequest(
                    call=checked,
                    tool=tool.tool,
                    # The value the executor will get, encoded once; never cut.
                    arguments=msgspec.json.encode(checked.arguments).decode(),
                    turn=self._turn,
                    session_id=self.session_id,
                    generation=self.generation,
                    timeout_s=min(self.config.approval_timeout_s, left_s),
                )
                return AskApproval(
                    request=request, timeout_s=self.config.approval_timeout_s, turn=self._turn
                )
            self._state = _State.AWAIT_TOOL
            return RunTool(call=checked, timeout_s=timeout, turn=self._turn)
        self._state = _State.READY
        return self._next_request(now)

    def _finish(
        self,
        outcome: Outcome,
        now: float,
        *,
        final_text: str | None = None,
        bound: Bound | None = None,
        cancel_reason: str | None = None,
        error: GridAgentError | None = None,
        ambiguous: CallRecord | None = None,
    ) -> Finish:
        self._state = _State.FINISHED
        self._pending.clear()
        self._running = None
        return Finish(
            LoopResult(
                outcome=outcome,
                session_id=self.session_id,
                generation=self.generation,
                final_text=final_text,
                turns=self._turn,
                calls=tuple(self._calls),
                usage=self._usage,
                usage_records=tuple(self._usage_records),
                usage_records_dropped=self._usage_dropped,
                attempts=self._attempts,
                latency_s=max(0.0, now - self.started_at),
                bound=bound,
                cancel_reason=cancel_reason,
                error=error,
                ambiguous_call=ambiguous,
                messages=tuple(self.history),
                compactions=self._compactions,
                finish_reason=self._finish_reason,
            )
        )
