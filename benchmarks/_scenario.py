"""The requests and tools every contender sends: one realistic request and one loop scenario.

The realistic request is what an avatar sends mid-session: a system prompt, 12 messages
(user turns, assistant tool calls, tool results) and 8 tools. Each contender sends the same
content: ours as typed messages, the raw clients as the bytes ours encodes, the SDK as dicts.
"""

from __future__ import annotations

from typing import Any, Final

from metacrate_grid_agent import (
    AssistantMessage,
    FunctionCall,
    FunctionDefinition,
    Message,
    SystemMessage,
    ToolCall,
    ToolDefinition,
    UserMessage,
)
from metacrate_grid_agent._core._request import encode_request
from metacrate_grid_agent._core._types import ToolMessage

SYSTEM_PROMPT: Final = (
    "You are Ada, a friendly guide avatar in the Lumen region of a virtual world. You help "
    "visitors find places, answer questions about the region's history and events, and move "
    "around to show them things. Keep answers short and concrete. Use the tools to look "
    "around before you claim anything about the world, and never promise what a tool cannot "
    "do. If a visitor asks for something outside the region, say so politely."
)


def _schema(**properties: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
        "additionalProperties": False,
    }


TOOL_SPECS: Final = (
    ("move_to", "Walk the avatar to a point in the region.", _schema(x="integer", y="integer")),
    ("look", "Describe what the avatar sees in one direction.", _schema(direction="string")),
    ("say", "Say something in local chat.", _schema(text="string")),
    ("find_object", "Find the nearest object with this name.", _schema(name="string")),
    ("touch", "Touch an object by its id.", _schema(object_id="string")),
    ("sit", "Sit on an object by its id.", _schema(object_id="string")),
    ("teleport", "Teleport to a named landmark in the region.", _schema(landmark="string")),
    ("give", "Give an inventory item to a visitor.", _schema(item="string", visitor="string")),
)
TOOLS: Final = tuple(
    ToolDefinition(function=FunctionDefinition(name=name, description=text, parameters=parameters))
    for name, text, parameters in TOOL_SPECS
)


def _call(call_id: str, name: str, arguments: str) -> ToolCall:
    return ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))


MESSAGES: Final[tuple[Message, ...]] = (
    SystemMessage(content=SYSTEM_PROMPT),
    UserMessage(content="Hi Ada! Where is the old lighthouse?"),
    AssistantMessage(tool_calls=(_call("call_a", "find_object", '{"name":"lighthouse"}'),)),
    ToolMessage(tool_call_id="call_a", content="lighthouse (id 7f3a) at x=120, y=48, 60 m north"),
    AssistantMessage(content="It is about 60 m north of us, on the cliff. Shall we walk there?"),
    UserMessage(content="Yes please, and tell me about it on the way."),
    AssistantMessage(
        tool_calls=(
            _call("call_b", "move_to", '{"x":120,"y":44}'),
            _call("call_c", "say", '{"text":"Follow me!"}'),
        )
    ),
    ToolMessage(tool_call_id="call_b", content="arrived at x=120, y=44"),
    ToolMessage(tool_call_id="call_c", content="said in local chat"),
    AssistantMessage(
        content="Here we are. The lighthouse was the first build in Lumen; its lamp still "
        "turns every evening at sunset, region time."
    ),
    UserMessage(content="Can I go inside? And is the lamp on right now?"),
    AssistantMessage(tool_calls=(_call("call_d", "look", '{"direction":"north"}'),)),
    ToolMessage(tool_call_id="call_d", content="a door (id 9b1c), closed; the lamp is dark"),
)
BODY: Final = encode_request(MESSAGES, TOOLS)


def sdk_messages() -> list[dict[str, Any]]:
    """The same messages as the OpenAI SDK takes them."""
    result: list[dict[str, Any]] = []
    for message in MESSAGES:
        if isinstance(message, AssistantMessage) and message.tool_calls:
            result.append(
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {
                                "name": call.function.name,
                                "arguments": call.function.arguments,
                            },
                        }
                        for call in message.tool_calls
                    ],
                }
            )
        elif isinstance(message, ToolMessage):
            result.append(
                {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
            )
        else:
            result.append({"role": message.__struct_config__.tag, "content": message.content})
    return result


def sdk_tools() -> list[dict[str, Any]]:
    """The same tools as the OpenAI SDK takes them."""
    return [
        {
            "type": "function",
            "function": {"name": name, "description": text, "parameters": parameters},
        }
        for name, text, parameters in TOOL_SPECS
    ]


#: The loop scenario: tool turns (each with two calls of move_to), then a final reply.
LOOP_TOOL_TURNS: Final = 10
LOOP_GOAL: Final = "Walk next to the lamp, in small steps."
MOVE_TO_SCHEMA: Final = _schema(x="integer", y="integer")
