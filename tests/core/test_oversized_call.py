"""A tool call over ``max_argument_bytes`` decodes as a dropped call, not a reply error."""

from __future__ import annotations

import dataclasses
import json
import pickle

import msgspec

from metacrate_grid_agent import OversizedToolCall
from metacrate_grid_agent._core._wire import ReplyLimits, decode_reply
from metacrate_grid_agent.config import LLMConfig, Secret

LIMITS = dataclasses.replace(
    ReplyLimits.from_config(
        LLMConfig(endpoint_url="https://llm.example/v1/chat/completions", api_key=Secret("k"))
    ),
    max_argument_bytes=10,
)


def test_an_oversized_argument_decodes_as_a_dropped_call() -> None:
    """Its id, name and size are kept, its arguments replaced by ``"{}"``; it encodes as a
    plain wire tool call (no extra member) and pickles with its size. Its neighbours are
    decoded as usual.
    """
    arguments = '{"a":"' + "é" * 10 + '"}'
    message = {
        "role": "assistant",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": arguments}},
            {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ],
    }
    body = json.dumps({"choices": [{"index": 0, "message": message}]}).encode()
    reply = decode_reply(body, LIMITS, request_id="r-1")
    dropped, kept = reply.tool_calls
    assert isinstance(dropped, OversizedToolCall)
    assert not isinstance(kept, OversizedToolCall)
    assert (dropped.id, dropped.name, dropped.arguments) == ("a", "f", "{}")
    assert dropped.argument_bytes == len(arguments.encode())
    assert msgspec.json.decode(msgspec.json.encode(dropped)) == {
        "id": "a",
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }
    again = pickle.loads(pickle.dumps(dropped))  # noqa: S301 - our own bytes
    assert (type(again), again.argument_bytes) == (OversizedToolCall, dropped.argument_bytes)
