"""``HistoryEncoder``: a session's request bodies, each message encoded once.

The property that matters: for any succession of histories (grown by a turn, compacted,
rewritten), every body is byte for byte what :func:`encode_request` makes of the same
history. Then what it spares: a message already sent (or one equal to it: the same type,
its fields equal) at the same place of the history is not encoded again; anything else is.
And what it holds: at most the last request's messages and their bytes.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metacrate_grid_agent._core._request import HistoryEncoder, encode_request, encode_tools
from metacrate_grid_agent._core._types import (
    AssistantMessage,
    ImagePart,
    Message,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)
from metacrate_grid_agent.errors import InvalidMessageError

TOOLS = (
    ToolDefinition.create("look", "Look around.", {"type": "object"}),
    ToolDefinition.create("move_to", "Walk.", {"type": "object", "required": ["x"]}),
)

_text = st.text(max_size=12)
_parts = st.tuples(st.builds(TextPart, text=_text)).map(tuple)
_call = st.builds(ToolCall.create, st.sampled_from(["c1", "c2", "c/3"]), st.just("look"), _text)
_messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(SystemMessage, content=_text | _parts),
    st.builds(UserMessage, content=_text),
    st.builds(
        UserMessage,
        content=st.tuples(st.builds(TextPart, text=_text), st.just(ImagePart.of("https://a/b"))),
    ),
    st.builds(AssistantMessage, content=_text),
    st.builds(
        AssistantMessage,
        content=st.none() | _text,
        tool_calls=st.lists(_call, min_size=1).map(tuple),
    ),
    st.builds(ToolMessage, tool_call_id=st.just("c1"), content=_text | _parts),
)


@st.composite
def _sessions(draw: st.DrawFn) -> list[list[Message]]:
    """Successive histories of one session: each the last one grown, edited or rewritten."""
    history = draw(st.lists(_messages, max_size=6))
    requests = [list(history)]
    for _ in range(draw(st.integers(1, 6))):
        step = draw(st.sampled_from(["grow", "grow", "replace", "compact", "rewrite", "same"]))
        if step == "grow":
            history = history + draw(st.lists(_messages, min_size=1, max_size=3))
        elif step == "replace" and history:
            at = draw(st.integers(0, len(history) - 1))
            history = [*history[:at], draw(_messages), *history[at + 1 :]]
        elif step == "compact" and history:
            start = draw(st.integers(0, len(history) - 1))
            end = draw(st.integers(start, len(history)))
            summary = [UserMessage(content="summary")]
            history = [*history[:start], *summary, *history[end:]]
        elif step == "rewrite":
            history = draw(st.lists(_messages, max_size=6))
        requests.append(list(history))
    return requests


@given(requests=_sessions(), tools=st.sampled_from([(), TOOLS, list(TOOLS)]))
def test_every_body_is_the_one_encode_request_makes(
    requests: list[list[Message]], tools: tuple[ToolDefinition, ...]
) -> None:
    """Grown, edited, compacted or rewritten between requests, each history encodes to the
    same bytes as encoding it whole; with the tools spliced in as JSON too."""
    encoder = HistoryEncoder()
    for history in requests:
        assert encoder.encode(history, tools) == encode_request(history, tools)
        spliced = encoder.encode(tuple(history), tools, tools_json=encode_tools(tools))
        assert spliced == encode_request(history, tools)


def test_a_turn_encodes_only_what_is_new() -> None:
    """The messages already sent are not encoded again: a turn costs what it adds."""
    encoder = HistoryEncoder()
    history: list[Message] = [SystemMessage(content="Be brief."), UserMessage(content="Hi")]
    encoder.encode(history, TOOLS)
    assert encoder.encoded == 2
    call = ToolCall.create("c1", "look", "{}")
    history += [AssistantMessage(tool_calls=(call,)), ToolMessage(tool_call_id="c1", content="ok")]
    encoder.encode(history, TOOLS)
    assert encoder.encoded == 4
    encoder.encode(history, TOOLS)  # the same history again: nothing new
    assert encoder.encoded == 4


def test_a_replaced_message_is_encoded_again_from_where_it_changed() -> None:
    """A message replaced by a different one is encoded again, and so is every message after
    it; the prefix before it is kept. One replaced by an equal message (another object of
    the same type, its fields equal) is reused: a message's fields are strings, None and
    tuples of frozen parts, so equal messages encode to the same bytes, and the body is
    still the one :func:`encode_request` makes of the new history."""
    first = [UserMessage(content="a"), UserMessage(content="b"), UserMessage(content="c")]
    encoder = HistoryEncoder()
    encoder.encode(first, ())
    changed = [first[0], UserMessage(content="B"), first[2]]
    assert encoder.encode(changed, ()) == encode_request(changed, ())
    assert encoder.encoded == 3 + 2
    equal = [UserMessage(content="a"), UserMessage(content="B"), UserMessage(content="c")]
    assert encoder.encode(equal, ()) == encode_request(equal, ())
    assert encoder.encoded == 5
    # Equal up to a changed message: the equal prefix is kept, the rest encoded again.
    edited = [UserMessage(content="a"), UserMessage(content="b"), UserMessage(content="c")]
    assert encoder.encode(edited, ()) == encode_request(edited, ())
    assert encoder.encoded == 5 + 2


class _Subclass(UserMessage, frozen=True):
    """A user message of another type: the same fields, the same wire shape."""


class _Shouted(UserMessage, frozen=True, tag="shouted"):
    """A user message of another type: the same fields, another role on the wire."""


@pytest.mark.parametrize(
    "replacement",
    [
        _Subclass(content="b"),
        _Shouted(content="b"),
        SystemMessage(content="b"),
        AssistantMessage(content="b"),
    ],
    ids=["subclass", "subclass-other-role", "system", "assistant"],
)
def test_a_message_of_another_type_with_the_same_fields_is_encoded_again(
    replacement: Message,
) -> None:
    """Reuse asks for the exact type as well as equal fields: a subclass instance or another
    message type holding the same fields is not the message sent (it may encode to other
    bytes: another role), so it and what follows it are encoded again."""
    sent: list[Message] = [SystemMessage(content="s"), UserMessage(content="b")]
    encoder = HistoryEncoder()
    encoder.encode([*sent, UserMessage(content="c")], ())
    history = [sent[0], replacement, UserMessage(content="c")]
    assert encoder.encode(history, ()) == encode_request(history, ())
    assert encoder.encoded == 3 + 2


def test_messages_cannot_change_under_the_encoder() -> None:
    """Reuse by identity is safe because a message is frozen all the way down."""
    message = AssistantMessage(content="x", tool_calls=(ToolCall.create("c1", "look", "{}"),))
    with pytest.raises(AttributeError):
        message.content = "y"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        message.tool_calls[0].function.arguments = "{}"  # type: ignore[misc]
    parts = UserMessage(content=(TextPart(text="t"),))
    assert isinstance(parts.content, tuple)


def test_a_mutable_message_is_encoded_every_time() -> None:
    """Anything but our frozen message types (a dict, say) is never reused: a change made to
    it between requests is sent."""
    message: dict[str, str] = {"role": "user", "content": "before"}
    history: list[object] = [message]
    encoder = HistoryEncoder()
    assert b'"before"' in encoder.encode(history, ())  # type: ignore[arg-type]
    message["content"] = "after"
    body = encoder.encode(history, ())  # type: ignore[arg-type]
    assert body == encode_request(history, ())  # type: ignore[arg-type]
    assert b'"after"' in body


def test_it_holds_only_the_last_request() -> None:
    """After a compaction it holds the shorter history, not every message it ever saw."""
    encoder = HistoryEncoder()
    long = [UserMessage(content=str(i)) for i in range(50)]
    encoder.encode(long, ())
    short = [UserMessage(content="summary"), long[-1]]
    encoder.encode(short, ())
    assert len(encoder) == 2


def test_a_value_that_is_not_json_fails_as_encode_request_fails_and_leaves_it_usable() -> None:
    """The same error as :func:`encode_request`; the encoder then holds nothing, and the
    next request encodes correctly."""
    bad: object = {"role": "user", "content": object()}
    good = [UserMessage(content="hi")]
    encoder = HistoryEncoder()
    encoder.encode(good, ())
    with pytest.raises(InvalidMessageError) as caught:
        encoder.encode([*good, bad], ())  # type: ignore[list-item]
    with pytest.raises(InvalidMessageError) as expected:
        encode_request([*good, bad], ())  # type: ignore[list-item]
    assert str(caught.value) == str(expected.value)
    assert len(encoder) == 0  # it holds nothing after the failure, not even the good prefix
    later = [*good, UserMessage(content="again")]
    assert encoder.encode(later, ()) == encode_request(later, ())


def test_the_body_is_the_compact_wire_shape() -> None:
    """Pinned bytes: messages alone without tools, then the tools member."""
    encoder = HistoryEncoder()
    hi = [UserMessage(content="hi")]
    assert encoder.encode(hi, ()) == b'{"messages":[{"role":"user","content":"hi"}]}'
    assert encoder.encode([], ()) == b'{"messages":[]}'
    tools = (ToolDefinition.create("f", "", {"type": "object"}),)
    assert encoder.encode(hi, tools) == (
        b'{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",'
        b'"function":{"name":"f","parameters":{"type":"object"}}}]}'
    )
    assert msgspec.json.decode(encoder.encode(hi, tools))["messages"][0]["content"] == "hi"


def test_tools_that_are_not_json_fail_as_encode_request_fails() -> None:
    """A tool schema holding a non-JSON value: the same error, and nothing kept from it."""
    tools = (ToolDefinition.create("f", "", {"default": object()}),)
    hi = [UserMessage(content="hi")]
    encoder = HistoryEncoder()
    with pytest.raises(InvalidMessageError, match="cannot be serialised"):
        encoder.encode(hi, tools)
    assert len(encoder) == 0
    assert encoder.encode(hi, TOOLS) == encode_request(hi, TOOLS)


class _Incomparable:
    """A foreign object in a history whose own ``__eq__`` raises (as an array's truth does)."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("the truth value of this comparison is ambiguous")

    __hash__ = object.__hash__


@pytest.mark.parametrize("where", [0, 1])
def test_a_foreign_object_whose_comparison_raises_fails_as_encode_request_fails(
    where: int,
) -> None:
    """The prefix check compares by equality: an object in the new history whose own
    ``__eq__`` raises is not the check's error to pass on. The request fails as
    :func:`encode_request` fails on it (a typed ``InvalidMessageError``), and the encoder is
    left usable, whether the object stands where the held prefix is compared in one list
    comparison or where the pass that finds the parting point reaches it."""
    first = [UserMessage(content="a"), UserMessage(content="b"), UserMessage(content="c")]
    encoder = HistoryEncoder()
    encoder.encode(first, ())
    # At 0: the held three against the first three. At 1 in a shorter history: the lengths
    # differ, so the pass that finds the parting point compares item by item and reaches it.
    history: list[object] = list(first) if where == 0 else list(first[:2])
    history[where] = _Incomparable()
    with pytest.raises(InvalidMessageError):
        encode_request(history, ())  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError):
        encoder.encode(history, ())  # type: ignore[arg-type]
    assert encoder.encode(first, ()) == encode_request(first, ())
