"""The CLI's sandbox region (world, tools, executor) and the scripted model's decisions.

Everything here is in-process and deterministic: the world's actions are synchronous, and
the scripted model decides from a request body alone.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import (
    CancelToken,
    Effect,
    Failure,
    LLMClient,
    LLMConfig,
    Secret,
    Success,
    ToolLoop,
    ValidatedCall,
)
from metacrate_grid_agent.cli._sandbox import (
    GRID_SIZE,
    SandboxWorld,
    build_sandbox,
    sandbox_tools,
)
from metacrate_grid_agent.cli._scripted_model import (
    DISCLAIMER,
    FALLBACK_TARGET,
    INVALID_MOVE_ARGUMENTS,
    ScriptedTurn,
    decide,
    respond,
)
from metacrate_grid_agent.testing import RecordedRequest

if TYPE_CHECKING:
    from collections.abc import Mapping

TOOL_NAMES = ["look_around", "inspect", "move_to", "say", "give"]
REJECTION = "the arguments for move_to do not match its parameters schema"


# --- the world ----------------------------------------------------------------------------------


def test_look_around_lists_nearby_things_with_positions() -> None:
    """look_around names the avatar's cell and every nearby thing, nearest first; far ones
    are only counted."""
    outcome = SandboxWorld().look_around()
    assert outcome == Success(
        "You are Scout at (20, 20). Objects nearby: lamp at (22, 21), 2 away; sign at "
        "(19, 24), 4 away; crate at (26, 18), 6 away. Avatars nearby: Ada at (23, 23), 3 "
        "away. 2 more thing(s) are further than 8 cells away."
    )


def test_inspect_reads_the_sign_and_refuses_far_or_unknown_things() -> None:
    """inspect reads a sign out; a far thing or an unknown name is a Failure."""
    world = SandboxWorld()
    sign = world.inspect("Sign")
    assert isinstance(sign, Success)
    assert 'It reads: "Welcome to Metacrate Plaza.' in sign.observation
    assert world.inspect("Ada") == Success(
        "Ada at (23, 23): an avatar in a green coat, waving. Holding: nothing."
    )
    far = world.inspect("fountain")
    assert isinstance(far, Failure)
    assert "too far" in far.observation
    unknown = world.inspect("x" * 500)
    assert isinstance(unknown, Failure)
    assert len(unknown.observation) < 200  # the echoed name is bounded


def test_move_to_walks_to_free_cells_only() -> None:
    """move_to changes the position on a free cell; a taken or outside cell leaves it."""
    world = SandboxWorld()
    assert world.move_to(19, 23) == Success("You walked from (20, 20) to (19, 23).")
    assert (world.x, world.y) == (19, 23)
    assert world.move_to(19, 24) == Failure("(19, 24) is taken by sign; choose a free cell")
    assert isinstance(world.move_to(GRID_SIZE, 0), Failure)
    assert world.move_to(19, 23) == Success("You are already at (19, 23).")
    assert (world.x, world.y) == (19, 23)


def test_say_logs_chat_and_names_the_hearers() -> None:
    """say appends to the chat log (whitespace collapsed) and names nearby avatars."""
    world = SandboxWorld()
    assert world.say("  hello\n  there ") == Success('You said: "hello there" Heard by: Ada.')
    assert [(c.speaker, c.text) for c in world.chat] == [("Scout", "hello there")]
    assert world.say("   ") == Failure("say needs some text")
    world.move_to(60, 60)
    assert world.say("anyone?") == Success('You said: "anyone?" Heard by: nobody nearby.')


def test_give_needs_the_item_and_an_avatar_in_reach() -> None:
    """give moves an item to an avatar within reach; otherwise nothing changes."""
    world = SandboxWorld()
    far = world.give("apple", "Ada")
    assert isinstance(far, Failure)
    assert "3 cells away" in far.observation
    world.move_to(22, 23)
    assert isinstance(world.give("sword", "Ada"), Failure)
    assert isinstance(world.give("apple", "lamp"), Failure)
    assert world.give("Apple", "ada") == Success("You gave the apple to Ada.")
    assert world.inventory == ["map"]
    assert world.things["ada"].holding == ["apple"]


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("fly", {}),
        ("move_to", {"x": "north"}),
        ("move_to", {"x": True, "y": 1}),
        ("move_to", {"x": 1, "y": 64}),
        ("inspect", {}),
        ("say", {"text": 3}),
        ("give", {"item": "apple"}),
    ],
)
def test_apply_refuses_unknown_tools_and_bad_arguments(
    name: str, arguments: Mapping[str, Any]
) -> None:
    """The world does not trust its caller: bad input is a Failure and changes nothing."""
    world = SandboxWorld()
    assert isinstance(world.apply(name, arguments), Failure)
    assert world == SandboxWorld()


# --- tools and executor ------------------------------------------------------------------------


def test_tool_definitions_are_strict_and_accepted_by_the_tool_loop() -> None:
    """Every tool has a strict object schema; move_to bounds x and y to the grid; the
    library's tool loop registers them all."""
    tools = sandbox_tools()
    assert [t.name for t in tools] == TOOL_NAMES
    assert [t.effect for t in tools] == [Effect.READ_ONLY] * 2 + [Effect.MUTATING] * 3
    for tool in tools:
        assert tool.parameters["type"] == "object"
        assert tool.parameters["additionalProperties"] is False
        assert sorted(tool.parameters["required"]) == sorted(tool.parameters["properties"])
    move = tools[2].parameters["properties"]
    assert move["x"] == {"type": "integer", "minimum": 0, "maximum": GRID_SIZE - 1}
    assert tools[3].parameters["properties"]["text"]["maxLength"] == 500
    config = LLMConfig(endpoint_url="http://127.0.0.1:9/v1", api_key=Secret("unused-key"))
    _, executor = build_sandbox()
    loop = ToolLoop(LLMClient(config), tools, executor)  # no request is ever sent
    assert [d.name for d in loop.registry.definitions] == TOOL_NAMES


def test_executor_runs_calls_and_refuses_after_cancellation() -> None:
    """The executor applies each validated call to its world, and refuses (untouched) once
    the session's token is cancelled."""
    _, executor = build_sandbox()
    move = ValidatedCall(
        id="c1", name="move_to", arguments={"x": 5, "y": 6}, effect=Effect.MUTATING
    )
    token = CancelToken()

    async def scenario() -> tuple[object, object]:
        first = await executor.execute(move, token)
        token.cancel("operator")
        second = await executor.execute(
            ValidatedCall(id="c2", name="say", arguments={"text": "hi"}, effect=Effect.MUTATING),
            token,
        )
        return first, second

    first, second = asyncio.run(scenario())
    assert first == Success("You walked from (20, 20) to (5, 6).")
    assert second == Failure("not run: the session was cancelled (operator)")
    assert [c.id for c in executor.calls] == ["c1"]
    assert executor.world.chat == []


# --- the scripted model -----------------------------------------------------------------------


def body(messages: list[dict[str, Any]], *, tools: bool = True) -> dict[str, Any]:
    definitions = [{"type": "function", "function": {"name": t.name}} for t in sandbox_tools()]
    return {"messages": messages, **({"tools": definitions} if tools else {})}


def reply_messages(turn: ScriptedTurn, observations: list[str]) -> list[dict[str, Any]]:
    """The assistant message for ``turn`` and one tool message per call."""
    calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
        for i, n, a in turn.tool_calls
    ]
    messages: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": calls}]
    for (call_id, _, _), text in zip(turn.tool_calls, observations, strict=True):
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
    return messages


def test_scripted_model_plays_its_five_steps() -> None:
    """look_around, one invalid move_to, a valid move next to the sign, say, then a summary
    naming what happened and that the model is scripted; every call id is new."""
    world = SandboxWorld()
    history: list[dict[str, Any]] = [{"role": "user", "content": "Explore."}]
    turns: list[ScriptedTurn] = []
    for _ in range(4):
        turn = decide(body(history))
        assert turn.text is None
        ((_, name, arguments),) = turn.tool_calls
        if arguments == INVALID_MOVE_ARGUMENTS:
            observation = REJECTION
        else:
            observation = world.apply(name, json.loads(arguments)).observation
        history += reply_messages(turn, [observation])
        turns.append(turn)
    names = [t.tool_calls[0][1] for t in turns]
    assert names == ["look_around", "move_to", "move_to", "say"]
    assert turns[1].tool_calls[0][2] == '{"x": "north"}'
    assert json.loads(turns[2].tool_calls[0][2]) == {"x": 19, "y": 23}
    ids = [t.tool_calls[0][0] for t in turns]
    assert len(set(ids)) == len(ids)
    final = decide(body(history))
    assert final.tool_calls == ()
    assert final.text is not None
    assert "saw lamp, sign, crate, Ada" in final.text
    assert f"was rejected: {REJECTION}" in final.text
    assert "You walked from (20, 20) to (19, 23)." in final.text
    assert final.text.endswith(DISCLAIMER)
    assert (world.x, world.y) == (19, 23)


def test_scripted_model_falls_back_without_the_sign() -> None:
    """When look_around reported no sign, the valid move goes to the fallback cell."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Go."}]
    history += reply_messages(decide(body(history)), ["Nothing here."])
    history += reply_messages(decide(body(history)), [REJECTION])
    _, name, arguments = decide(body(history)).tool_calls[0]
    assert (name, json.loads(arguments)) == (
        "move_to",
        dict(zip("xy", FALLBACK_TARGET, strict=True)),
    )


def test_scripted_model_without_its_tools_only_talks() -> None:
    """Without the sandbox tools offered (a probe, say) it answers with text, disclaimer
    included."""
    turn = decide(body([{"role": "user", "content": "Hi"}], tools=False))
    assert turn.tool_calls == ()
    assert turn.text is not None
    assert DISCLAIMER in turn.text


def test_respond_is_deterministic_and_refuses_non_json() -> None:
    """The fake-endpoint responder gives the same reply to the same request, and a 400 to a
    body that is not a JSON object."""

    def request(data: bytes) -> RecordedRequest:
        return RecordedRequest(
            method="POST",
            target="/v1/chat/completions",
            http_version="HTTP/1.1",
            headers=(),
            body=data,
            connection_id=0,
            index=0,
        )

    payload = json.dumps(body([{"role": "user", "content": "Explore."}])).encode()
    first, second = respond(request(payload)), respond(request(payload))
    assert first == second
    assert first.status == 200
    sent = json.loads(first.body)
    assert sent["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "look_around"
    assert sent["usage"]["prompt_tokens"] == len(payload) // 4
    assert respond(request(b"not json")).status == 400
    assert respond(request(b"[1, 2]")).status == 400
