"""Content as the GenAI conventions' JSON attributes: each part redacted and cut, then the
whole serialised, so every attribute stays valid JSON within its bound.

``cut(text, limit)`` redacts then bounds one text (the sink's, redacting each text once);
``label(text)`` redacts and bounds an endpoint-controlled identifier.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from metacrate_grid_agent import (
    AssistantMessage,
    Completion,
    ImagePart,
    SystemMessage,
    TextPart,
    ToolDefinition,
    ToolMessage,
)

if TYPE_CHECKING:
    from metacrate_grid_agent import Message

__all__ = [
    "bounded_json",
    "input_messages",
    "output_messages",
    "system_instructions",
    "tool_definitions",
]

#: Smallest share of the content bound one part of a JSON content attribute is cut to,
#: before parts are dropped instead (a part cut shorter says nothing).
MIN_PART_BYTES: Final = 16

Cut = Callable[[str, int], str]
Label = Callable[[str], str]


def bounded_json(build: Callable[[int, int], object], count: int, limit: int) -> str:
    """The JSON of ``build(part_bytes, keep)`` within ``limit`` bytes: always valid JSON.

    ``build`` bounds each text part to ``part_bytes`` and keeps ``keep`` of the ``count``
    parts; the JSON itself is never cut. The share halves until the whole fits (down to
    ``MIN_PART_BYTES``), then parts are left out until it does.
    """
    part_bytes, keep = limit, count
    while True:
        text = json.dumps(build(part_bytes, keep), ensure_ascii=False)
        if len(text.encode()) <= limit:
            return text
        if part_bytes > MIN_PART_BYTES:
            part_bytes = max(MIN_PART_BYTES, part_bytes // 2)
        elif keep > 0:
            keep = min(keep - 1, keep * 3 // 4)  # a quarter at a time: few passes, any size
        else:
            return "[]"


def _text_parts(content: str | Sequence[Any] | None, cut: Cut, limit: int) -> list[Any]:
    """Content as the conventions' parts: text (cut), an image named but not copied."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": cut(content, limit)}]
    parts: list[Any] = []
    for part in content:
        if isinstance(part, TextPart):
            parts.append({"type": "text", "content": cut(part.text, limit)})
        elif isinstance(part, ImagePart):
            parts.append({"type": "uri", "modality": "image"})
    return parts


def _message(message: Message, cut: Cut, label: Label, limit: int) -> Any:
    """One non-system message in the conventions' input message shape."""
    if isinstance(message, ToolMessage):
        response = message.content
        if not isinstance(response, str):
            response = "".join(p.text for p in response)
        parts: list[Any] = [{"type": "tool_call_response", "id": label(message.tool_call_id),
                             "response": cut(response, limit)}]  # fmt: skip
        return {"role": "tool", "parts": parts}
    parts = _text_parts(message.content, cut, limit)
    if isinstance(message, AssistantMessage):
        parts.extend(
            {
                "type": "tool_call",
                "id": label(call.id),
                "name": label(call.function.name),
                "arguments": cut(call.function.arguments, limit),
            }
            for call in message.tool_calls
        )
        return {"role": "assistant", "parts": parts}
    return {"role": "user", "parts": parts}


def input_messages(messages: Sequence[Message], cut: Cut, label: Label, limit: int) -> str:
    """``gen_ai.input.messages``: every message but the system ones, the most recent kept."""
    others = [m for m in messages if not isinstance(m, SystemMessage)]

    def build(part_bytes: int, keep: int) -> object:
        kept = others[len(others) - keep :] if keep else []
        return [_message(m, cut, label, part_bytes) for m in kept]

    return bounded_json(build, len(others), limit)


def system_instructions(messages: Sequence[Message], cut: Cut, limit: int) -> str:
    """``gen_ai.system_instructions``: the parts of the system messages."""
    system = [m for m in messages if isinstance(m, SystemMessage)]

    def build(part_bytes: int, keep: int) -> object:
        return [p for m in system for p in _text_parts(m.content, cut, part_bytes)][:keep]

    return bounded_json(build, sum(1 if isinstance(m.content, str) else len(m.content)
                                   for m in system), limit)  # fmt: skip


def tool_definitions(tools: Sequence[ToolDefinition], cut: Cut, label: Label, limit: int) -> str:
    """``gen_ai.tool.definitions``: each tool's name, description and (whole, when it fits
    and redaction changes nothing) parameters schema."""

    def build(part_bytes: int, keep: int) -> object:
        out: list[Any] = []
        for tool in tools[:keep]:
            function = tool.function
            entry: dict[str, Any] = {
                "type": "function",
                "name": label(function.name),
                "description": cut(function.description, part_bytes),
            }
            parameters = json.dumps(function.parameters, ensure_ascii=False)
            if cut(parameters, part_bytes) == parameters:
                entry["parameters"] = function.parameters
            out.append(entry)
        return out

    return bounded_json(build, len(tools), limit)


def output_messages(completion: Completion, cut: Cut, label: Label, limit: int) -> str:
    """``gen_ai.output.messages``: the reply's text and tool calls, and its finish reason."""
    calls = completion.tool_calls
    finish = None if completion.finish_reason is None else label(completion.finish_reason)

    def build(part_bytes: int, keep: int) -> object:
        parts: list[dict[str, Any]] = []
        if completion.text is not None:
            parts.append({"type": "text", "content": cut(completion.text, part_bytes)})
        parts.extend(
            {
                "type": "tool_call",
                "id": label(call.id),
                "name": label(call.name),
                "arguments": cut(call.arguments, part_bytes),
            }
            for call in calls
        )
        return [{"role": "assistant", "parts": parts[:keep], "finish_reason": finish}]

    return bounded_json(build, len(calls) + (completion.text is not None), limit)
