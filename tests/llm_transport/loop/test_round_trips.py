"""Complete tool round trips over several turns, checked on the wire and at the executor.

The endpoint's own record is the reference: each request body must carry exactly the
history so far (system, goal, each assistant turn with its tool calls as received minus
unknown members, each tool message with the original id and the observation) and the
registered tool definitions, and nothing else (no ``model``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from metacrate_grid_agent import (
    AssistantMessage,
    Effect,
    Failure,
    Message,
    Outcome,
    Success,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Usage,
    UsageTotals,
    UserMessage,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    GOAL,
    LOOK,
    MOVE,
    SYSTEM,
    RecordingExecutor,
    Step,
    assistant,
    bodies,
    call,
    calls_reply,
    loop_config,
    make_loop,
    request_ids,
    run_loop,
    system,
    tool,
    tool_definition,
    unpaired_tool_messages,
    user,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

TOOL_DEFINITIONS = [tool_definition(LOOK), tool_definition(MOVE)]

#: Turn 1: text plus one call, wrapped in members the library must not keep or send back.
TURN_1 = Reply.completion(
    "Let me look around first.",
    tool_calls=[
        {
            "id": "call-look-1",
            "type": "function",
            "index": 0,
            "provider_extra": {"trace": "abc"},
            "function": {"name": "look", "arguments": '{"radius": 10}', "strict": True},
        }
    ],
    usage=(120, 15),
    extra_message={"reasoning_content": "private chain of thought", "refusal": None},
    extra_top={"system_fingerprint": "fp-1"},
)
#: Turn 2: two calls, arguments exactly as the model wrote them (spaces included).
TURN_2 = calls_reply(
    call("call-move-2", "move", '{"x": 12.5, "y": 40}'),
    call("call-look-3", "look", "{}"),
    usage=(180, 22),
)
FINAL = "I walked to (12.5, 40); there is a fountain to the north-east."
TURN_3 = Reply.completion(FINAL, usage=(240, 12))

OBSERVATIONS = {
    "call-look-1": "a fountain to the north-east",
    "call-move-2": "arrived at (12.5, 40)",
    "call-look-3": "too dark to see",
}


def scripted_executor() -> RecordingExecutor:
    """The executor of the three-turn session: two successes and one plain failure."""
    return RecordingExecutor(
        {
            "call-look-1": Step(outcome=Success(OBSERVATIONS["call-look-1"])),
            "call-move-2": Step(outcome=Success(OBSERVATIONS["call-move-2"])),
            "call-look-3": Step(outcome=Failure(OBSERVATIONS["call-look-3"])),
        }
    )


def expected_histories() -> list[list[dict[str, Any]]]:
    """The messages each of the three requests must carry, in order."""
    first = [system(SYSTEM), user(GOAL)]
    second = [
        *first,
        assistant(("call-look-1", "look", '{"radius": 10}'), text="Let me look around first."),
        tool("call-look-1", OBSERVATIONS["call-look-1"]),
    ]
    third = [
        *second,
        assistant(
            ("call-move-2", "move", '{"x": 12.5, "y": 40}'),
            ("call-look-3", "look", "{}"),
        ),
        tool("call-move-2", OBSERVATIONS["call-move-2"]),
        tool("call-look-3", OBSERVATIONS["call-look-3"]),
    ]
    return [first, second, third]


async def test_three_turn_session_sends_exact_bodies(client_factory: ClientFactory) -> None:
    """Each request carries exactly the history so far and the tools: nothing added or lost.

    Protects: tool calls go back to the model as received minus unknown members (no
    reasoning, no provider fields), each tool message keeps its call's id, the tool
    definitions are the registered ones, and the body names no model.
    """
    executor = scripted_executor()
    async with FakeEndpoint([TURN_1, TURN_2, TURN_3]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        run = await run_loop(loop)

    expected = [
        {"messages": history, "tools": TOOL_DEFINITIONS} for history in expected_histories()
    ]
    assert expected == bodies(ep)
    assert all("model" not in body for body in bodies(ep))
    assert [unpaired_tool_messages(body["messages"]) for body in bodies(ep)] == [[], [], []]
    assert run.result.outcome is Outcome.COMPLETED


async def test_executor_sees_each_validated_call_in_order(client_factory: ClientFactory) -> None:
    """The executor gets every valid call once, in order, with parsed arguments and effect.

    Protects: the executor is given the decoded JSON object (not the raw text), the tool's
    declared effect, the model's call id, and a cancel token; calls run one at a time.
    """
    executor = scripted_executor()
    async with FakeEndpoint([TURN_1, TURN_2, TURN_3]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        await run_loop(loop)

    expected = [
        ("call-look-1", "look", {"radius": 10}, Effect.READ_ONLY),
        ("call-move-2", "move", {"x": 12.5, "y": 40}, Effect.MUTATING),
        ("call-look-3", "look", {}, Effect.READ_ONLY),
    ]
    actual = [(c.id, c.name, dict(c.arguments), c.effect) for c in executor.calls]
    assert expected == actual
    assert (executor.endings) == {
        "call-look-1": "returned",
        "call-move-2": "returned",
        "call-look-3": "returned",
    }
    assert len(ep.requests) == 3


async def test_result_reports_the_whole_session(client_factory: ClientFactory) -> None:
    """The result names the outcome, final text, turns, every call, exact usage and attempts.

    Protects: usage totals add up exactly across turns, the per-request usage records name
    their turn and request id, call records keep status and observation, and the returned
    history is the one the model saw plus its final answer.
    """
    executor = scripted_executor()
    async with FakeEndpoint([TURN_1, TURN_2, TURN_3]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        run = await run_loop(loop)
    result = run.result

    assert result.outcome is Outcome.COMPLETED
    assert result.final_text == FINAL
    assert result.turns == 3
    assert (result.session_id, result.generation) == ("agent-1", 0)
    assert (result.bound, result.cancel_reason, result.error, result.ambiguous_call) == (
        None,
        None,
        None,
        None,
    )
    expected_calls = [
        (1, "call-look-1", "look", "ok", OBSERVATIONS["call-look-1"]),
        (2, "call-move-2", "move", "ok", OBSERVATIONS["call-move-2"]),
        (2, "call-look-3", "look", "failed", OBSERVATIONS["call-look-3"]),
    ]
    actual_calls = [(c.turn, c.call_id, c.name, c.status, c.observation) for c in result.calls]
    assert expected_calls == actual_calls
    assert UsageTotals(540, 49, 589, 3, 0) == result.usage
    expected_records = [
        (1, "agent-1-g0-r1-t1", Usage(120, 15, 135)),
        (2, "agent-1-g0-r1-t2", Usage(180, 22, 202)),
        (3, "agent-1-g0-r1-t3", Usage(240, 12, 252)),
    ]
    actual_records = [(r.turn, r.request_id, r.usage) for r in result.usage_records]
    assert expected_records == actual_records
    assert result.usage_records_dropped == 0
    assert result.attempts == 3
    assert result.compactions == 0
    final_history = [*expected_histories()[2], assistant(text=FINAL)]
    assert final_history == msgspec.json.decode(msgspec.json.encode(list(result.messages)))
    expected_events = [
        "request", "reply", "tool_call", "tool_result",
        "request", "reply", "tool_call", "tool_result", "tool_call", "tool_result",
        "request", "reply", "finish",
    ]  # fmt: skip
    assert expected_events == run.event_kinds
    assert len(ep.requests) == 3


async def test_request_ids_are_deterministic_per_turn(client_factory: ClientFactory) -> None:
    """Every request carries ``X-Request-Id: <session>-g<generation>-t<turn>``.

    Protects: logs on both sides can be joined on the request id, and the id says which
    session, generation and turn sent it.
    """
    async with FakeEndpoint([TURN_1, TURN_2, TURN_3]) as ep:
        loop = make_loop(client_factory(ep.url), scripted_executor())
        await run_loop(loop)

    assert request_ids(ep) == ["agent-1-g0-r1-t1", "agent-1-g0-r1-t2", "agent-1-g0-r1-t3"]


async def test_retried_request_keeps_its_id_and_counts_attempts(
    client_factory: ClientFactory,
) -> None:
    """A transient 503 is retried with the same id and body; the result counts both attempts.

    Protects: ``attempts`` is the sum of HTTP attempts over all turns, and a retry is the
    same request (same ``X-Request-Id``, same bytes), not a new turn.
    """
    script = [Reply.error(503, "busy"), TURN_1, Reply.error(503, "busy"), TURN_3]
    executor = scripted_executor()
    async with FakeEndpoint(script) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        run = await run_loop(loop)

    expected_ids = ["agent-1-g0-r1-t1", "agent-1-g0-r1-t1", "agent-1-g0-r1-t2", "agent-1-g0-r1-t2"]
    assert expected_ids == request_ids(ep)
    assert ep.requests[0].body == ep.requests[1].body
    assert ep.requests[2].body == ep.requests[3].body
    assert run.result.outcome is Outcome.COMPLETED
    assert (run.result.turns, run.result.attempts) == (2, 4)
    assert executor.call_ids == ["call-look-1"]


async def test_usage_totals_stay_exact_beyond_the_kept_records(
    client_factory: ClientFactory,
) -> None:
    """With more requests than ``max_usage_records``, totals stay exact and drops are counted.

    Protects: the per-request records are bounded, but the running totals (and the count of
    requests that reported no usage) never lose a request.
    """
    script = [TURN_1, calls_reply(call("call-look-9", "look", "{}")), TURN_3]
    async with FakeEndpoint(script) as ep:
        loop = make_loop(
            client_factory(ep.url), RecordingExecutor(), config=loop_config(max_usage_records=2)
        )
        run = await run_loop(loop)
    result = run.result

    assert result.outcome is Outcome.COMPLETED
    assert UsageTotals(360, 27, 387, 3, 1) == result.usage
    expected_records = [(2, "agent-1-g0-r1-t2", None), (3, "agent-1-g0-r1-t3", Usage(240, 12, 252))]
    assert expected_records == [(r.turn, r.request_id, r.usage) for r in result.usage_records]
    assert result.usage_records_dropped == 1
    assert len(ep.requests) == 3


async def test_starting_history_is_sent_verbatim(client_factory: ClientFactory) -> None:
    """A whole starting history is sent as given, and the loop's system prompt is not added.

    Protects: a caller resuming a conversation controls exactly what the model sees first,
    earlier tool rounds included.
    """
    history: list[Message] = [
        SystemMessage(content="resumed session"),
        UserMessage(content="where am I?"),
        AssistantMessage(tool_calls=(ToolCall.create("old-1", "look", "{}"),)),
        ToolMessage(tool_call_id="old-1", content="a plaza"),
        UserMessage(content="now walk north"),
    ]
    async with FakeEndpoint([Reply.completion("walking north")]) as ep:
        loop = make_loop(client_factory(ep.url), RecordingExecutor())
        run = await run_loop(loop, history)

    expected = [
        system("resumed session"),
        user("where am I?"),
        assistant(("old-1", "look", "{}")),
        tool("old-1", "a plaza"),
        user("now walk north"),
    ]
    assert [{"messages": expected, "tools": TOOL_DEFINITIONS}] == bodies(ep)
    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.final_text == "walking north"


async def test_reply_with_neither_text_nor_calls_ends_as_empty_reply(
    client_factory: ClientFactory,
) -> None:
    """A reply with no tool calls and no text ends the session as ``empty_reply``.

    Protects: a session never ends "completed" without the model's action summary, and
    nothing is retried or run after such a reply.
    """
    executor = RecordingExecutor()
    async with FakeEndpoint([Reply.completion(None)]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        run = await run_loop(loop)

    assert run.result.outcome is Outcome.EMPTY_REPLY
    assert run.result.error is not None
    assert run.result.error.kind == "empty_reply"
    assert run.result.final_text is None
    assert len(ep.requests) == 1
    assert executor.calls == []


async def test_call_records_carry_their_arguments_bounded(client_factory: ClientFactory) -> None:
    """Each call record shows the arguments text the model sent, cut like an observation.

    Protects: the session's audit trail says what every call was asked to do, including
    rejected calls, without letting a large argument grow the result past its bounds.
    """
    long_args = '{"radius": 5, "note": "' + "é" * 100 + '"}'
    script = [
        calls_reply(call("l-1", "look", '{"radius": 5}'), call("l-2", "look", long_args)),
        Reply.completion("done"),
    ]
    async with FakeEndpoint(script) as ep:
        config = loop_config(max_observation_bytes=64)
        run = await run_loop(make_loop(client_factory(ep.url), RecordingExecutor(), config=config))

    [short, rejected] = run.result.calls
    assert (short.status, short.arguments) == ("ok", '{"radius": 5}')
    assert rejected.status == "rejected"
    assert len(rejected.arguments.encode()) <= 64
    assert rejected.arguments.startswith('{"radius": 5, "note": "é')
    assert rejected.arguments.endswith("[truncated]")
    assert len(ep.requests) == 2
