"""The structs a session makes every turn are not tracked by the garbage collector.

At thousands of sessions each full pass of the collector walks every tracked object of every
live session; the messages of a history and the machine's per-action decisions hold no
reference cycle (frozen, holding only strings, numbers and tuples of such structs), so they
are built untracked and the passes do not walk them.
"""

from __future__ import annotations

import gc

import pytest

from metacrate_grid_agent import (
    AssistantMessage,
    Effect,
    FunctionCall,
    ImagePart,
    ImageURL,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
    ValidatedCall,
)
from metacrate_grid_agent._core._loop import CallModel, RunTool

CALL = ToolCall.create("c-1", "look", "{}")
UNTRACKED = {
    "system": SystemMessage(content="be brief"),
    "user": UserMessage(content="hello"),
    "user_parts": UserMessage(
        content=(TextPart(text="see"), ImagePart(image_url=ImageURL(url="https://a.example/i.png")))
    ),
    "assistant": AssistantMessage(content="ok", tool_calls=(CALL,)),
    "tool": ToolMessage(tool_call_id="c-1", content="seen"),
    "function_call": FunctionCall(name="look", arguments="{}"),
    "usage": Usage(1, 2, 3),
    "call_model": CallModel(messages=(UserMessage(content="hi"),), request_id="r-1", turn=1),
    "run_tool": RunTool(
        call=ValidatedCall(id="c-1", name="look", arguments={}, effect=Effect.READ_ONLY),
        timeout_s=1.0,
        turn=1,
    ),
}


@pytest.mark.parametrize("name", sorted(UNTRACKED))
def test_per_turn_structs_are_not_tracked(name: str) -> None:
    """Each message kind, its parts, usage and the machine's decisions are untracked.

    Protects: the collector's full passes do not grow with the messages and decisions of
    every live session (item: CPU per turn at 10,000 sessions).
    """
    assert not gc.is_tracked(UNTRACKED[name])
