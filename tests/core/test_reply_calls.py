"""A reply's tool calls are built without running ToolCall's checks a second time, and are
the very calls ``ToolCall.create`` makes.

``decode_reply`` checks each call's id, name and arguments against limits that are never
looser than ToolCall's own, then builds the public call directly; this pins that the
result is indistinguishable from a call built the checked way.
"""

from __future__ import annotations

import copy
import pickle

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from metacrate_grid_agent import OversizedToolCall, ToolCall
from metacrate_grid_agent._core import _wire
from metacrate_grid_agent._core._types import MAX_CALL_ID_LENGTH, MAX_CALL_NAME_LENGTH

IDS = st.text(min_size=1, max_size=MAX_CALL_ID_LENGTH)
NAMES = st.text(min_size=1, max_size=MAX_CALL_NAME_LENGTH)


@settings(max_examples=200, deadline=None)
@given(call_id=IDS, name=NAMES, arguments=st.text(max_size=64))
def test_a_reply_call_is_the_call_create_makes(call_id: str, name: str, arguments: str) -> None:
    """Equal, same type and hash, same JSON, same repr; pickles and copies to an equal call;
    and the model it is copied from is never changed."""
    built = _wire._call(call_id, name, arguments)
    made = ToolCall.create(call_id, name, arguments)
    assert type(built) is ToolCall
    assert built == made
    assert hash(built) == hash(made)
    assert repr(built) == repr(made)
    assert msgspec.json.encode(built) == msgspec.json.encode(made)
    assert pickle.loads(pickle.dumps(built)) == made  # noqa: S301 - our own bytes
    assert copy.copy(built) == made
    assert (built.id, built.name, built.arguments) == (call_id, name, arguments)
    assert ToolCall.create("call", "tool", "{}") == _wire._CALL_MODEL


def test_calls_of_one_reply_are_distinct_objects() -> None:
    """Two calls of one reply are two objects, each with its own members (and a minted id
    keeps its place among given ones)."""
    body = (
        b'{"choices":[{"message":{"tool_calls":['
        b'{"function":{"name":"a","arguments":"{}"}},'
        b'{"id":"c2","function":{"name":"b","arguments":"{\\"x\\":1}"}}]}}]}'
    )
    limits = _wire.ReplyLimits(
        max_text_bytes=1000,
        max_tool_calls=8,
        max_argument_bytes=1000,
        max_id_length=64,
        max_name_length=64,
        mint_missing_call_ids=True,
    )
    reply = _wire.decode_reply(body, limits, request_id="r-1")
    first, second = reply.tool_calls
    assert first is not second
    assert (first.name, first.arguments) == ("a", "{}")
    assert first.id in reply.minted_call_ids
    assert second == ToolCall.create("c2", "b", '{"x":1}')


def test_an_oversized_call_keeps_its_id_its_name_and_the_size_sent() -> None:
    """A call whose arguments were over the bound is an OversizedToolCall that keeps the
    model's id and name and the size it sent (the loop's observation names all three)."""
    built = _wire._call("call-7", "move", 70_000)
    assert type(built) is OversizedToolCall
    assert (built.id, built.name, built.arguments) == ("call-7", "move", "{}")
    assert built.argument_bytes == 70_000


def test_a_one_character_response_id_and_model_are_kept_and_empty_ones_are_absent() -> None:
    """The reply's ``id`` and ``model`` labels are kept from one character up; an empty
    string is no label at all (None), like a missing one."""
    limits = _wire.ReplyLimits(
        max_text_bytes=4096,
        max_tool_calls=8,
        max_argument_bytes=4096,
        max_id_length=64,
        max_name_length=64,
        mint_missing_call_ids=True,
    )
    message = b'"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]'
    short = _wire.decode_reply(b'{"id":"r","model":"m",' + message + b"}", limits, request_id="s")
    assert (short.response_id, short.response_model) == ("r", "m")
    empty = _wire.decode_reply(b'{"id":"","model":"",' + message + b"}", limits, request_id="s")
    assert (empty.response_id, empty.response_model) == (None, None)
