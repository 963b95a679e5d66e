"""The content attributes stay valid JSON within their bound, whatever the text: escapes
that grow it, many parts, a bound at its minimum."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from metacrate_grid_agent import (
    AssistantMessage,
    FunctionCall,
    Message,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from metacrate_grid_agent._core._redact import bounded_text
from metacrate_grid_agent.otel._content import input_messages


def _cut(text: str, limit: int) -> str:
    return bounded_text(text, limit)


def _label(text: str) -> str:
    return bounded_text(text, 256)


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.text(max_size=400), min_size=1, max_size=40),
    limit=st.sampled_from([64, 256, 4096]),
)
def test_input_messages_parse_and_fit_whatever_the_text(texts: list[str], limit: int) -> None:
    """Any history (quotes, backslashes, control characters, any code point, many
    messages) gives ``gen_ai.input.messages`` that parses and is within the bound."""
    history: list[Message] = []
    for n, text in enumerate(texts):
        call = ToolCall(id=f"c{n}", function=FunctionCall(name="look", arguments=text or "{}"))
        history += [
            UserMessage(content=text or "?"),
            AssistantMessage(content=None, tool_calls=(call,)),
            ToolMessage(tool_call_id=f"c{n}", content=text or "?"),
        ]
    text = input_messages(history, _cut, _label, limit)
    assert isinstance(json.loads(text), list)
    assert len(text.encode()) <= limit
