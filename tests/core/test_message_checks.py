"""The public message and tool-definition types refuse what the wire cannot carry, when they
are built, with an :class:`InvalidMessageError` naming the member and the rule.

Exact messages, so that a change to a check's condition or its words fails here (the
mutation run reaches tests/core only; these checks were reached only from elsewhere).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import pytest

from metacrate_grid_agent import (
    AssistantMessage,
    ImagePart,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)
from metacrate_grid_agent._core._types import FunctionCall, FunctionDefinition, ImageURL
from metacrate_grid_agent.errors import InvalidMessageError

if TYPE_CHECKING:
    from collections.abc import Callable

HTTPS: Final = "https://example.test/a.png"
DATA: Final = "data:image/png;base64,iVBORw0KGgo="
ID_RULE: Final = "ToolMessage.tool_call_id must be a non-empty str of at most 1024 chars"
NAME_RULE: Final = "ToolDefinition name must be 1 to 64 letters, digits, '_' or '-', got "
Odd = Any  # a value of a type the annotations do not allow, passed on purpose


def odd(value: object) -> Odd:
    """``value`` as it is, typed to pass where the annotations would refuse it."""
    return value


def _definition(name: Odd = "t", description: Odd = "", parameters: Odd = None) -> object:
    function = FunctionDefinition(name=name, description=description, parameters=parameters or {})
    return ToolDefinition(function=function)


#: Each case: what is built, and the whole message it is refused with.
REFUSED: Final[list[tuple[str, Callable[[], object], str]]] = [
    ("text not a str", lambda: TextPart(text=odd(1)), "TextPart.text must be a str"),
    ("url not a str", lambda: ImageURL(url=odd(1)), "ImageURL.url must be a str"),
    ("bare https", lambda: ImageURL(url="https://"), "ImageURL.url is not a valid https URL"),
    (
        "https with a space",
        lambda: ImageURL(url="https://a b"),
        "ImageURL.url is not a valid https URL",
    ),
    (
        "https with a tab",
        lambda: ImageURL(url="https://a\tb"),
        "ImageURL.url is not a valid https URL",
    ),
    (
        "data not an image",
        lambda: ImageURL(url="data:text/plain;base64,AA=="),
        "ImageURL.url: a data URL must be data:image/<type>;base64,<data>",
    ),
    (
        "http",
        lambda: ImageURL(url="http://example.test/a.png"),
        "ImageURL.url must be an https: or data:image/ URL",
    ),
    (
        "unknown detail",
        lambda: ImageURL(url=HTTPS, detail="huge"),
        "ImageURL.detail must be one of ['auto', 'high', 'low']",
    ),
    (
        "system content empty",
        lambda: SystemMessage(content=()),
        "SystemMessage.content must be a str or a non-empty tuple of parts",
    ),
    (
        "system content a list",
        lambda: SystemMessage(content=odd([TextPart(text="x")])),
        "SystemMessage.content must be a str or a non-empty tuple of parts",
    ),
    (
        "system with an image",
        lambda: SystemMessage(content=odd((TextPart(text="x"), ImagePart.of(HTTPS)))),
        "SystemMessage.content[1] must be a TextPart",
    ),
    (
        "user with a stray part",
        lambda: UserMessage(content=odd((TextPart(text="x"), "y"))),
        "UserMessage.content[1] must be a TextPart or ImagePart",
    ),
    (
        "tool result with an image",
        lambda: ToolMessage(tool_call_id="c", content=odd((ImagePart.of(HTTPS),))),
        "ToolMessage.content[0] must be a TextPart",
    ),
    (
        "assistant content empty",
        lambda: AssistantMessage(content=odd(())),
        "AssistantMessage.content must be a str or a non-empty tuple of parts",
    ),
    (
        "assistant with an image",
        lambda: AssistantMessage(content=odd((ImagePart.of(HTTPS),))),
        "AssistantMessage.content[0] must be a TextPart",
    ),
    (
        "assistant calls a list",
        lambda: AssistantMessage(content="x", tool_calls=odd([])),
        "AssistantMessage.tool_calls must be a tuple of ToolCall",
    ),
    (
        "assistant call not a call",
        lambda: AssistantMessage(content="x", tool_calls=odd(("c",))),
        "AssistantMessage.tool_calls must be a tuple of ToolCall",
    ),
    (
        "assistant with nothing",
        lambda: AssistantMessage(content=None, tool_calls=()),
        "AssistantMessage needs content or tool_calls",
    ),
    (
        "call id empty",
        lambda: ToolCall.create("", "t", "{}"),
        "ToolCall.id must be a non-empty str of at most 1024 chars",
    ),
    (
        "call of another type",
        lambda: ToolCall(id="c", type=odd("other"), function=FunctionCall(name="t", arguments="")),
        "ToolCall.type must be 'function'",
    ),
    (
        "call without a function",
        lambda: ToolCall(id="c", function=odd({"name": "t"})),
        "ToolCall.function must be a FunctionCall",
    ),
    (
        "call name too long",
        lambda: ToolCall.create("c", "n" * 1025, "{}"),
        "ToolCall.function.name must be a non-empty str of at most 1024 chars",
    ),
    (
        "call arguments not a str",
        lambda: ToolCall.create("c", "t", odd({})),
        "ToolCall.function.arguments must be a str",
    ),
    ("tool id empty", lambda: ToolMessage(tool_call_id="", content="x"), ID_RULE),
    ("tool id too long", lambda: ToolMessage(tool_call_id="c" * 1025, content="x"), ID_RULE),
    ("tool id not a str", lambda: ToolMessage(tool_call_id=odd(7), content="x"), ID_RULE),
    (
        "tool content none",
        lambda: ToolMessage(tool_call_id="c", content=odd(None)),
        "ToolMessage.content must be a str or a non-empty tuple of parts",
    ),
    (
        "definition of another type",
        lambda: ToolDefinition(type=odd("other"), function=FunctionDefinition(name="t")),
        "ToolDefinition.type must be 'function'",
    ),
    (
        "definition without a function",
        lambda: ToolDefinition(function=odd({"name": "t"})),
        "ToolDefinition.function must be a FunctionDefinition",
    ),
    ("name empty", lambda: _definition(name=""), NAME_RULE + "''"),
    ("name with a dot", lambda: _definition(name="a.b"), NAME_RULE + "'a.b'"),
    ("name too long", lambda: _definition(name="n" * 65), NAME_RULE + repr("n" * 65)),
    ("name not a str", lambda: _definition(name=5), NAME_RULE + "'5'"),
    (
        "description not a str",
        lambda: _definition(description=5),
        "ToolDefinition description must be a str",
    ),
    (
        "parameters not a mapping",
        lambda: _definition(parameters=[1]),
        "ToolDefinition parameters must be a JSON object (a mapping)",
    ),
]


@pytest.mark.parametrize(
    ("build", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_a_value_the_wire_cannot_carry_is_refused_when_built(
    build: Callable[[], object], message: str
) -> None:
    """Each rule of the message and definition types, broken once: the typed error, with
    the member and the rule in words."""
    with pytest.raises(InvalidMessageError) as caught:
        build()
    assert str(caught.value) == message


def test_what_the_wire_carries_is_built() -> None:
    """The edges of each rule that are allowed: an https URL or a data image with each
    detail, a tool id of 1 and 1024 characters, names of 1 and 64 characters, text parts
    for a system message and text or images for a user."""
    for url in (HTTPS, DATA, "data:image/svg+xml;base64,"):
        for detail in (None, "auto", "low", "high"):
            assert ImageURL(url=url, detail=detail).url == url
    assert ToolMessage(tool_call_id="c", content=(TextPart(text="x"),)).tool_call_id == "c"
    assert len(ToolMessage(tool_call_id="c" * 1024, content="x").tool_call_id) == 1024
    call = ToolCall.create("c" * 1024, "n" * 1024, "")
    assert (len(call.id), len(call.name), call.arguments) == (1024, 1024, "")
    for name in ("a", "n" * 64, "A_b-9"):
        assert isinstance(_definition(name=name), ToolDefinition)
    assert SystemMessage(content=(TextPart(text="x"),)).content == (TextPart(text="x"),)
    parts = (TextPart(text="x"), ImagePart.of(DATA, "low"))
    assert UserMessage(content=parts).content == parts
