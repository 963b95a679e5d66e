"""The journal's records and the pure resume (``_core/_journal.py``, ``_core/_resume.py``),
without a driver: a run's journal written out by hand, record by record, fed to
:func:`replay`, and each way a record can differ from the decision the loop derives there.

The journal is that of a three-turn run with an approver (see :data:`JOURNAL`): a read-only
call, an approved mutating call, a second turn whose history needs a compaction, and the
final text. Every prefix of it is a journal a crash can leave, so each prefix is checked for
what :func:`replay` leaves to do.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Final

import msgspec
import pytest

from metacrate_grid_agent import (
    AssistantMessage,
    Completion,
    Effect,
    Failure,
    Success,
    Tool,
    ToolCall,
    ToolLoopConfig,
    ToolMessage,
    UserMessage,
)
from metacrate_grid_agent._core._journal import (
    AMBIGUOUS_ON_RESUME,
    FORMAT_VERSION,
    MAX_SHOWN_CALLS,
    Call,
    Cut,
    DroppedArguments,
    Finish,
    FinishReport,
    Header,
    ModelError,
    Record,
    Reply,
    Request,
    Result,
    ShownCall,
    Summary,
    ToolPrint,
    Verdict,
    config_of,
    decode_record,
    encode_record,
    is_commit,
    parse_run_id,
    report_of,
    run_id,
    tool_prints,
    tools_hash,
)
from metacrate_grid_agent._core._loop import AskApproval, CallModel, RunTool, Summarize
from metacrate_grid_agent._core._loop import Finish as FinishDecision
from metacrate_grid_agent._core._results import CallRecord, LoopResult, Outcome, UsageTotals
from metacrate_grid_agent._core._resume import (
    Replayed,
    canonical_arguments,
    check_header,
    completion_of,
    error_of,
    outcome_of,
    replay,
)
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent._core._wire import OversizedToolCall
from metacrate_grid_agent.errors import (
    HTTPStatusError,
    JournalDivergenceError,
    JournalError,
    TransportError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

#: Small enough that the second turn's history needs a compaction before the third request.
CONFIG: Final = ToolLoopConfig(max_history_messages=5, keep_recent_messages=2)
LOOK: Final = Tool("look", "Look around.", {"type": "object"}, Effect.READ_ONLY)
MOVE: Final = Tool("move", "Move.", {"type": "object"}, Effect.MUTATING)
TOOLS: Final = (LOOK, MOVE)
PRINTS: Final = tool_prints(TOOLS)
WAVE: Final = Tool("wave", "Wave.", {}, Effect.READ_ONLY)


def completion(*calls: tuple[str, str, str], text: str | None = None) -> Completion:
    """A reply with ``calls`` as (id, name, raw arguments)."""
    return Completion(
        text=text,
        tool_calls=tuple(ToolCall.create(i, n, a) for i, n, a in calls),
        minted_call_ids=frozenset(),
        usage=None,
        finish_reason="stop",
        request_id="r",
        attempts=1,
        latency_s=0.0,
        attempt_records=(),
    )


HEADER: Final = Header(
    library="0",
    session_id="s",
    generation=0,
    run=1,
    anchor=1000.0,
    config=config_of(CONFIG),
    tools=PRINTS,
    tools_hash=tools_hash(PRINTS),
    approval=True,
    history=(UserMessage(content="go"),),
)

#: The whole journal of the run, in the order a driver writes it.
JOURNAL: Final[tuple[Record, ...]] = (
    HEADER,  # 1
    Request(t=0.0, turn=1, request_id="s-g0-r1-t1"),  # 2
    Reply(t=1.0, completion=completion(("c1", "look", '{"r":5}'), ("c2", "move", '{"x":1}'))),
    Call(t=1.0, call_id="c1", name="look", arguments='{"r":5}', effect="read_only"),  # 4
    Result(t=2.0, call_id="c1", status="success", observation="saw", latency_s=0.1),  # 5
    Verdict(t=3.0, call_id="c2", approved=True, latency_s=0.2),  # 6
    Call(t=3.0, call_id="c2", name="move", arguments='{"x":1}', effect="mutating"),  # 7
    Result(t=4.0, call_id="c2", status="success", observation="moved", latency_s=0.1),  # 8
    Request(t=4.0, turn=2, request_id="s-g0-r1-t2"),  # 9
    Reply(t=5.0, completion=completion(("c3", "look", "{}"))),  # 10
    Call(t=5.0, call_id="c3", name="look", arguments="{}", effect="read_only"),  # 11
    Result(t=6.0, call_id="c3", status="success", observation="saw2"),  # 12
    Summary(t=7.0, text="sum"),  # 13
    Request(t=7.0, turn=3, request_id="s-g0-r1-t3"),  # 14
    Reply(t=8.0, completion=completion(text="done")),  # 15
    Finish(t=8.0, outcome="completed"),  # 16
)


def _replay(records: Sequence[Record], *, approval: bool = True) -> Replayed:
    registry = ToolRegistry.build(TOOLS, CONFIG)
    return replay(records, config=CONFIG, registry=registry, approval=approval)


def _diverges(records: Sequence[Record]) -> str:
    with pytest.raises(JournalDivergenceError) as caught:
        _replay(records)
    assert caught.value.run_id == "s-g0-r1"
    assert caught.value.difference in str(caught.value)
    return caught.value.difference


def _pending(replayed: Replayed) -> tuple[str, object]:
    """What the replayed journal leaves to do, in short: the decision's kind and its key."""
    decision = replayed.decision
    if isinstance(decision, CallModel):
        return "request", decision.request_id
    if isinstance(decision, RunTool):
        return "run", decision.call.id
    if isinstance(decision, AskApproval):
        return "approve", decision.request.call.id
    if isinstance(decision, Summarize):
        return "summarize", None
    assert isinstance(decision, FinishDecision)
    return "finish", decision.result.outcome


# --- replay: what each prefix leaves to do ------------------------------------------------------

#: For each length of journal a crash can leave: (pending decision, its key), whether the
#: finish is journaled, the mutating intent left without its result, the journaled sends of
#: the pending request, the last record's session time.
PREFIXES: Final = [
    (1, ("request", "s-g0-r1-t1"), False, None, 0, 0.0),
    (2, ("request", "s-g0-r1-t1"), False, None, 1, 0.0),
    (3, ("run", "c1"), False, None, 0, 1.0),
    (4, ("run", "c1"), False, None, 0, 1.0),
    (5, ("approve", "c2"), False, None, 0, 2.0),
    (6, ("run", "c2"), False, None, 0, 3.0),
    (7, ("run", "c2"), False, "c2", 0, 3.0),
    (8, ("request", "s-g0-r1-t2"), False, None, 0, 4.0),
    (9, ("request", "s-g0-r1-t2"), False, None, 1, 4.0),
    (11, ("run", "c3"), False, None, 0, 5.0),
    (12, ("summarize", None), False, None, 0, 6.0),
    (13, ("request", "s-g0-r1-t3"), False, None, 0, 7.0),
    (15, ("finish", "completed"), False, None, 0, 8.0),
    (16, ("finish", "completed"), True, None, 0, 8.0),
]


@pytest.mark.parametrize(
    ("length", "left"), [(p[0], p[1:]) for p in PREFIXES], ids=[f"first-{p[0]}" for p in PREFIXES]
)
def test_each_prefix_of_a_journal_leaves_the_decision_it_was_cut_at(
    length: int, left: tuple[tuple[str, object], bool, str | None, int, float]
) -> None:
    """A journal cut after any record resumes at the decision that record was waiting for:
    a request journaled without its reply is sent again (``sends`` counts it), a read-only
    call without its result is run again, a mutating intent without its result is handed
    back as ``intent`` (to resume as Ambiguous, never run again), an approval or a summary
    not answered is asked again, and a finish not journaled is the decision to journal."""
    replayed = _replay(JOURNAL[:length])
    intent = None if replayed.intent is None else replayed.intent.call_id
    assert (_pending(replayed), replayed.finished, intent, replayed.sends, replayed.last_t) == left


def test_the_machine_rebuilt_holds_the_runs_history_and_result() -> None:
    """The whole journal rebuilds the session's result as the run had it: every call with
    its recorded observation and latency, the turns, the compaction's summary in place of
    the first messages, and the final text."""
    replayed = _replay(JOURNAL)
    assert isinstance(replayed.decision, FinishDecision)
    result = replayed.decision.result
    assert (result.outcome, result.final_text, result.turns, result.compactions) == (
        Outcome.COMPLETED,
        "done",
        3,
        1,
    )
    shown = [(c.call_id, c.status, c.observation, c.latency_s) for c in result.calls]
    assert shown == [
        ("c1", "ok", "saw", 0.1),
        ("c2", "ok", "moved", 0.1),
        ("c3", "ok", "saw2", 0.0),
    ]
    first = result.messages[0]
    assert isinstance(first, UserMessage)
    assert isinstance(first.content, str)
    assert first.content.endswith("sum")


def test_a_request_journaled_again_counts_each_send() -> None:
    """A request re-sent after a crash is journaled again with the same id: each counts."""
    replayed = _replay([*JOURNAL[:2], JOURNAL[1], JOURNAL[1]])
    assert _pending(replayed) == ("request", "s-g0-r1-t1")
    assert replayed.sends == 3


def test_the_last_time_is_the_latest_of_the_records_not_the_last_one() -> None:
    """A record journaled with an earlier session time than one before it (a clock step)
    does not move the resumed session's time back."""
    late = msgspec.structs.replace(JOURNAL[2], t=9.5)
    replayed = _replay([*JOURNAL[:2], late, JOURNAL[3]])
    assert replayed.last_t == 9.5


def test_a_denial_is_fed_with_its_reason_and_a_missing_reason_as_none_given() -> None:
    """A journaled denial reaches the machine as the denial the approver gave: its reason in
    the call's observation (none given, when it had none) and the approver's latency in the
    call's record, which the rebuilt machine keeps when it goes on to the finish."""
    for reason, said in (("too far", "too far"), (None, "no reason given")):
        denied = Verdict(t=3.0, call_id="c2", approved=False, reason=reason, latency_s=0.25)
        replayed = _replay([*JOURNAL[:5], denied])
        assert _pending(replayed) == ("request", "s-g0-r1-t2")
        assert isinstance(replayed.decision, CallModel)
        answers = [m for m in replayed.decision.messages if isinstance(m, ToolMessage)]
        assert answers[-1].tool_call_id == "c2"
        assert answers[-1].content == f"not run: the operator denied this call ({said})"
        end = replayed.machine.on_reply(completion(text="done"), 4.0)
        assert isinstance(end, FinishDecision)
        record = end.result.calls[-1]
        assert (record.call_id, record.status, record.latency_s) == ("c2", "denied", 0.25)


def test_the_rebuilt_machine_goes_on_from_where_the_journal_stops() -> None:
    """The machine handed back is the one the records were fed to: given the reply to the
    pending request, it decides what the run would have decided next."""
    replayed = _replay(JOURNAL[:2])
    reply = JOURNAL[2]
    assert isinstance(reply, Reply)
    decision = replayed.machine.on_reply(reply.completion, 1.0)
    assert isinstance(decision, RunTool)
    assert decision.call.id == "c1"


def test_the_rebuilt_machine_starts_at_session_time_zero() -> None:
    """The first request is decided at session time 0, whether records follow the header or
    not: under a one-second session bound, a journal of the header alone, or of the header
    and its first request, still resumes at that request."""
    config = ToolLoopConfig(max_history_messages=5, keep_recent_messages=2, max_session_s=1.0)
    header = msgspec.structs.replace(HEADER, config=config_of(config))
    registry = ToolRegistry.build(TOOLS, config)
    for records in ([header], [header, JOURNAL[1]]):
        replayed = replay(records, config=config, registry=registry, approval=True)
        assert _pending(replayed) == ("request", "s-g0-r1-t1")


def test_a_model_error_is_fed_as_its_error_and_ends_the_session() -> None:
    """A request that failed for good, journaled as a model error, ends the rebuilt session
    as it ended the run: an HTTP status as ``http_status``, anything else as a transport
    error, the error itself in the result, the attempts counted."""
    status = ModelError(
        t=1.0, request_id="s-g0-r1-t1", error_kind="http_status", message="m", status=503,
        attempts=3,
    )  # fmt: skip
    replayed = _replay([*JOURNAL[:2], status])
    assert _pending(replayed) == ("finish", "http_status")
    assert isinstance(replayed.decision, FinishDecision)
    assert replayed.decision.result.attempts == 3
    refused = replayed.decision.result.error
    assert isinstance(refused, HTTPStatusError)
    assert refused.status == 503
    assert replayed.sends == 0
    other = msgspec.structs.replace(status, error_kind="connect")
    failed = _replay([*JOURNAL[:2], other])
    assert _pending(failed) == ("finish", "transport_error")
    assert isinstance(failed.decision, FinishDecision)
    assert isinstance(failed.decision.result.error, TransportError)
    finished = _replay([*JOURNAL[:2], status, Finish(t=1.0, outcome="http_status")])
    assert finished.finished


@pytest.mark.parametrize(
    ("cut", "outcome"),
    [
        (Cut(reason="stop"), "cancelled"),
        (Cut(reason="newer run", superseded=True), "superseded"),
        (Cut(reason="late", wall_clock=True), "bound_reached"),
    ],
)
def test_a_finish_with_its_cut_is_fed_as_the_cut(cut: Cut, outcome: str) -> None:
    """A session cut from outside is journaled as a finish with its cut; the replay feeds
    the cut (superseded, wall clock) to the machine, whether it came before the first
    request or in the middle of the run."""
    at_start = _replay([HEADER, Finish(t=0.5, outcome=outcome, cut=cut)])
    assert at_start.finished
    assert _pending(at_start) == ("finish", outcome)
    later = _replay([*JOURNAL[:3], Finish(t=1.5, outcome=outcome, cut=cut)])
    assert later.finished
    assert _pending(later) == ("finish", outcome)


def test_a_cut_while_a_mutating_call_ran_leaves_it_ambiguous_not_pending() -> None:
    """A finish journaled with ``tool_in_flight`` after a mutating intent: the call is the
    ambiguous one of the rebuilt result, and nothing is left for the driver to resume."""
    cut = Cut(reason="stop", tool_in_flight=True)
    replayed = _replay([*JOURNAL[:7], Finish(t=3.5, outcome="cancelled", cut=cut)])
    assert replayed.finished
    assert replayed.intent is None
    assert isinstance(replayed.decision, FinishDecision)
    ambiguous = replayed.decision.result.ambiguous_call
    assert ambiguous is not None
    assert ambiguous.call_id == "c2"
    not_in_flight = Cut(reason="stop")
    replayed = _replay([*JOURNAL[:7], Finish(t=3.5, outcome="cancelled", cut=not_in_flight)])
    assert isinstance(replayed.decision, FinishDecision)
    assert replayed.decision.result.ambiguous_call is None


# --- replay: each difference, named -------------------------------------------------------------


def _with(index: int, **changes: Any) -> list[Record]:
    """The journal up to and with record ``index`` (0-based) changed."""
    return [*JOURNAL[:index], msgspec.structs.replace(JOURNAL[index], **changes)]


#: Each case: the journal as changed, and the whole difference the replay must name.
DIVERGENCES: Final[list[tuple[str, Callable[[], list[Record]], str]]] = [
    (
        "a record after the finish",
        lambda: [*JOURNAL, JOURNAL[1]],
        "record 17 follows the finish or repeats the header",
    ),
    (
        "the header again",
        lambda: [*JOURNAL[:2], HEADER],
        "record 3 follows the finish or repeats the header",
    ),
    (
        "another request id",
        lambda: _with(1, request_id="s-g0-r1-t9"),
        "record 2 holds request s-g0-r1-t9, the loop decided request s-g0-r1-t1",
    ),
    (
        "a request where a call was decided",
        lambda: [*JOURNAL[:3], JOURNAL[8]],
        "record 4 holds request s-g0-r1-t2, the loop decided call c1 (look)",
    ),
    (
        "a reply without its request",
        lambda: [HEADER, JOURNAL[2]],
        "record 2 holds a reply, the loop decided request s-g0-r1-t1",
    ),
    (
        "a model error without its request",
        lambda: [HEADER, ModelError(t=0.0, request_id=None, error_kind="connect", message="m")],
        "record 2 holds a reply, the loop decided request s-g0-r1-t1",
    ),
    (
        "a reply where a call was decided",
        lambda: [*JOURNAL[:3], JOURNAL[2]],
        "record 4 holds a reply, the loop decided call c1 (look)",
    ),
    (
        "a summary where a request was decided",
        lambda: [*JOURNAL[:2], JOURNAL[12]],
        "record 3 holds a summary, the loop decided request s-g0-r1-t1",
    ),
    (
        "an approval of another call",
        lambda: _with(5, call_id="zz"),
        "record 6 holds approval of zz, the loop decided approval of c2",
    ),
    (
        "an approval where a call was decided",
        lambda: [*JOURNAL[:3], JOURNAL[5]],
        "record 4 holds approval of c2, the loop decided call c1 (look)",
    ),
    (
        "a call where an approval was asked",
        lambda: [*JOURNAL[:5], JOURNAL[6]],
        "record 6 holds call c2, the loop decided approval of c2",
    ),
    (
        "a call where a summary was asked",
        lambda: [*JOURNAL[:12], JOURNAL[10]],
        "record 13 holds call c3, the loop decided a summary",
    ),
    (
        "a call after the finish was decided",
        lambda: [*JOURNAL[:15], JOURNAL[10]],
        "record 16 holds call c3, the loop decided the finish (completed)",
    ),
    (
        "a call with another id",
        lambda: _with(3, call_id="c9"),
        "record 4: call c9 has another id now",
    ),
    (
        "a call of another tool",
        lambda: _with(3, name="move"),
        "record 4: call c1 has another tool now",
    ),
    (
        "a call with another effect",
        lambda: _with(3, effect="mutating"),
        "record 4: call c1 has another effect now",
    ),
    (
        "a call with other arguments",
        lambda: _with(3, arguments='{"r":6}'),
        "record 4: call c1 has another arguments now",
    ),
    (
        "a result of a call never journaled",
        lambda: [*JOURNAL[:3], JOURNAL[4]],
        "record 4: result of a call not journaled",
    ),
    (
        "a result of another call",
        lambda: _with(4, call_id="c2"),
        "record 5: result of a call not journaled",
    ),
    (
        "a mutating intent twice",
        lambda: [*JOURNAL[:7], JOURNAL[6]],
        "record 8: mutating call c2 twice",
    ),
    (
        "a finish with another outcome",
        lambda: _with(15, outcome="bound_reached"),
        "record 16 holds finish bound_reached, the loop decided the finish (completed)",
    ),
    (
        "a finish at the start",
        lambda: [HEADER, JOURNAL[15]],
        "record 2 holds finish completed, the loop decided request s-g0-r1-t1",
    ),
]


@pytest.mark.parametrize(
    ("change", "difference"), [c[1:] for c in DIVERGENCES], ids=[c[0] for c in DIVERGENCES]
)
def test_a_record_that_differs_from_the_decision_is_refused_naming_it(
    change: Callable[[], list[Record]], difference: str
) -> None:
    """A journal changed in one place stops the replay at that record, with the record's
    number, what it holds and what the loop decided there, in the error's ``difference``
    and message (which says nothing was done)."""
    assert _diverges(change()) == difference


def test_a_read_only_call_journaled_twice_is_the_same_call_run_again() -> None:
    """A read-only call journaled again (run again after a crash) is not a divergence; a
    mutating one is (its intent is never journaled twice)."""
    replayed = _replay([*JOURNAL[:4], JOURNAL[3], JOURNAL[4]])
    assert _pending(replayed) == ("approve", "c2")


def test_a_journal_without_its_header_is_refused() -> None:
    """No records, or a first record that is not the header: a typed error, no machine."""
    for records in ([], [JOURNAL[1]]):
        with pytest.raises(JournalError) as caught:
            _replay(records)
        assert str(caught.value) == "a journal starts with its header; this one does not"


def test_the_rebuilt_machines_clock_starts_at_the_runs_start() -> None:
    """Session time 0 is the run's start: a reply journaled just past ``max_session_s``
    ends the rebuilt session at its wall-clock bound, one just before it goes on."""
    config = ToolLoopConfig(max_history_messages=5, keep_recent_messages=2, max_session_s=10.0)
    header = msgspec.structs.replace(HEADER, config=config_of(config))
    registry = ToolRegistry.build(TOOLS, config)
    for t, pending in ((9.5, ("run", "c1")), (10.5, ("finish", "bound_reached"))):
        records = [header, JOURNAL[1], msgspec.structs.replace(JOURNAL[2], t=t)]
        replayed = replay(records, config=config, registry=registry, approval=True)
        assert _pending(replayed) == pending, t


def test_the_divergence_message_says_nothing_was_done_and_what_to_do() -> None:
    """The error names the run, the difference, that nothing was done, and how to resume."""
    with pytest.raises(JournalDivergenceError) as caught:
        _replay([HEADER, JOURNAL[2]])
    assert str(caught.value) == (
        "run s-g0-r1 cannot be resumed by this loop: record 2 holds a reply, the loop "
        "decided request s-g0-r1-t1; nothing was done. Resume it with the tools and "
        "configuration it started with"
    )


# --- the header against the resuming loop -------------------------------------------------------


def _check(
    header: Header = HEADER,
    *,
    config: ToolLoopConfig = CONFIG,
    prints: Sequence[ToolPrint] = PRINTS,
    approval: bool = True,
) -> str:
    """The difference ``check_header`` names ('' when it accepts)."""
    caught: JournalDivergenceError | None = None
    try:
        check_header(header, config=config, prints=prints, approval=approval)
    except JournalDivergenceError as error:
        caught = error
    if caught is None:
        return ""
    assert caught.run_id == "s-g0-r1"
    return caught.difference


def _reprint(index: int, **changes: Any) -> tuple[ToolPrint, ...]:
    prints = list(PRINTS)
    prints[index] = msgspec.structs.replace(prints[index], **changes)
    return tuple(prints)


def test_a_header_that_matches_the_loop_is_accepted() -> None:
    """The header the run wrote, against the same tools, settings and approver: accepted."""
    assert _check() == ""


@pytest.mark.parametrize(
    ("prints", "difference"),
    [
        (PRINTS[:1], "tool 'move' is no longer registered"),
        ((*PRINTS, *tool_prints([WAVE])), "tool 'wave' was not registered when the run started"),
        (_reprint(1, schema="0" * 64), "tool 'move' changed its description or parameter schema"),
        (_reprint(1, effect="read_only"), "tool 'move' changed its effect"),
        (_reprint(1, needs_approval=False), "tool 'move' changed its needs_approval"),
        (_reprint(0, timeout_s=3.0), "tool 'look' changed its timeout_s"),
        (PRINTS[::-1], "the tools are registered in another order"),
    ],
)  # fmt: skip
def test_a_tool_that_changed_is_named(prints: tuple[ToolPrint, ...], difference: str) -> None:
    """A tool gone, added, changed in any of what a resume relies on (schema, effect,
    approval, timeout) or registered in another order: the first such tool is named."""
    assert _check(prints=prints) == difference


def test_a_tool_changed_only_in_what_a_resume_ignores_is_accepted() -> None:
    """The kept description and parameters are for a reader; the schema hash is compared."""
    assert _check(prints=_reprint(0, description="other", parameters={"x": 1})) == ""


def test_a_loop_setting_that_changed_is_named_with_both_values() -> None:
    """A setting that differs is named with the journal's value and the loop's; a setting
    one side does not have is compared as missing (None)."""
    changed = ToolLoopConfig(max_history_messages=6, keep_recent_messages=2)
    assert _check(config=changed) == (
        "loop setting max_history_messages: the journal has 5, this loop 6"
    )
    extra = msgspec.structs.replace(HEADER, config={**HEADER.config, "zz_gone": 1})
    assert _check(extra) == "loop setting zz_gone: the journal has 1, this loop None"
    fewer = dict(HEADER.config)
    del fewer["max_turns"]
    missing = msgspec.structs.replace(HEADER, config=fewer)
    assert _check(missing) == (
        f"loop setting max_turns: the journal has None, this loop {CONFIG.max_turns!r}"
    )


def test_the_first_setting_in_name_order_is_named() -> None:
    """With several settings changed, the first in name order is named (stable words)."""
    changed = dict(HEADER.config)
    changed["max_turns"] = 99
    changed["keep_recent_messages"] = 9
    header = msgspec.structs.replace(HEADER, config=changed)
    assert _check(header).startswith("loop setting keep_recent_messages:")


def test_an_approver_added_or_removed_is_named() -> None:
    """A run that had an approver resumed without one, and the other way round."""
    assert _check(approval=False) == "the run had an approver, this loop has none"
    without = msgspec.structs.replace(HEADER, approval=False)
    assert _check(without, approval=True) == "the run had no approver, this loop has"
    assert _check(without, approval=False) == ""


def test_a_header_of_another_format_or_with_edited_tools_is_a_journal_error() -> None:
    """The format version and the hash of the tools are checked before anything is
    compared: an edited or foreign journal is a typed error naming the run, not a
    divergence."""
    with pytest.raises(JournalError) as caught:
        check_header(
            msgspec.structs.replace(HEADER, version=FORMAT_VERSION + 1),
            config=CONFIG, prints=PRINTS, approval=False,
        )  # fmt: skip
    assert not isinstance(caught.value, JournalDivergenceError)
    assert str(caught.value) == (
        f"run s-g0-r1: journal format {FORMAT_VERSION + 1}; this library reads {FORMAT_VERSION}"
    )
    assert caught.value.run_id == "s-g0-r1"
    edited = msgspec.structs.replace(HEADER, tools=PRINTS[:1])
    with pytest.raises(JournalError) as caught:
        check_header(edited, config=CONFIG, prints=PRINTS[:1], approval=True)
    assert not isinstance(caught.value, JournalDivergenceError)
    assert str(caught.value) == "run s-g0-r1: the header's tools do not match their hash (edited?)"
    assert caught.value.run_id == "s-g0-r1"


# --- rebuilding what a record holds -------------------------------------------------------------


def test_a_reply_with_dropped_arguments_is_rebuilt_as_the_oversized_call() -> None:
    """A call whose arguments the client dropped comes back as that
    :class:`OversizedToolCall` (id, name, size); an index outside the calls is ignored, and
    a reply with nothing dropped is the completion as it was."""
    reply = JOURNAL[2]
    assert isinstance(reply, Reply)
    assert completion_of(reply) is reply.completion
    dropped = msgspec.structs.replace(
        reply,
        dropped=(DroppedArguments(1, 123_456), DroppedArguments(2, 1), DroppedArguments(-1, 1)),
    )
    calls = completion_of(dropped).tool_calls
    assert calls[0] == reply.completion.tool_calls[0]
    assert not isinstance(calls[0], OversizedToolCall)
    assert isinstance(calls[1], OversizedToolCall)
    assert (calls[1].id, calls[1].name, calls[1].argument_bytes) == ("c2", "move", 123_456)
    assert len(calls) == 2
    first = msgspec.structs.replace(reply, dropped=(DroppedArguments(0, 7),))
    rebuilt = completion_of(first).tool_calls[0]
    assert isinstance(rebuilt, OversizedToolCall)
    assert (rebuilt.id, rebuilt.argument_bytes) == ("c1", 7)


def test_a_model_error_is_rebuilt_as_its_class_with_every_field() -> None:
    """The class of the error's stable kind, with its message (in its args too, as a raised
    error has it), retryability, request id, attempts and time; an HTTP status keeps its
    status (0 when none was kept) and nothing of the endpoint's words; an unknown kind
    becomes a TransportError."""
    record = ModelError(
        t=1.0, request_id="r-t1", error_kind="http_status", message="HTTP 503", status=503,
        retryable=True, attempts=3, elapsed_s=2.5,
    )  # fmt: skip
    error = error_of(record)
    assert isinstance(error, HTTPStatusError)
    assert str(error) == "HTTP 503"
    assert error.args == ("HTTP 503",)  # as a raised one holds it: its repr and pickle
    assert (error.message, error.retryable, error.request_id) == ("HTTP 503", True, "r-t1")
    assert (error.attempts, error.elapsed_s, error.status) == (3, 2.5, 503)
    assert (error.error_message, error.error_type, error.error_code) == (None, None, None)
    assert (error.excerpt, error.retry_after_s) == (None, None)
    bare = error_of(msgspec.structs.replace(record, status=None))
    assert isinstance(bare, HTTPStatusError)
    assert bare.status == 0
    other = error_of(msgspec.structs.replace(record, error_kind="no_such_kind", status=None))
    assert type(other) is TransportError
    assert (other.message, other.retryable, other.attempts) == ("HTTP 503", True, 3)
    plain = error_of(ModelError(t=0.0, request_id=None, error_kind="connect", message="x"))
    assert (plain.retryable, plain.attempts, plain.elapsed_s, plain.request_id) == (
        False,
        0,
        0.0,
        None,
    )


def test_a_result_is_rebuilt_as_the_executors_outcome() -> None:
    """success, failure and ambiguous come back as the executor said, observation kept."""
    made = [
        outcome_of(Result(t=0.0, call_id="c", status=s, observation="o"))
        for s in ("success", "failure", "ambiguous")
    ]
    assert made[0] == Success("o")
    assert made[1] == Failure("o")
    assert type(made[2]).__name__ == "Ambiguous"
    assert made[2].observation == "o"


def test_canonical_arguments_sort_the_keys() -> None:
    """A call's arguments are journaled as JSON with sorted keys, however they came."""
    assert canonical_arguments({"b": 1, "a": [2, {"d": 3, "c": 4}]}) == (
        '{"a":[2,{"c":4,"d":3}],"b":1}'
    )


# --- the records themselves ---------------------------------------------------------------------


def test_run_ids_are_session_generation_and_run() -> None:
    """A run id is ``<session>-g<generation>-r<run>`` and parses back to its parts."""
    assert run_id("s.x:1", 2, 30) == "s.x:1-g2-r30"
    assert parse_run_id("s.x:1-g2-r30") == ("s.x:1", 2, 30)
    assert HEADER.run_id == "s-g0-r1"


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("a" * 64 + "-g1-r2", ("a" * 64, 1, 2)),
        ("a" * 65 + "-g1-r2", None),
        ("-g1-r2", None),
        ("a-g" + "9" * 18 + "-r" + "9" * 18, ("a", 10**18 - 1, 10**18 - 1)),
        ("a-g" + "9" * 19 + "-r1", None),
        ("a-g1-r" + "9" * 19, None),
        ("a-g-r1", None),
        ("a-g1-r", None),
        ("a/b-g1-r2", None),
        ("a-g1-r2\n", None),
        ("xa-g1-r2x", None),
        ("a-b-g1-r2", ("a-b", 1, 2)),
    ],
)
def test_a_run_id_parses_only_within_its_bounds(
    value: str, parsed: tuple[str, int, int] | None
) -> None:
    """Session ids of 1 to 64 safe characters, generation and run of 1 to 18 digits, the
    whole value and nothing around it (a file name or row key is never mistaken for one)."""
    assert parse_run_id(value) == parsed


def test_a_tools_print_is_what_a_resume_compares() -> None:
    """Each tool's print keeps its name, effect, approval and timeout, and the SHA-256 of
    its description and parameters as sorted JSON; the hash over all prints depends on
    their order."""
    tool = Tool("t", "Desc.", {"type": "object", "a": 1}, Effect.MUTATING, 5.0, False)
    (made,) = tool_prints([tool])
    body = b'{"description":"Desc.","parameters":{"a":1,"type":"object"}}'
    assert made == ToolPrint(
        name="t",
        effect="mutating",
        needs_approval=False,
        timeout_s=5.0,
        schema=hashlib.sha256(body).hexdigest(),
        description="Desc.",
        parameters={"type": "object", "a": 1},
    )
    assert type(made.parameters) is dict
    assert (
        tools_hash(PRINTS)
        == hashlib.sha256(msgspec.json.encode(list(PRINTS), order="sorted")).hexdigest()
    )
    assert tools_hash(PRINTS) != tools_hash(PRINTS[::-1])


def test_the_header_keeps_the_loop_configuration_as_plain_data() -> None:
    """The configuration as the header keeps it: the loop settings' own plain form."""
    assert config_of(CONFIG) == msgspec.to_builtins(CONFIG.to_dict())
    assert type(config_of(CONFIG)) is dict


def test_only_a_mutating_intent_and_the_finish_are_commits() -> None:
    """The two records a run waits on before going on: every other is appended."""
    commits = [is_commit(r) for r in JOURNAL]
    assert [i for i, c in enumerate(commits) if c] == [6, 15]
    read, intent = JOURNAL[3], JOURNAL[6]
    assert isinstance(read, Call)
    assert isinstance(intent, Call)
    assert (read.mutating, intent.mutating) == (False, True)


def test_each_record_is_one_line_of_json_tagged_by_its_kind() -> None:
    """Every record encodes to one JSON object tagged ``kind`` (the format on disk and in
    rows) and decodes back equal."""
    kinds = [msgspec.json.decode(encode_record(r))["kind"] for r in JOURNAL]
    assert kinds[:9] == [
        "header", "request", "reply", "call", "result", "approval", "call", "result",
        "request",
    ]  # fmt: skip
    assert kinds[12] == "summary"
    assert kinds[-1] == "finish"
    failed = ModelError(t=1.0, request_id=None, error_kind="connect", message="m")
    assert msgspec.json.decode(encode_record(failed))["kind"] == "model_error"
    for record in (*JOURNAL, failed):
        line = encode_record(record)
        assert b"\n" not in line
        assert decode_record(line) == record
        assert decode_record(line.decode()) == record


def test_the_records_defaults_are_the_documented_ones() -> None:
    """What a record leaves out decodes as: format 1, nothing dropped, no status, not
    retryable, no attempts or time, no reason, no cut or report."""
    header = msgspec.json.decode(encode_record(HEADER))
    del header["version"]
    decoded = decode_record(msgspec.json.encode(header))
    assert isinstance(decoded, Header)
    assert decoded.version == FORMAT_VERSION == 1
    error = decode_record(
        b'{"kind":"model_error","t":1,"request_id":null,"error_kind":"k","message":"m"}'
    )
    assert error == ModelError(
        t=1.0, request_id=None, error_kind="k", message="m", status=None, retryable=False,
        attempts=0, elapsed_s=0.0,
    )  # fmt: skip
    verdict = decode_record(b'{"kind":"approval","t":1,"call_id":"c","approved":true}')
    assert verdict == Verdict(t=1.0, call_id="c", approved=True, reason=None, latency_s=0.0)
    result = decode_record(
        b'{"kind":"result","t":1,"call_id":"c","status":"success","observation":"o"}'
    )
    assert isinstance(result, Result)
    assert result.latency_s == 0.0
    finish = decode_record(b'{"kind":"finish","t":1,"outcome":"completed"}')
    assert finish == Finish(t=1.0, outcome="completed", cut=None, report=None)
    reply = decode_record(encode_record(JOURNAL[2]).replace(b',"dropped":[]', b""))
    assert isinstance(reply, Reply)
    assert reply.dropped == ()
    assert Cut(reason="r") == Cut(reason="r", superseded=False, wall_clock=False,
                                  tool_in_flight=False)  # fmt: skip
    assert ToolPrint(name="n", effect="e", needs_approval=None, timeout_s=None, schema="s") == (
        ToolPrint(name="n", effect="e", needs_approval=None, timeout_s=None, schema="s",
                  description="", parameters={})
    )  # fmt: skip


def test_a_record_with_an_unknown_member_or_kind_is_refused() -> None:
    """A record holding a member its kind does not have, or of a kind the format does not
    know, is not read (a journal from elsewhere is refused, not half understood)."""
    with pytest.raises(msgspec.ValidationError):
        decode_record(b'{"kind":"summary","t":1,"text":null,"extra":1}')
    with pytest.raises(msgspec.ValidationError):
        decode_record(b'{"kind":"other","t":1}')


def test_the_observation_of_an_intent_without_its_result() -> None:
    """What the model is told of a mutating call whose process ended while it ran (the
    resumed transcript shows it; it must not read as a success)."""
    assert AMBIGUOUS_ON_RESUME == "the process ended while the call ran"


def _result(calls: int, **changes: Any) -> LoopResult:
    made = tuple(
        CallRecord(turn=1, call_id=f"c{i}", name="look", status="ok", observation=f"o{i}")
        for i in range(calls)
    )
    fields: dict[str, Any] = {
        "outcome": Outcome.COMPLETED, "session_id": "s", "generation": 0, "final_text": "done",
        "turns": 2, "calls": made, "usage": UsageTotals(prompt_tokens=3, completion_tokens=4,
        total_tokens=7, requests=2), "usage_records": (), "usage_records_dropped": 0,
        "attempts": 3, "latency_s": 1.5, "compactions": 1, "finish_reason": "stop",
    }  # fmt: skip
    fields.update(changes)
    return LoopResult(**fields)


def test_a_finish_report_summarises_the_result() -> None:
    """The finish's display report holds the result's counts and ends, and the session's
    last :data:`MAX_SHOWN_CALLS` calls with their status and observation."""
    report = report_of(_result(MAX_SHOWN_CALLS + 2))
    assert MAX_SHOWN_CALLS == 64
    assert report == FinishReport(
        turns=2, calls=66, final_text="done", finish_reason="stop", bound=None,
        cancel_reason=None, error_kind=None, error_message=None, ambiguous_call=None,
        attempts=3, latency_s=1.5, compactions=1, usage=_result(0).usage.as_dict(),
        call_list=tuple(ShownCall(f"c{i}", "look", "ok", f"o{i}") for i in range(2, 66)),
    )  # fmt: skip
    error = HTTPStatusError.__new__(HTTPStatusError)
    error.message = "refused"
    ambiguous = CallRecord(turn=1, call_id="m1", name="move", status="ambiguous", observation="")
    cut = report_of(
        _result(
            0, outcome=Outcome.HTTP_STATUS, error=error, finish_reason=None, bound="turns",
            cancel_reason="stop", ambiguous_call=ambiguous, final_text=None,
        )
    )  # fmt: skip
    assert (cut.error_kind, cut.error_message) == ("http_status", "refused")
    assert (cut.bound, cut.cancel_reason, cut.ambiguous_call) == ("turns", "stop", "m1")
    assert (cut.final_text, cut.finish_reason, cut.call_list) == (None, None, ())


def test_a_report_keeps_a_finish_reason_only_as_text() -> None:
    """A finish reason that is not text (an odd endpoint's value) is left out of the
    report rather than written as something a reader cannot show."""
    assert report_of(_result(0, finish_reason=7)).finish_reason is None


def test_the_journals_history_types_round_trip() -> None:
    """A header's history keeps each message's kind (user, assistant with calls, tool)."""
    history = (
        UserMessage(content="go"),
        AssistantMessage(content=None, tool_calls=(ToolCall.create("c1", "look", "{}"),)),
        ToolMessage(tool_call_id="c1", content="saw"),
    )
    header = msgspec.structs.replace(HEADER, history=history)
    assert decode_record(encode_record(header)) == header
