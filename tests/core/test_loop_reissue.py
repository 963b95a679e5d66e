"""Reused call ids across turns: refused by default, reissued with ``reissue_reused_call_ids``.

Some servers number their calls afresh every turn (``call_0`` each time). With the setting
on, a call whose id was used in an earlier turn of the session gets a deterministic,
session-unique id; the executor, the history sent back and the call record use it, and the
record's ``reissued_from`` keeps the model's. Pure: the machine is driven event by event.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from metacrate_grid_agent._core._loop import CallModel, Finish, LoopMachine, RunTool
from metacrate_grid_agent._core._results import LoopResult, Outcome
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent._core._tools import Effect, Success, Tool
from metacrate_grid_agent._core._types import (
    AssistantMessage,
    Completion,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from metacrate_grid_agent._core._wire import OversizedToolCall
from metacrate_grid_agent.config import ToolLoopConfig

START: Final = 100.0
LOOK: Final = Tool("look", "Look around.", {"type": "object"}, Effect.READ_ONLY)


def machine(
    *,
    session: str = "s",
    generation: int = 1,
    run: int = 0,
    reissue: bool = True,
    **settings: Any,
) -> LoopMachine:
    """A started machine with one read-only tool and ``reissue_reused_call_ids`` as given."""
    config = ToolLoopConfig(reissue_reused_call_ids=reissue, **settings)
    m = LoopMachine(
        config=config,
        registry=ToolRegistry.build((LOOK,), config),
        session_id=session,
        generation=generation,
        started_at=START,
        history=[UserMessage(content="go")],
        run=run,
    )
    assert isinstance(m.start(START), CallModel)
    return m


def reply(*calls: ToolCall | str) -> Completion:
    """A completion with ``calls``; a plain string is a ``look`` call with that id."""
    return Completion(
        text=None,
        tool_calls=tuple(
            ToolCall.create(c, "look", "{}") if isinstance(c, str) else c for c in calls
        ),
        minted_call_ids=frozenset(),
        usage=None,
        finish_reason="tool_calls",
        request_id="r",
        attempts=1,
        latency_s=0.0,
        attempt_records=(),
    )


def reissued(
    old: str,
    *,
    turn: int,
    index: int,
    salt: int = 0,
    session: str = "s",
    generation: int = 1,
    run: int = 0,
) -> str:
    """The documented derivation of a reissued id: a stable hash, the same in every process."""
    seed = f"{session}:{generation}:{run}:{turn}:{index}:{salt}:{old}"
    return "reissued-" + hashlib.blake2b(seed.encode("utf-8"), digest_size=8).hexdigest()


def run_all(m: LoopMachine, decision: object) -> object:
    """Answer every RunTool with a success naming the call's id; return the next decision."""
    while isinstance(decision, RunTool):
        decision = m.on_tool_result(Success(f"saw {decision.call.id}"), START, 0.5)
    return decision


def second_turn(m: LoopMachine, *calls: ToolCall | str) -> object:
    """Turn 1 calls ``call_0``; turn 2 sends ``calls``. The first decision of turn 2."""
    assert isinstance(run_all(m, m.on_reply(reply("call_0"), START)), CallModel)
    return m.on_reply(reply(*calls), START + 1)


def test_a_reused_id_is_refused_when_the_setting_is_off() -> None:
    """Off (the default): an id of an earlier turn ends the session; no call of the turn runs."""
    m = machine(reissue=False)
    decision = second_turn(m, "call_1", "call_0")
    assert isinstance(decision, Finish)
    result = decision.result
    assert result.outcome is Outcome.DUPLICATE_CALL_ID
    assert [r.call_id for r in result.calls] == ["call_0"]
    assert [r.reissued_from for r in result.calls] == [None]


def test_a_reused_id_gets_a_new_id_used_by_executor_history_and_record() -> None:
    """On: the call runs under the new id; history and record use it; the record keeps the old."""
    m = machine(session="s", generation=1, run=2)
    new_id = reissued("call_0", turn=2, index=0, run=2)
    decision = second_turn(m, "call_0")
    assert isinstance(decision, RunTool)
    assert (decision.call.id, decision.call.name, decision.turn) == (new_id, "look", 2)
    assert m.history[-1] == AssistantMessage(tool_calls=(ToolCall.create(new_id, "look", "{}"),))
    after = m.on_tool_result(Success("seen"), START + 2, 0.5)
    assert isinstance(after, CallModel)
    assert after.messages[-1] == ToolMessage(tool_call_id=new_id, content="seen")
    first, second = m.records_since(0)
    assert (first.call_id, first.reissued_from) == ("call_0", None)
    assert (second.turn, second.call_id, second.status, second.reissued_from) == (
        2,
        new_id,
        "ok",
        "call_0",
    )
    assert (second.observation, second.latency_s, second.arguments) == ("seen", 0.5, "{}")


def test_only_reused_ids_are_reissued_and_new_ids_are_kept() -> None:
    """A fresh id in the same reply keeps its id; only the reused one changes, by position."""
    m = machine()
    decision = second_turn(m, "fresh", "call_0")
    assert isinstance(decision, RunTool)
    assert decision.call.id == "fresh"
    new_id = reissued("call_0", turn=2, index=1)
    message = m.history[-1]
    assert isinstance(message, AssistantMessage)
    assert [c.id for c in message.tool_calls] == ["fresh", new_id]
    run_all(m, decision)
    assert [(r.call_id, r.reissued_from) for r in m.records_since(1)] == [
        ("fresh", None),
        (new_id, "call_0"),
    ]


def test_reissued_ids_are_the_same_on_replay_and_differ_by_session_generation_run() -> None:
    """Replaying a session gives the same ids; another session, generation or run, others."""

    def new_id(**names: Any) -> str:
        m = machine(**names)
        decision = second_turn(m, "call_0")
        assert isinstance(decision, RunTool)
        return decision.call.id

    base = new_id(session="s", generation=1, run=0)
    assert base == new_id(session="s", generation=1, run=0)
    assert base == reissued("call_0", turn=2, index=0)
    others = {
        new_id(session="t", generation=1, run=0),
        new_id(session="s", generation=2, run=0),
        new_id(session="s", generation=1, run=1),
    }
    assert len(others) == 3
    assert base not in others


def test_each_turn_reissues_afresh_and_a_reissued_id_is_never_reused() -> None:
    """``call_0`` in turns 2 and 3 gets two different ids, both session-unique."""
    m = machine()
    second = second_turn(m, "call_0")
    assert isinstance(second, RunTool)
    assert isinstance(run_all(m, second), CallModel)
    third = m.on_reply(reply("call_0"), START + 2)
    assert isinstance(third, RunTool)
    assert third.call.id == reissued("call_0", turn=3, index=0)
    assert len({second.call.id, third.call.id, "call_0"}) == 3


def test_a_reissued_id_skips_an_id_already_taken_in_the_reply_or_the_session() -> None:
    """If the derived id is already some call's id (this reply or earlier), the next is taken.

    A model could send, next to a reused id, the very id it would be reissued as; the new id
    must still be unique in the session.
    """
    clash = reissued("call_0", turn=2, index=0)
    salted = reissued("call_0", turn=2, index=0, salt=1)
    m = machine()
    decision = second_turn(m, "call_0", clash)
    assert isinstance(decision, RunTool)
    assert decision.call.id == salted
    run_all(m, decision)
    assert [(r.call_id, r.reissued_from) for r in m.records_since(1)] == [
        (salted, "call_0"),
        (clash, None),
    ]
    # The same clash, with the derived id taken by a call of an earlier turn.
    m = machine()
    assert isinstance(run_all(m, m.on_reply(reply("call_0", clash), START)), CallModel)
    decision = m.on_reply(reply("call_0"), START + 1)
    assert isinstance(decision, RunTool)
    assert decision.call.id == salted
    # Two derived ids taken: the third is used.
    m = machine()
    decision = second_turn(m, "call_0", clash, salted)
    assert isinstance(decision, RunTool)
    assert decision.call.id == reissued("call_0", turn=2, index=0, salt=2)


def test_a_reused_oversized_call_keeps_its_size_and_is_rejected_under_its_new_id() -> None:
    """An oversized call with a reused id: reissued, still rejected as oversized, echoed as {}."""
    m = machine()
    decision = second_turn(m, OversizedToolCall.dropped("call_0", "look", 123456))
    new_id = reissued("call_0", turn=2, index=0)
    assert isinstance(decision, CallModel)
    assert decision.turn == 3
    echo = decision.messages[-2]
    assert echo == AssistantMessage(tool_calls=(ToolCall.create(new_id, "look", "{}"),))
    assert type(echo.tool_calls[0]) is ToolCall
    tool_message = decision.messages[-1]
    assert isinstance(tool_message, ToolMessage)
    assert tool_message.tool_call_id == new_id
    assert "123456 bytes" in tool_message.content
    (record,) = m.records_since(1)
    assert (record.call_id, record.status, record.arguments, record.reissued_from) == (
        new_id,
        "rejected",
        "",
        "call_0",
    )
    assert record.observation == tool_message.content


def test_a_session_bound_counts_reissued_calls() -> None:
    """Reissued calls count toward ``max_calls_per_session`` like any other."""
    m = machine(max_calls_per_session=2, max_calls_per_turn=2)
    assert isinstance(second_turn(m, "call_0"), RunTool)
    assert isinstance(run_all(m, m.on_tool_result(Success("x"), START, 0.0)), CallModel)
    decision = m.on_reply(reply("call_0"), START + 2)
    assert isinstance(decision, Finish)
    result: LoopResult = decision.result
    assert result.bound == "calls_per_session"
