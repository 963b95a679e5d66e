"""What a tool-loop session produced: the result types, plain frozen data (pure, no I/O).

:class:`LoopResult` is what :meth:`~metacrate_grid_agent.ToolLoop.run` returns: the
:class:`Outcome` that ended the session, every :class:`CallRecord`, the exact
:class:`UsageTotals` and a :class:`UsageRecord` per request (the latest
``max_usage_records``). The machine that builds them is :mod:`._loop`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from metacrate_grid_agent._core._types import Message, Usage
from metacrate_grid_agent.errors import GridAgentError

__all__ = [
    "Bound",
    "CallRecord",
    "CallStatus",
    "LoopResult",
    "Outcome",
    "UsageRecord",
    "UsageTotals",
]


class Outcome(enum.StrEnum):
    """How a tool-loop session ended."""

    COMPLETED = "completed"
    """The model wrote its final text (``final_text``); nothing was cut."""
    BOUND_REACHED = "bound_reached"
    """A bound ended the session (``bound`` says which: turns, calls, the wall clock)."""
    AMBIGUOUS_MUTATION = "ambiguous_mutation"
    """A mutating call's result is unknown (``ambiguous_call``): the session stopped at once."""
    DUPLICATE_CALL_ID = "duplicate_call_id"
    """The model reused a call id within the session (unless reissuing is configured)."""
    EMPTY_REPLY = "empty_reply"
    """A reply with neither tool calls nor text."""
    HISTORY_OVERFLOW = "history_overflow"
    """The history could not be compacted to fit its bounds, even to the marker."""
    CANCELLED = "cancelled"
    """The session's ``CancelToken`` was cancelled (``cancel_reason`` says why)."""
    SUPERSEDED = "superseded"
    """The avatar's ``SessionGeneration`` moved on: a newer run owns the session."""
    TRANSPORT_ERROR = "transport_error"
    """The request failed for good: no usable answer (connection, timeout, protocol)."""
    HTTP_STATUS = "http_status"
    """The endpoint refused the request with an HTTP error status (``error`` says which)."""
    TRUNCATED = "truncated"
    """The final text was cut at the endpoint's token cap (``finish_reason`` ``length``)."""
    CONTENT_FILTERED = "content_filtered"
    """The final text was stopped by a content filter (``finish_reason`` ``content_filter``)."""


Bound = Literal["turns", "calls_per_turn", "calls_per_session", "wall_clock"]
CallStatus = Literal["ok", "failed", "rejected", "denied", "ambiguous", "cancelled"]
"""``denied``: the approver refused the call (or did not answer in time); it never ran."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One tool call of the session and what became of it.

    ``arguments`` is the arguments JSON text the model sent, cut like an observation to
    ``max_observation_bytes`` (``""`` when it was dropped for exceeding
    ``max_argument_bytes``). ``reissued_from`` is the id the model gave, when the call was
    given a new session-unique ``call_id`` (``reissue_reused_call_ids``).
    """

    turn: int
    call_id: str
    name: str
    status: CallStatus
    observation: str
    latency_s: float = 0.0
    arguments: str = ""
    reissued_from: str | None = None


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """Token usage of one model request."""

    turn: int
    request_id: str
    usage: Usage | None


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Exact running totals over every request of the session (unreported counts as 0)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    requests: int = 0
    requests_without_usage: int = 0

    def as_dict(self) -> dict[str, int]:
        """The totals as plain JSON data (for results and records written out)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "requests": self.requests,
            "requests_without_usage": self.requests_without_usage,
        }

    def add(self, usage: Usage | None) -> UsageTotals:
        """The totals with one more request's usage."""
        if usage is None:
            return UsageTotals(
                self.prompt_tokens,
                self.completion_tokens,
                self.total_tokens,
                self.requests + 1,
                self.requests_without_usage + 1,
            )
        return UsageTotals(
            self.prompt_tokens + (usage.prompt_tokens or 0),
            self.completion_tokens + (usage.completion_tokens or 0),
            self.total_tokens + (usage.total_tokens or 0),
            self.requests + 1,
            self.requests_without_usage,
        )


@dataclass(frozen=True, slots=True)
class LoopResult:
    """Everything a session produced. There is no reasoning field: none is ever kept.

    ``outcome`` says how the session ended, with ``bound``, ``cancel_reason``, ``error`` or
    ``ambiguous_call`` for the outcomes that have one. ``turns`` counts the model requests
    begun (a request cut before it left still counts); ``calls`` lists every proposed call
    and what became of it; ``usage`` has exact totals, ``usage_records`` the last
    ``max_usage_records`` per-request records (``usage_records_dropped`` older ones were
    let go); ``attempts`` counts HTTP attempts over all requests; ``messages`` is the final
    history (after compaction), ``compactions`` how often it was compacted.
    ``finish_reason`` is the last reply's (``stop``, ``tool_calls``, ``length``, ...), None
    when no reply came or the endpoint sent none.
    """

    outcome: Outcome
    session_id: str
    generation: int
    final_text: str | None
    turns: int
    calls: tuple[CallRecord, ...]
    usage: UsageTotals
    usage_records: tuple[UsageRecord, ...]
    usage_records_dropped: int
    attempts: int
    latency_s: float
    bound: Bound | None = None
    cancel_reason: str | None = None
    error: GridAgentError | None = None
    ambiguous_call: CallRecord | None = None
    messages: tuple[Message, ...] = ()
    compactions: int = 0
    finish_reason: str | None = None
