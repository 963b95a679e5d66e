"""Public request and result types: messages, content parts, tool definitions, tool calls.

The message structs have exactly the wire shape of the chat-completions API, so a request
body is serialised in one pass with no intermediate copies. Every struct is frozen and
validated when built: an invalid message fails where it is made, not at send time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from metacrate_grid_agent._core._retry import AttemptRecord
from metacrate_grid_agent.errors import InvalidMessageError

__all__ = [
    "AssistantMessage",
    "Completion",
    "FunctionCall",
    "FunctionDefinition",
    "ImagePart",
    "ImageURL",
    "Message",
    "SystemMessage",
    "TextPart",
    "ToolCall",
    "ToolDefinition",
    "ToolMessage",
    "Usage",
    "UserMessage",
]

#: Image URL schemes accepted in an ``image_url`` part.
_DATA_IMAGE: Final = re.compile(r"\Adata:image/[a-z0-9.+-]+;base64,[A-Za-z0-9+/=\s]*\Z", re.ASCII)
_IMAGE_DETAILS: Final = frozenset({"auto", "low", "high"})
#: Longest tool-call id a message may carry (``ToolCall.id``, ``ToolMessage.tool_call_id``):
#: the ``[llm] max_id_length`` ceiling, so every id a reply lets through makes a valid call.
MAX_CALL_ID_LENGTH: Final = 1024
#: Longest tool name a message's tool call may carry: the most a reply's name limit may be
#: (above the ``[llm] max_name_length`` ceiling), so every name it lets through is valid.
MAX_CALL_NAME_LENGTH: Final = 1024


# The messages, their parts, FunctionCall and Usage are not tracked by the collector
# (gc=False): a session makes several per turn and keeps them all in its history, and
# every full pass of the collector walked each. None can be part of a reference cycle:
# each is frozen (no field is set after it is built) and holds only strings, numbers,
# None and tuples of such structs or of ToolCall, which holds only a FunctionCall and
# strings (a ToolCall itself stays tracked: OversizedToolCall, its subclass, has a
# __dict__, which msgspec does not allow without the collector).


def _fail(message: str) -> InvalidMessageError:
    return InvalidMessageError(message)


class TextPart(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="text"):
    """A text content part."""

    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise _fail("TextPart.text must be a str")


class ImageURL(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """The ``image_url`` member of an image part: an ``https:`` or ``data:image/...`` URL."""

    url: str
    detail: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str):
            raise _fail("ImageURL.url must be a str")
        if self.url.startswith("https://"):
            if len(self.url) <= len("https://") or any(c.isspace() for c in self.url):
                raise _fail("ImageURL.url is not a valid https URL")
        elif self.url.startswith("data:"):
            if _DATA_IMAGE.match(self.url) is None:
                raise _fail("ImageURL.url: a data URL must be data:image/<type>;base64,<data>")
        else:
            raise _fail("ImageURL.url must be an https: or data:image/ URL")
        if self.detail is not None and self.detail not in _IMAGE_DETAILS:
            raise _fail(f"ImageURL.detail must be one of {sorted(_IMAGE_DETAILS)}")


class ImagePart(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="image_url"):
    """An image content part (user messages only)."""

    image_url: ImageURL

    @classmethod
    def of(cls, url: str, detail: str | None = None) -> ImagePart:
        """An image part for ``url`` (``https:`` or ``data:image/...;base64,...``)."""
        return cls(image_url=ImageURL(url=url, detail=detail))


def _check_content(owner: str, content: object, *, images: bool, optional: bool = False) -> None:
    if content is None and optional:
        return
    if isinstance(content, str):
        return
    if not isinstance(content, tuple) or not content:
        raise _fail(f"{owner}.content must be a str or a non-empty tuple of parts")
    allowed: tuple[type, ...] = (TextPart, ImagePart) if images else (TextPart,)
    for index, part in enumerate(content):
        if not isinstance(part, allowed):
            names = " or ".join(t.__name__ for t in allowed)
            raise _fail(f"{owner}.content[{index}] must be a {names}")


def _check_id(owner: str, value: object, longest: int = MAX_CALL_ID_LENGTH) -> None:
    if not isinstance(value, str) or not value or len(value) > longest:
        raise _fail(f"{owner} must be a non-empty str of at most {longest} chars")


class SystemMessage(msgspec.Struct, frozen=True, gc=False, tag_field="role", tag="system"):
    """Instructions from the operator."""

    content: str | tuple[TextPart, ...]

    def __post_init__(self) -> None:
        _check_content("SystemMessage", self.content, images=False)


class UserMessage(msgspec.Struct, frozen=True, gc=False, tag_field="role", tag="user"):
    """A user turn: text, or a tuple of text and image parts."""

    content: str | tuple[TextPart | ImagePart, ...]

    def __post_init__(self) -> None:
        _check_content("UserMessage", self.content, images=True)


class FunctionCall(msgspec.Struct, frozen=True, gc=False):
    """The function member of a tool call: the tool name and its raw arguments string."""

    name: str
    arguments: str


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call proposed by the model. ``arguments`` is the raw JSON text, unvalidated."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    def __post_init__(self) -> None:
        _check_id("ToolCall.id", self.id)
        if self.type != "function":
            raise _fail("ToolCall.type must be 'function'")
        if not isinstance(self.function, FunctionCall):
            raise _fail("ToolCall.function must be a FunctionCall")
        _check_id("ToolCall.function.name", self.function.name, MAX_CALL_NAME_LENGTH)
        if not isinstance(self.function.arguments, str):
            raise _fail("ToolCall.function.arguments must be a str")

    @classmethod
    def create(cls, id: str, name: str, arguments: str) -> ToolCall:  # noqa: A002 - the wire name
        """A tool call with this id, tool name and raw arguments text."""
        return cls(id=id, function=FunctionCall(name=name, arguments=arguments))

    @property
    def name(self) -> str:
        """The tool name."""
        return self.function.name

    @property
    def arguments(self) -> str:
        """The raw arguments text (JSON, as the model wrote it)."""
        return self.function.arguments


class AssistantMessage(
    msgspec.Struct,
    frozen=True,
    gc=False,
    kw_only=True,
    tag_field="role",
    tag="assistant",
    omit_defaults=True,
):
    """A model turn: optional text and optional tool calls (never reasoning)."""

    content: str | tuple[TextPart, ...] | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    def __post_init__(self) -> None:
        _check_content("AssistantMessage", self.content, images=False, optional=True)
        if not isinstance(self.tool_calls, tuple) or not all(
            isinstance(c, ToolCall) for c in self.tool_calls
        ):
            raise _fail("AssistantMessage.tool_calls must be a tuple of ToolCall")
        if self.content is None and not self.tool_calls:
            raise _fail("AssistantMessage needs content or tool_calls")


class ToolMessage(
    msgspec.Struct, frozen=True, gc=False, kw_only=True, tag_field="role", tag="tool"
):
    """The observation of one tool call, tied to it by ``tool_call_id``."""

    tool_call_id: str
    content: str | tuple[TextPart, ...]

    def __post_init__(self) -> None:
        _check_id("ToolMessage.tool_call_id", self.tool_call_id)
        _check_content("ToolMessage", self.content, images=False)


Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage
"""Any chat message."""

_NAME: Final = re.compile(r"\A[A-Za-z0-9_-]{1,64}\Z", re.ASCII)


class FunctionDefinition(msgspec.Struct, frozen=True, omit_defaults=True):
    """The function member of a tool definition."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = msgspec.field(default_factory=dict)


class ToolDefinition(msgspec.Struct, frozen=True, kw_only=True):
    """A tool definition in the standard envelope ``{"type": "function", "function": {...}}``.

    Only the shape is checked here; the tool loop validates the schema itself.
    """

    type: Literal["function"] = "function"
    function: FunctionDefinition

    def __post_init__(self) -> None:
        if self.type != "function":
            raise _fail("ToolDefinition.type must be 'function'")
        if not isinstance(self.function, FunctionDefinition):
            raise _fail("ToolDefinition.function must be a FunctionDefinition")
        if not isinstance(self.function.name, str) or _NAME.match(self.function.name) is None:
            raise _fail(
                "ToolDefinition name must be 1 to 64 letters, digits, '_' or '-', "
                f"got {str(self.function.name)[:80]!r}"
            )
        if not isinstance(self.function.description, str):
            raise _fail("ToolDefinition description must be a str")
        if not isinstance(self.function.parameters, Mapping):
            raise _fail("ToolDefinition parameters must be a JSON object (a mapping)")

    @classmethod
    def create(cls, name: str, description: str, parameters: Mapping[str, Any]) -> ToolDefinition:
        """A function tool definition."""
        return cls(
            function=FunctionDefinition(name=name, description=description, parameters=parameters)
        )

    @property
    def name(self) -> str:
        """The tool name."""
        return self.function.name


class Usage(msgspec.Struct, frozen=True, gc=False):
    """Token counts of one reply, as the endpoint reported them (None when not reported)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class Completion(msgspec.Struct, frozen=True):
    """One completed call: the reply, and how it was obtained.

    ``tool_calls`` carry raw argument strings (validation is the tool loop's job);
    ``minted_call_ids`` lists the ids the client minted for calls that had none.
    """

    text: str | None
    tool_calls: tuple[ToolCall, ...]
    minted_call_ids: frozenset[str]
    usage: Usage | None
    finish_reason: str | None
    request_id: str
    attempts: int
    latency_s: float
    attempt_records: tuple[AttemptRecord, ...]
    response_id: str | None = None
    """The reply's own ``id`` member, when a short string (scrubbed; never sent back)."""
    response_model: str | None = None
    """The reply's ``model`` member, when a short string (scrubbed; never sent back)."""

    def to_message(self) -> AssistantMessage:
        """The reply as an assistant message, to append to the history."""
        return AssistantMessage(content=self.text, tool_calls=self.tool_calls)
