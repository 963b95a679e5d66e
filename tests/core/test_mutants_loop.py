"""The tool loop's pure state machine, driven event by event with no event loop.

The loopback suite proves the loop end to end; these tests pin each decision of
:class:`LoopMachine` on its own (bounds, records, usage, compaction rounds, the fallback to
the truncation marker, cuts), so that a change to any of them fails here in milliseconds.
Time is fed in as numbers, as the driver does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec
import pytest

from metacrate_grid_agent._core import _compaction
from metacrate_grid_agent._core._loop import (
    MAX_COMPACTION_ROUNDS,
    AskApproval,
    CallModel,
    Finish,
    LoopMachine,
    RunTool,
    Summarize,
)
from metacrate_grid_agent._core._redact import TRUNCATION_MARKER, bounded_text
from metacrate_grid_agent._core._results import LoopResult, Outcome, UsageTotals
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent._core._tools import (
    Ambiguous,
    ApprovalRequest,
    Approved,
    Denied,
    Effect,
    Failure,
    Success,
    Tool,
    ValidatedCall,
)
from metacrate_grid_agent._core._types import (
    AssistantMessage,
    Completion,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
)
from metacrate_grid_agent._core._wire import OversizedToolCall
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import (
    DuplicateCallIdError,
    EmptyReplyError,
    HistoryOverflowError,
    InvalidValueError,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

START: Final = 100.0
#: What the loop appends after a text it cut: a space, then the one truncation marker.
SPACED_MARKER: Final = " " + TRUNCATION_MARKER
SESSION: Final = "agent-7"
GENERATION: Final = 3
LOOK: Final = Tool(
    "look",
    "Look around.",
    {"type": "object", "properties": {"radius": {"type": "number"}}},
    Effect.READ_ONLY,
)
MOVE: Final = Tool(
    "move",
    "Move.",
    {"type": "object", "properties": {"x": {"type": "number"}}},
    Effect.MUTATING,
    timeout_s=2.5,
)


def machine(
    history: Sequence[Message] | None = None, *, approval: bool = False, **settings: Any
) -> LoopMachine:
    """A machine for the two tools under a configuration with ``settings``.

    ``approval``: the loop has an approver (calls of ``move`` wait for it).
    """
    config = ToolLoopConfig(**settings)
    return LoopMachine(
        config=config,
        registry=ToolRegistry.build((LOOK, MOVE), config),
        session_id=SESSION,
        generation=GENERATION,
        started_at=START,
        history=list(history or (SystemMessage(content="sys"), UserMessage(content="goal"))),
        approval=approval,
    )


def reply(
    *calls: tuple[str, str] | ToolCall,
    text: str | None = None,
    usage: Usage | None = None,
    attempts: int = 1,
    request_id: str = "r-1",
    finish_reason: str | None = None,
) -> Completion:
    """A completion with calls given as ``(id, tool name)`` (arguments ``{}``) or whole."""
    return Completion(
        text=text,
        tool_calls=tuple(
            c if isinstance(c, ToolCall) else ToolCall.create(c[0], c[1], "{}") for c in calls
        ),
        minted_call_ids=frozenset(),
        usage=usage,
        finish_reason=finish_reason,
        request_id=request_id,
        attempts=attempts,
        latency_s=0.25,
        attempt_records=(),
    )


def finished(decision: object) -> LoopResult:
    """The result of a Finish decision (fails on anything else)."""
    assert isinstance(decision, Finish), decision
    return decision.result


# --- requests and the bounds checked before each ------------------------------------------


def test_first_request_carries_the_history_and_a_session_request_id() -> None:
    """The first decision is a request for turn 1, naming session, generation and turn."""
    m = machine()
    decision = m.start(START)
    assert isinstance(decision, CallModel)
    assert decision.turn == 1 == m.turn
    assert decision.messages == (SystemMessage(content="sys"), UserMessage(content="goal"))
    assert decision.request_id.startswith(f"{SESSION}-g{GENERATION}-")
    assert decision.request_id.endswith("t1")


def test_wall_clock_is_checked_before_every_request() -> None:
    """At the deadline no request is made; just before it one is."""
    assert isinstance(machine(max_session_s=5.0).start(START + 4.999), CallModel)
    result = finished(machine(max_session_s=5.0).start(START + 5.0))
    assert (result.outcome, result.bound, result.turns) == (Outcome.BOUND_REACHED, "wall_clock", 0)
    m = machine(max_session_s=5.0)
    m.start(START)
    m.on_reply(reply(("c1", "look")), START + 1)
    result = finished(m.on_tool_result(Success("seen"), START + 5.0, 0.5))
    assert (result.bound, result.turns, result.latency_s) == ("wall_clock", 1, 5.0)


def test_turn_bound_stops_before_the_next_request() -> None:
    """With ``max_turns`` requests made, the next one is refused as ``turns``."""
    m = machine(max_turns=1)
    m.start(START)
    assert isinstance(m.on_reply(reply(("c1", "look")), START), RunTool)
    result = finished(m.on_tool_result(Success("seen"), START, 0.0))
    assert (result.outcome, result.bound, result.turns) == (Outcome.BOUND_REACHED, "turns", 1)


def test_second_turn_gets_the_next_request_id_and_the_whole_history() -> None:
    """After the tools ran, the next request is turn 2 with call and result in the history."""
    m = machine()
    m.start(START)
    m.on_reply(reply(("c1", "look")), START)
    decision = m.on_tool_result(Success("a fountain"), START, 0.1)
    assert isinstance(decision, CallModel)
    assert decision.turn == 2
    assert decision.request_id.endswith("t2")
    assert decision.messages[-1] == ToolMessage(tool_call_id="c1", content="a fountain")
    assert isinstance(decision.messages[-2], AssistantMessage)


# --- replies ---------------------------------------------------------------------------------


def test_text_reply_completes_with_the_text_and_the_totals() -> None:
    """A reply with text and no calls ends the session as completed, with exact totals."""
    m = machine()
    m.start(START)
    result = finished(
        m.on_reply(reply(text="done", usage=Usage(7, 3, 10), attempts=2), START + 2.5)
    )
    assert result.outcome is Outcome.COMPLETED
    assert result.final_text == "done"
    assert (result.session_id, result.generation, result.turns) == (SESSION, GENERATION, 1)
    assert (result.attempts, result.latency_s, result.calls) == (2, 2.5, ())
    assert result.usage == UsageTotals(7, 3, 10, 1, 0)
    assert [r.request_id for r in result.usage_records] == ["r-1"]
    assert result.messages[-1] == AssistantMessage(content="done")
    assert (result.bound, result.cancel_reason, result.error, result.ambiguous_call) == (
        None,
        None,
        None,
        None,
    )


def test_empty_reply_is_an_error_stamped_with_its_request() -> None:
    """Neither calls nor text: ``empty_reply`` with an error naming the request."""
    m = machine()
    m.start(START)
    result = finished(m.on_reply(reply(request_id="r-9", attempts=3), START))
    assert result.outcome is Outcome.EMPTY_REPLY
    assert isinstance(result.error, EmptyReplyError)
    assert (result.error.request_id, result.error.attempts) == ("r-9", 3)
    assert "turn 1" in str(result.error)


def test_calls_per_turn_bound() -> None:
    """More calls in one reply than ``max_calls_per_turn``: none runs; exactly that many run."""
    m = machine(max_calls_per_turn=1)
    m.start(START)
    result = finished(m.on_reply(reply(("a", "look"), ("b", "look")), START))
    assert (result.bound, result.calls) == ("calls_per_turn", ())
    m = machine(max_calls_per_turn=2)
    m.start(START)
    assert isinstance(m.on_reply(reply(("a", "look"), ("b", "look")), START), RunTool)


def test_calls_per_session_bound() -> None:
    """The session's call budget counts every turn; reaching it exactly is allowed."""
    m = machine(max_calls_per_session=2, max_calls_per_turn=2)
    m.start(START)
    m.on_reply(reply(("a", "look")), START)
    m.on_tool_result(Success("x"), START, 0.0)
    assert isinstance(m.on_reply(reply(("b", "look")), START), RunTool)
    m.on_tool_result(Success("x"), START, 0.0)
    result = finished(m.on_reply(reply(("c", "look")), START))
    assert result.bound == "calls_per_session"
    assert [r.call_id for r in result.calls] == ["a", "b"]


def test_id_reused_from_an_earlier_turn_ends_the_session_before_any_call() -> None:
    """A call id seen in an earlier turn: ``duplicate_call_id``; no call of the turn runs."""
    m = machine()
    m.start(START)
    m.on_reply(reply(("a", "look")), START)
    m.on_tool_result(Success("x"), START, 0.0)
    result = finished(m.on_reply(reply(("b", "look"), ("a", "look"), request_id="r-2"), START))
    assert result.outcome is Outcome.DUPLICATE_CALL_ID
    assert isinstance(result.error, DuplicateCallIdError)
    assert result.error.path == "$.choices[0].message.tool_calls[1].id"
    assert result.error.request_id == "r-2"
    assert "tool call 1 of turn 2" in str(result.error)
    assert [r.call_id for r in result.calls] == ["a"]


def test_model_errors_end_the_session_with_their_kind() -> None:
    """A failed request is a transport error, a duplicate id its own outcome; attempts add."""
    m = machine()
    m.start(START)
    m.on_reply(reply(("a", "look"), attempts=2), START)
    m.on_tool_result(Success("x"), START, 0.0)
    error = InvalidValueError("bad", path="$")
    error.attempts = 3
    result = finished(m.on_model_error(error, START))
    assert (result.outcome, result.error, result.attempts) == (Outcome.TRANSPORT_ERROR, error, 5)
    m = machine()
    m.start(START)
    duplicate = DuplicateCallIdError("dup", path="$")
    assert finished(m.on_model_error(duplicate, START)).outcome is Outcome.DUPLICATE_CALL_ID


# --- tools -----------------------------------------------------------------------------------


def test_each_call_runs_with_its_own_timeout_and_is_recorded() -> None:
    """A tool's own timeout wins over the default; results are recorded and appended."""
    m = machine(tool_timeout_s=9.0)
    m.start(START)
    first = m.on_reply(reply(("a", "look"), ("b", "move")), START)
    assert isinstance(first, RunTool)
    assert (first.call.id, first.timeout_s, first.turn) == ("a", 9.0, 1)
    second = m.on_tool_result(Success("seen"), START, 0.5)
    assert isinstance(second, RunTool)
    assert (second.call.id, second.timeout_s) == ("b", 2.5)
    assert m.call_count_recorded == 1
    decision = m.on_tool_result(Failure("blocked"), START, 0.75)
    assert isinstance(decision, CallModel)
    records = m.records_since(0)
    assert [(r.call_id, r.status, r.observation, r.latency_s, r.turn) for r in records] == [
        ("a", "ok", "seen", 0.5, 1),
        ("b", "failed", "blocked", 0.75, 1),
    ]
    assert m.records_since(1) == records[1:]
    assert decision.messages[-1] == ToolMessage(tool_call_id="b", content="blocked")


def test_ambiguous_result_ends_the_session_naming_the_call() -> None:
    """An ambiguous outcome ends the session at once; the next call never runs."""
    m = machine()
    m.start(START)
    m.on_reply(reply(("a", "move"), ("b", "look")), START)
    result = finished(m.on_tool_result(Ambiguous("maybe"), START, 1.5))
    assert result.outcome is Outcome.AMBIGUOUS_MUTATION
    assert result.ambiguous_call is not None
    assert (result.ambiguous_call.call_id, result.ambiguous_call.status) == ("a", "ambiguous")
    assert result.ambiguous_call.latency_s == 1.5
    assert [r.call_id for r in result.calls] == ["a"]


def test_rejected_call_is_recorded_and_answered_then_the_next_runs() -> None:
    """An unknown tool is rejected with an observation; the valid call after it runs."""
    m = machine()
    m.start(START)
    decision = m.on_reply(reply(("a", "fly"), ("b", "look")), START)
    assert isinstance(decision, RunTool)
    assert decision.call.id == "b"
    (record,) = m.records_since(0)
    assert (record.call_id, record.status) == ("a", "rejected")
    assert "fly" in record.observation
    assert m.history[-1] == ToolMessage(tool_call_id="a", content=record.observation)


def test_observation_is_cut_to_its_byte_bound() -> None:
    """A long observation is cut to ``max_observation_bytes`` with the marker."""
    m = machine(max_observation_bytes=64)
    m.start(START)
    m.on_reply(reply(("a", "look")), START)
    m.on_tool_result(Success("é" * 100), START, 0.0)
    (record,) = m.records_since(0)
    assert record.observation == bounded_text("é" * 100, 64)
    assert len(record.observation.encode()) <= 64


# --- cuts ------------------------------------------------------------------------------------


def _awaiting(name: str) -> LoopMachine:
    m = machine()
    m.start(START)
    m.on_reply(reply(("a", name)), START)
    return m


def test_cut_before_the_executor_was_called_records_not_run() -> None:
    """A call decided but not started is recorded as cancelled, never as ambiguous."""
    result = finished(_awaiting("move").on_cancelled("shutdown", START + 1, superseded=False))
    assert (result.outcome, result.cancel_reason, result.ambiguous_call) == (
        Outcome.CANCELLED,
        "shutdown",
        None,
    )
    (record,) = result.calls
    assert (record.status, record.observation, record.latency_s) == (
        "cancelled",
        "not run (shutdown)",
        0.0,
    )


def test_cut_mid_flight_is_ambiguous_for_a_mutating_call_only() -> None:
    """A mutating call cut while running is ambiguous; a read-only one is just cancelled."""
    result = finished(
        _awaiting("move").on_cancelled("superseded", START, superseded=True, tool_in_flight=True)
    )
    assert result.outcome is Outcome.SUPERSEDED
    assert result.ambiguous_call is not None
    assert (result.ambiguous_call.status, result.ambiguous_call.observation) == (
        "ambiguous",
        "cut mid-flight (superseded)",
    )
    assert result.calls == (result.ambiguous_call,)
    result = finished(
        _awaiting("look").on_cancelled("disconnect", START, superseded=False, tool_in_flight=True)
    )
    assert result.ambiguous_call is None
    (record,) = result.calls
    assert (record.status, record.observation) == ("cancelled", "cut (disconnect)")


def test_wall_clock_cut_is_a_bound_and_keeps_the_ambiguous_call() -> None:
    """The wall clock cutting a running mutating call: ``bound_reached`` and the call named."""
    result = finished(
        _awaiting("move").on_cancelled(
            "wall_clock", START + 3, superseded=False, wall_clock=True, tool_in_flight=True
        )
    )
    assert (result.outcome, result.bound, result.cancel_reason) == (
        Outcome.BOUND_REACHED,
        "wall_clock",
        None,
    )
    assert result.ambiguous_call is not None
    assert result.ambiguous_call.call_id == "a"


def test_cut_while_waiting_for_the_model_records_no_call() -> None:
    """A cut during a request records nothing but the outcome."""
    m = machine()
    m.start(START)
    result = finished(m.on_cancelled("shutdown", START, superseded=False, tool_in_flight=True))
    assert (result.outcome, result.calls, result.ambiguous_call) == (Outcome.CANCELLED, (), None)


def test_events_in_the_wrong_state_are_refused() -> None:
    """Feeding an event the machine is not waiting for is a programming error."""
    m = machine()
    with pytest.raises(RuntimeError, match="state READY, not AWAIT_REPLY"):
        m.on_reply(reply(text="x"), START)
    m.start(START)
    with pytest.raises(RuntimeError):
        m.on_tool_result(Success("x"), START, 0.0)
    with pytest.raises(RuntimeError):
        m.start(START)


def test_latency_is_never_negative() -> None:
    """A clock fed earlier than the start gives a latency of 0, not a negative one."""
    m = machine()
    m.start(START)
    assert finished(m.on_reply(reply(text="x"), START - 5)).latency_s == 0.0


# --- usage -----------------------------------------------------------------------------------


def test_usage_totals_add_exactly_and_count_unreported_requests() -> None:
    """Totals add every reported count (a missing one as 0) and count requests without usage."""
    totals = UsageTotals().add(Usage(1, 2, 3)).add(None).add(Usage(10, None, None))
    assert totals == UsageTotals(
        prompt_tokens=11, completion_tokens=2, total_tokens=3, requests=3, requests_without_usage=1
    )


def test_usage_records_keep_the_last_ones_and_count_the_dropped() -> None:
    """Only ``max_usage_records`` records are kept; older ones are counted as dropped."""
    m = machine(max_usage_records=1)
    m.start(START)
    m.on_reply(reply(("a", "look"), usage=Usage(1, 1, 2), request_id="r-1"), START)
    m.on_tool_result(Success("x"), START, 0.0)
    result = finished(m.on_reply(reply(text="ok", request_id="r-2"), START))
    assert [(r.turn, r.request_id, r.usage) for r in result.usage_records] == [(2, "r-2", None)]
    assert result.usage_records_dropped == 1
    assert result.usage == UsageTotals(1, 1, 2, 2, 1)


# --- bounded text ----------------------------------------------------------------------------


def test_bounded_text_keeps_text_that_fits_exactly() -> None:
    """Text of exactly ``limit`` bytes is kept whole, without the marker."""
    assert bounded_text("ab" * 50, 100) == "ab" * 50


def test_bounded_text_cuts_inside_a_multibyte_character_cleanly() -> None:
    """A cut inside a character drops that character; the marker follows; the bound holds."""
    marker = len(SPACED_MARKER.encode())
    text = bounded_text("€" * 40, marker + 7)  # 7 bytes: two whole euro signs and a third
    assert text == "€€" + SPACED_MARKER
    assert len(bounded_text("x" * 200, marker + 10).encode()) == marker + 10


def test_bounded_text_under_the_marker_size_is_empty() -> None:
    """A limit below the marker's size leaves nothing; exactly its size leaves the marker."""
    marker = len(SPACED_MARKER.encode())
    assert bounded_text("y" * 100, 3) == ""
    assert bounded_text("y" * 100, marker) == SPACED_MARKER
    assert bounded_text("y" * 100, marker - 1) == ""


def test_bounded_text_replaces_lone_surrogates() -> None:
    """Lone surrogates become "?" so the result always serialises."""
    assert bounded_text("a\ud800b", 100) == "a?b"


# --- compaction ------------------------------------------------------------------------------


def _long_history(turns: int) -> list[Message]:
    history: list[Message] = [SystemMessage(content="sys"), UserMessage(content="goal")]
    for index in range(turns):
        history.append(AssistantMessage(tool_calls=(ToolCall.create(f"h{index}", "look", "{}"),)))
        history.append(ToolMessage(tool_call_id=f"h{index}", content="seen " * 20))
    return history


def test_over_the_message_bound_the_oldest_span_is_summarised() -> None:
    """Too many messages: a Summarize for the oldest span, then the summary replaces it."""
    m = machine(_long_history(4), max_history_messages=6, keep_recent_messages=2)
    decision = m.start(START)
    assert isinstance(decision, Summarize)
    assert decision.span[0] == UserMessage(content="goal")
    after = m.on_summary("it looked around", START)
    assert isinstance(after, CallModel)
    assert after.messages[1] == _compaction.summary_message("it looked around")
    assert len(after.messages) <= 6
    assert after.turn == 1


@pytest.mark.parametrize(
    ("text", "summarised"),
    [
        (None, False),
        ("s" * 64, True),
        ("s" * 65, False),
        ("é" * 32, True),
        ("é" * 33, False),
        ('"' * 32, True),
        ('"' * 64, False),
    ],
)
def test_summary_over_its_bound_falls_back_to_the_marker(
    text: str | None, summarised: bool
) -> None:
    """A failed or oversized summary (bytes, not characters) is replaced by the marker."""
    m = machine(
        _long_history(4), max_history_messages=6, keep_recent_messages=2, max_summary_bytes=64
    )
    m.start(START)
    after = m.on_summary(text, START)
    assert isinstance(after, CallModel)
    expected = (
        _compaction.summary_message(text or "") if summarised else _compaction.marker_message()
    )
    assert after.messages[1] == expected


def test_when_no_summary_can_fit_the_marker_is_applied_without_asking() -> None:
    """If a full-size summary cannot fit but the marker can, the marker goes in at once."""
    m = machine(
        _long_history(30),
        max_history_bytes=1024,
        max_summary_bytes=1000,
        keep_recent_messages=2,
    )
    decision = m.start(START)
    assert isinstance(decision, CallModel)
    assert decision.messages[1] == _compaction.marker_message()
    text = finished(m.on_reply(reply(text="done"), START))
    assert text.compactions == 1


def test_a_history_no_compaction_can_fit_overflows_without_a_request() -> None:
    """Head and kept tail alone over the bound: ``history_overflow``, nothing sent."""
    big: list[Message] = [SystemMessage(content="s" * 2000), UserMessage(content="goal")]
    result = finished(machine(big, max_history_bytes=1024, max_summary_bytes=64).start(START))
    assert (result.outcome, result.turns) == (Outcome.HISTORY_OVERFLOW, 0)
    assert isinstance(result.error, HistoryOverflowError)
    assert "max_history_bytes = 1024" in str(result.error)


def test_compaction_rounds_before_one_request_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plan that does not shrink enough is retried at most MAX_COMPACTION_ROUNDS times."""

    def one_message_plan(
        history: Sequence[Message], sizes: Sequence[int], envelope: Any, **_: Any
    ) -> _compaction.CompactionPlan:
        return _compaction.CompactionPlan(start=1, end=2, span=(history[1],))

    monkeypatch.setattr(_compaction, "plan", one_message_plan)
    m = machine(_long_history(4), max_history_messages=6, keep_recent_messages=2)
    decision = m.start(START)
    rounds = 0
    for _ in range(MAX_COMPACTION_ROUNDS + 2):  # bounded: a broken counter fails, not hangs
        if not isinstance(decision, Summarize):
            break
        rounds += 1
        decision = m.on_summary("same size", START)
    assert rounds == MAX_COMPACTION_ROUNDS
    assert finished(decision).outcome is Outcome.HISTORY_OVERFLOW
    assert finished(decision).compactions == MAX_COMPACTION_ROUNDS


def test_compaction_rounds_start_afresh_for_each_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The round counter is per request: a later turn may compact again."""
    m = machine(_long_history(2), max_history_messages=6, keep_recent_messages=2)
    decision = m.start(START)
    for turn in range(MAX_COMPACTION_ROUNDS + 2):
        if isinstance(decision, Summarize):
            decision = m.on_summary(f"summary {turn}", START)
        assert isinstance(decision, CallModel), decision
        m.on_reply(reply((f"t{turn}", "look")), START)
        decision = m.on_tool_result(Success("seen " * 20), START, 0.0)
    assert m.records_since(0)[-1].status == "ok"
    assert isinstance(decision, Summarize | CallModel)


def test_a_later_request_may_use_every_compaction_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The counter starts at 0 for each request: the second may take all four rounds."""

    def two_into_one(
        history: Sequence[Message], sizes: Sequence[int], envelope: Any, **_: Any
    ) -> _compaction.CompactionPlan:
        return _compaction.CompactionPlan(start=1, end=3, span=tuple(history[1:3]))

    monkeypatch.setattr(_compaction, "plan", two_into_one)
    m = machine(max_history_messages=6, keep_recent_messages=2)
    assert isinstance(m.start(START), CallModel)
    decision = m.on_reply(reply(*((f"c{i}", "look") for i in range(7))), START)
    for _ in range(7):
        assert isinstance(decision, RunTool)
        decision = m.on_tool_result(Success("x"), START, 0.0)
    summaries = 0
    for _ in range(MAX_COMPACTION_ROUNDS + 2):
        if not isinstance(decision, Summarize):
            break
        summaries += 1
        decision = m.on_summary("s", START)
    assert summaries == MAX_COMPACTION_ROUNDS
    assert isinstance(decision, CallModel)
    assert len(decision.messages) == 6


def test_attempts_of_every_reply_add_up() -> None:
    """Attempts are summed over the session's replies, not replaced by the last."""
    m = machine()
    m.start(START)
    m.on_reply(reply(("a", "look"), attempts=2), START)
    m.on_tool_result(Success("x"), START, 0.0)
    assert finished(m.on_reply(reply(text="ok", attempts=3), START)).attempts == 5


def test_a_turn_of_rejected_calls_goes_on_to_the_next_request() -> None:
    """When every call of a turn is rejected, the model hears why in the next request."""
    m = machine()
    m.start(START)
    decision = m.on_reply(reply(("a", "fly"), ("b", "swim")), START + 1)
    assert isinstance(decision, CallModel)
    assert decision.turn == 2
    assert [(r.call_id, r.name, r.status, r.latency_s) for r in m.records_since(0)] == [
        ("a", "fly", "rejected", 0.0),
        ("b", "swim", "rejected", 0.0),
    ]


def test_records_name_their_tool_and_keep_their_observation() -> None:
    """Every record carries the call's id and tool name; an ambiguous one its observation."""
    m = machine()
    m.start(START)
    m.on_reply(reply(("a", "look"), ("b", "move")), START)
    m.on_tool_result(Success("x"), START, 0.0)
    result = finished(m.on_tool_result(Ambiguous("maybe moved"), START, 0.0))
    assert [(r.call_id, r.name) for r in result.calls] == [("a", "look"), ("b", "move")]
    assert result.ambiguous_call is not None
    assert result.ambiguous_call.observation == "maybe moved"


@pytest.mark.parametrize(
    ("name", "in_flight", "status"),
    [("move", False, "cancelled"), ("move", True, "ambiguous"), ("look", True, "cancelled")],
)
def test_cut_records_name_the_call_and_take_no_time(
    name: str, in_flight: bool, status: str
) -> None:
    """A record of a cut call names its id and tool, and has a latency of 0."""
    result = finished(
        _awaiting(name).on_cancelled("shutdown", START, superseded=False, tool_in_flight=in_flight)
    )
    (record,) = result.calls
    assert (record.call_id, record.name, record.status, record.latency_s) == (
        "a",
        name,
        status,
        0.0,
    )


def test_a_duplicate_id_error_from_the_transport_is_kept() -> None:
    """A duplicate id reported by the transport is the result's error."""
    m = machine()
    m.start(START)
    duplicate = DuplicateCallIdError("dup", path="$")
    assert finished(m.on_model_error(duplicate, START)).error is duplicate


def test_call_bounds_end_as_bound_reached() -> None:
    """Both call bounds end the session with outcome ``bound_reached``."""
    m = machine(max_calls_per_turn=1)
    m.start(START)
    assert finished(m.on_reply(reply(("a", "look"), ("b", "look")), START)).outcome is (
        Outcome.BOUND_REACHED
    )
    m = machine(max_calls_per_session=1, max_calls_per_turn=1)
    m.start(START)
    m.on_reply(reply(("a", "look")), START)
    m.on_tool_result(Success("x"), START, 0.0)
    assert finished(m.on_reply(reply(("b", "look")), START)).outcome is Outcome.BOUND_REACHED


def test_an_empty_reply_error_carries_the_reply_latency() -> None:
    """The empty-reply error is stamped with how long its request took."""
    m = machine()
    m.start(START)
    error = finished(m.on_reply(reply(), START)).error
    assert error is not None
    assert error.elapsed_s == 0.25


def test_kept_usage_records_keep_their_usage() -> None:
    """A usage record holds the usage its reply reported."""
    m = machine()
    m.start(START)
    result = finished(m.on_reply(reply(text="ok", usage=Usage(4, 5, 9)), START))
    assert [r.usage for r in result.usage_records] == [Usage(4, 5, 9)]
    assert UsageTotals().add(Usage(None, 2, 3)) == UsageTotals(0, 2, 3, 1, 0)


def test_appended_messages_count_toward_the_byte_bound() -> None:
    """A tool result that pushes the history over ``max_history_bytes`` is compacted."""
    m = machine(max_history_bytes=1024, max_summary_bytes=64, keep_recent_messages=1)
    m.start(START)
    m.on_reply(reply(("a", "look")), START)
    assert isinstance(m.on_tool_result(Success("o" * 600), START, 0.0), CallModel)
    m.on_reply(reply(("b", "look")), START)
    assert isinstance(m.on_tool_result(Success("p" * 300), START, 0.0), Summarize)


def test_a_finished_session_refuses_every_event() -> None:
    """After Finish the machine is done: any further event is a programming error."""
    m = machine()
    m.start(START)
    finished(m.on_reply(reply(text="ok"), START))
    with pytest.raises(RuntimeError, match="state FINISHED"):
        m.start(START)


# --- what the history and the records hold on every path --------------------------------------


def test_usage_totals_as_plain_data_name_every_count() -> None:
    """``as_dict`` is the one JSON shape of the totals: every count under its own name."""
    assert UsageTotals(1, 2, 3, 4, 5).as_dict() == {
        "prompt_tokens": 1,
        "completion_tokens": 2,
        "total_tokens": 3,
        "requests": 4,
        "requests_without_usage": 5,
    }


def test_a_reply_after_the_deadline_is_a_wall_clock_bound() -> None:
    """A reply processed at the deadline ends the session as ``bound_reached``, not appended."""
    m = machine(max_session_s=5.0)
    m.start(START)
    result = finished(m.on_reply(reply(text="late"), START + 5.0))
    assert (result.outcome, result.bound, result.final_text) == (
        Outcome.BOUND_REACHED,
        "wall_clock",
        None,
    )
    assert result.messages == (SystemMessage(content="sys"), UserMessage(content="goal"))


def test_a_summary_after_the_deadline_is_not_applied() -> None:
    """A summary that returns at the deadline ends the session; the history stays as it was."""
    history = _long_history(4)
    m = machine(history, max_history_messages=6, keep_recent_messages=2, max_session_s=5.0)
    assert isinstance(m.start(START), Summarize)
    result = finished(m.on_summary("it looked around", START + 5.0))
    assert (result.outcome, result.bound, result.latency_s) == (
        Outcome.BOUND_REACHED,
        "wall_clock",
        5.0,
    )
    assert (result.compactions, result.turns, result.messages) == (0, 0, tuple(history))


@pytest.mark.parametrize(
    ("reason", "outcome"),
    [("length", Outcome.TRUNCATED), ("content_filter", Outcome.CONTENT_FILTERED)],
)
def test_a_reply_cut_before_any_text_ends_with_its_reason(reason: str, outcome: Outcome) -> None:
    """No text, no calls, but cut by the token cap or a filter: that outcome, not an error."""
    m = machine()
    m.start(START)
    result = finished(m.on_reply(reply(finish_reason=reason), START + 1.5))
    assert (result.outcome, result.final_text, result.error) == (outcome, None, None)
    assert (result.latency_s, result.finish_reason) == (1.5, reason)


def test_a_reply_over_a_call_bound_is_kept_in_the_history() -> None:
    """A reply refused for a call bound or a reused id is still the history's last message."""
    calls = (("a", "look"), ("b", "look"))
    m = machine(max_calls_per_turn=1)
    m.start(START)
    refused = reply(*calls)
    assert finished(m.on_reply(refused, START)).messages[-1] == refused.to_message()
    m = machine(max_calls_per_session=2, max_calls_per_turn=2)
    m.start(START)
    m.on_reply(reply(("c", "look")), START)
    m.on_tool_result(Success("x"), START, 0.0)
    result = finished(m.on_reply(refused, START))
    assert (result.bound, result.messages[-1]) == ("calls_per_session", refused.to_message())
    m = machine()
    m.start(START)
    m.on_reply(reply(("a", "look")), START)
    m.on_tool_result(Success("x"), START, 0.0)
    reused = reply(("a", "look"), text="again")
    result = finished(m.on_reply(reused, START))
    assert result.outcome is Outcome.DUPLICATE_CALL_ID
    assert result.messages[-1] == AssistantMessage(
        content="again", tool_calls=(ToolCall.create("a", "look", "{}"),)
    )


def test_text_sent_with_calls_stays_with_them_in_the_history() -> None:
    """The assistant message of a turn with calls keeps the text the model sent with them."""
    m = machine()
    m.start(START)
    m.on_reply(reply(("a", "look"), text="looking first"), START)
    assert m.history[-1] == AssistantMessage(
        content="looking first", tool_calls=(ToolCall.create("a", "look", "{}"),)
    )


def test_an_oversized_call_is_echoed_as_a_plain_call_and_rejected() -> None:
    """Arguments dropped for size: the history echoes a plain wire call with ``{}``.

    The record keeps no arguments, and the observation tells the model the size it sent.
    """
    m = machine()
    m.start(START)
    decision = m.on_reply(reply(OversizedToolCall.dropped("a", "look", 70000)), START)
    assert isinstance(decision, CallModel)
    echo = decision.messages[-2]
    assert echo == AssistantMessage(tool_calls=(ToolCall.create("a", "look", "{}"),))
    assert isinstance(echo, AssistantMessage)
    assert type(echo.tool_calls[0]) is ToolCall
    (record,) = m.records_since(0)
    assert (record.call_id, record.name, record.status, record.arguments) == (
        "a",
        "look",
        "rejected",
        "",
    )
    assert "70000 bytes" in record.observation
    assert decision.messages[-1] == ToolMessage(tool_call_id="a", content=record.observation)


def test_records_keep_the_arguments_sent_cut_like_an_observation() -> None:
    """A record's ``arguments`` is the JSON text the model sent, bounded to the observation size.

    So for a call that ran, one that was rejected, and one cut before it ran.
    """
    long_args = '{"radius": 1, "pad": "' + "p" * 200 + '"}'
    m = machine(max_observation_bytes=64)
    m.start(START)
    m.on_reply(
        reply(
            ToolCall.create("a", "look", long_args),
            ToolCall.create("b", "fly", '{"high": true}'),
            ToolCall.create("c", "move", '{"x": 3}'),
        ),
        START,
    )
    decision = m.on_tool_result(Success("seen"), START, 0.0)
    assert isinstance(decision, RunTool)
    assert decision.call.arguments == {"x": 3}
    result = finished(m.on_cancelled("shutdown", START, superseded=False))
    assert [(r.call_id, r.status, r.arguments) for r in result.calls] == [
        ("a", "ok", bounded_text(long_args, 64)),
        ("b", "rejected", '{"high": true}'),
        ("c", "cancelled", '{"x": 3}'),
    ]
    assert result.calls[0].arguments.endswith(SPACED_MARKER)


def test_dropped_usage_records_are_all_counted() -> None:
    """Every record let go counts: three replies keeping one leave two dropped."""
    m = machine(max_usage_records=1)
    m.start(START)
    for name in ("a", "b"):
        m.on_reply(reply((name, "look")), START)
        m.on_tool_result(Success("x"), START, 0.0)
    result = finished(m.on_reply(reply(text="ok", request_id="r-3"), START))
    assert ([r.request_id for r in result.usage_records], result.usage_records_dropped) == (
        ["r-3"],
        2,
    )


# --- checks and cuts ------------------------------------------------------------------------


def test_check_and_cancel_refuse_when_there_is_nothing_to_act_on() -> None:
    """``check`` before the session began, or any cut after it ended, is a programming error."""
    m = machine()
    with pytest.raises(RuntimeError, match=r"^nothing to check in state READY$"):
        m.check(START)
    m.start(START)
    finished(m.on_reply(reply(text="ok"), START))
    with pytest.raises(RuntimeError, match=r"^tool loop event in state FINISHED$"):
        m.on_cancelled("shutdown", START, superseded=False)
    with pytest.raises(RuntimeError, match=r"^nothing to check in state FINISHED$"):
        m.check(START)


def test_the_wall_clock_names_itself_in_the_records_it_cuts() -> None:
    """A call the deadline stopped says so: "not run (wall_clock)", "cut (wall_clock)", ...

    Held past the deadline (``check``), returning after it (read-only and mutating), and
    answered after it (approval): each record names the wall clock as the reason.
    """
    m = machine(max_session_s=5.0)
    m.start(START)
    m.on_reply(reply(("a", "look")), START)
    result = finished(m.check(START + 5.0))
    assert [(r.status, r.observation) for r in result.calls] == [
        ("cancelled", "not run (wall_clock)")
    ]
    assert (result.outcome, result.cancel_reason) == (Outcome.BOUND_REACHED, None)
    for name, status, observation in [
        ("look", "cancelled", "cut (wall_clock)"),
        ("move", "ambiguous", "cut mid-flight (wall_clock)"),
    ]:
        m = machine(max_session_s=5.0)
        m.start(START)
        m.on_reply(reply(("a", name)), START)
        result = finished(m.on_tool_result(Success("late"), START + 5.0, 5.0))
        assert [(r.status, r.observation) for r in result.calls] == [(status, observation)]
        assert (result.outcome, result.bound) == (Outcome.BOUND_REACHED, "wall_clock")
    m = machine(max_session_s=5.0, approval=True)
    m.start(START)
    m.on_reply(reply(("a", "move")), START)
    result = finished(m.on_approval(Approved(), START + 5.0, 5.0))
    assert [(r.status, r.observation) for r in result.calls] == [
        ("cancelled", "not run (wall_clock)")
    ]
    assert (result.outcome, result.bound) == (Outcome.BOUND_REACHED, "wall_clock")


def test_a_cut_during_the_next_request_records_no_call_again() -> None:
    """After a call ran or was denied, a cut while the model is asked adds no record."""
    m = machine()
    m.start(START)
    m.on_reply(reply(("a", "look")), START)
    assert isinstance(m.on_tool_result(Success("x"), START, 0.0), CallModel)
    result = finished(m.on_cancelled("shutdown", START, superseded=False, tool_in_flight=True))
    assert [(r.call_id, r.status) for r in result.calls] == [("a", "ok")]
    assert result.ambiguous_call is None
    m = machine(approval=True)
    m.start(START)
    m.on_reply(reply(("a", "move")), START)
    assert isinstance(m.on_approval(Denied("no"), START, 0.0), CallModel)
    result = finished(m.on_cancelled("shutdown", START, superseded=False, tool_in_flight=True))
    assert [(r.call_id, r.status) for r in result.calls] == [("a", "denied")]
    assert result.ambiguous_call is None


# --- approval ---------------------------------------------------------------------------------


def test_the_approval_request_shows_the_call_that_will_run_and_where_it_comes_from() -> None:
    """AskApproval carries the validated call, the tool, its arguments, turn and session.

    The arguments text is the JSON of the value the executor receives (compact, never the
    model's own spelling); the time to answer is ``approval_timeout_s``. Approved, the call
    runs with its tool's own timeout in the same turn; its record keeps the arguments as
    the model sent them and the latency of the run.
    """
    m = machine(approval=True, approval_timeout_s=30.0)
    m.start(START)
    ask = m.on_reply(reply(ToolCall.create("m-1", "move", '{ "x" : 4.50 }')), START + 2)
    call = ValidatedCall(id="m-1", name="move", arguments={"x": 4.5}, effect=Effect.MUTATING)
    request = ApprovalRequest(
        call=call,
        tool=MOVE,
        arguments='{"x":4.5}',
        turn=1,
        session_id=SESSION,
        generation=GENERATION,
        timeout_s=30.0,
    )
    assert ask == AskApproval(request=request, timeout_s=30.0, turn=1)
    assert m.on_approval(Approved(), START + 3, 1.0) == RunTool(call=call, timeout_s=2.5, turn=1)
    m.on_tool_result(Success("moved"), START + 4, 0.75)
    (record,) = m.records_since(0)
    assert (record.status, record.arguments, record.latency_s) == ("ok", '{ "x" : 4.50 }', 0.75)


def test_the_time_to_answer_is_what_is_left_of_the_session_when_that_is_less() -> None:
    """The operator is told the time left before ``max_session_s`` when it ends first.

    The question's own bound stays ``approval_timeout_s``: only what the operator is told
    changes.
    """
    m = machine(approval=True, approval_timeout_s=30.0, max_session_s=40.0)
    m.start(START)
    ask = m.on_reply(reply(ToolCall.create("m-1", "move", '{"x": 4}')), START + 12.5)
    assert isinstance(ask, AskApproval)
    assert (ask.request.timeout_s, ask.timeout_s) == (27.5, 30.0)


def test_the_arguments_shown_are_never_cut() -> None:
    """Arguments far over ``max_observation_bytes`` are shown whole; the record is bounded."""
    m = machine(approval=True, max_observation_bytes=256)
    m.start(START)
    arguments = msgspec.json.encode({"x": 1, "note": "é" * 3000}).decode()
    ask = m.on_reply(reply(ToolCall.create("m-1", "move", arguments)), START)
    assert isinstance(ask, AskApproval)
    assert ask.request.arguments == arguments
    m.on_approval(Denied("no"), START, 0.0)
    (record,) = m.records_since(0)
    assert len(record.arguments.encode()) <= 256


@pytest.mark.parametrize(
    ("reason", "shown"),
    [("  too far  ", "too far"), ("   ", "no reason given"), (None, "no reason given")],
)
def test_a_denial_is_recorded_with_its_reason_and_how_long_it_took(reason: Any, shown: str) -> None:
    """A denied call's record and tool message give the reason (or say none was given).

    A reason that is blank, or not text at all (an approver that sent something else), is
    shown as "no reason given".
    """
    m = machine(approval=True)
    m.start(START)
    m.on_reply(reply(ToolCall.create("m-1", "move", '{"x": 4}')), START)
    decision = m.on_approval(Denied(reason), START + 1, 1.25)
    assert isinstance(decision, CallModel)
    observation = f"not run: the operator denied this call ({shown})"
    assert decision.messages[-1] == ToolMessage(tool_call_id="m-1", content=observation)
    (record,) = m.records_since(0)
    assert (record.status, record.observation, record.latency_s, record.arguments) == (
        "denied",
        observation,
        1.25,
        '{"x": 4}',
    )
