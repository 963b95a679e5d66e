"""The chat-completions envelope, replies in (request bodies out: :mod:`._request`).

Rule 1: this module never awaits, never reads a clock and never touches a socket. It maps
bytes to values (:func:`decode_reply`); the transport does the I/O around it.

A reply is decoded once, by one module-level decoder, into small private "view" structs
that declare only the members read here. Everything else a provider adds (``id``,
``model``, ``system_fingerprint``, timings, ``reasoning_content`` and the other reasoning
members, provider fields) is skipped by the decoder and never retained. The views are then
checked against the policy below and mapped into the frozen public types, so no caller ever
sees a view, a ``msgspec`` type or any reasoning text.

The policy, each failure raised as a :class:`~metacrate_grid_agent.errors.ResponseError`
subclass with ``path``, the JSON path of the offending member:

* not JSON or not UTF-8: ``MalformedJSONError``; a wrong JSON type anywhere:
  ``InvalidValueError``; an absent required member: ``MissingMemberError``.
* a non-null ``error`` member (top level or in the choice) or ``finish_reason == "error"``:
  ``ChoiceError``. Every other ``finish_reason`` string is passed on as it is.
* ``choices`` empty: ``EmptyChoicesError``; only the first choice is used, though every
  choice is decoded (in the same single pass) and so must be well-formed.
* text: a string, or the ``text`` of the ``"text"`` parts of a part array joined; a
  leading ``<think>``/``<thinking>`` block is reasoning and is removed (unclosed: all of
  it); empty text is ``None``.
* tool calls: counted, typed, named and sized; ``arguments`` given as an object are
  re-serialised compactly, absent or blank ones become ``"{}"``; an absent id is an error
  unless ``mint_missing_call_ids`` is set; a repeated id is always an error.
* every string and count has a bound (``ReplyLimits``, from the ``[llm]`` settings).

Error bodies are read by :mod:`._error_body`; every text quoted from the endpoint passes
through :mod:`._redact` first.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, TypeAlias

import msgspec

from metacrate_grid_agent._core._error_body import error_member_message
from metacrate_grid_agent._core._redact import NO_KEY, KeyRedactor, scrub, shortened
from metacrate_grid_agent._core._types import (
    MAX_CALL_ID_LENGTH,
    MAX_CALL_NAME_LENGTH,
    FunctionCall,
    ToolCall,
    Usage,
)
from metacrate_grid_agent.config import LLMConfig
from metacrate_grid_agent.errors import (
    ChoiceError,
    DuplicateCallIdError,
    EmptyChoicesError,
    InvalidValueError,
    MalformedJSONError,
    MissingCallIdError,
    MissingMemberError,
    OversizedValueError,
    ResponseError,
)

__all__ = [
    "MAX_FINISH_REASON_LENGTH",
    "MAX_PATH_LENGTH",
    "MAX_TOKEN_COUNT",
    "OversizedToolCall",
    "ParsedReply",
    "ReplyLimits",
    "decode_reply",
]

#: Longest JSON path quoted in an error (a value nested deeper is cut, marked with "…").
MAX_PATH_LENGTH: Final = 200
#: Longest ``finish_reason`` accepted; every provider's value is a short word.
MAX_FINISH_REASON_LENGTH: Final = 64
#: Largest token count accepted: the largest integer a JSON double represents exactly.
MAX_TOKEN_COUNT: Final = 2**53 - 1

_BOM: Final = b"\xef\xbb\xbf"
#: Longest quote of an echoed tool-call type or id in an error message.
_ECHO_LIMIT: Final = 40
_NO_MEMBER: Final = msgspec.Raw()
#: Bound on the reply's own ``id`` and ``model`` (raw JSON bytes): longer is left out.
MAX_REPLY_LABEL_BYTES: Final = 256


#: Re-serialises a tool call's arguments given as an object (decoded JSON: no hook needed).
_ENCODER: Final = msgspec.json.Encoder()


# --- reply views: only the members read, everything else is skipped by the decoder -------

_TokenCount: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_COUNT)]


# Views: from JSON alone (no cycle can form), dropped by decode_reply: gc need not track.
class _UsageView(msgspec.Struct, gc=False):
    prompt_tokens: _TokenCount | None = None
    completion_tokens: _TokenCount | None = None
    total_tokens: _TokenCount | None = None


class _FunctionView(msgspec.Struct, gc=False):
    name: str
    # A dict is decoded only here: some providers send the arguments as an object.
    arguments: str | dict[str, Any] | None = None


class _ToolCallView(msgspec.Struct, kw_only=True, gc=False):
    id: str | None = None
    type: str | None = None
    function: _FunctionView


class _PartView(msgspec.Struct, gc=False):
    type: str | None = None
    # Any: a non-text part may carry anything under "text"; only text parts are checked.
    text: Any = None


class _MessageView(msgspec.Struct, gc=False):
    content: str | list[_PartView] | None = None
    tool_calls: list[_ToolCallView] | None = None


class _ChoiceView(msgspec.Struct, gc=False):
    message: _MessageView | None = None
    finish_reason: str | None = None
    error: msgspec.Raw = _NO_MEMBER


class _ReplyView(msgspec.Struct, gc=False):
    choices: list[_ChoiceView] | None = None
    usage: _UsageView | None = None
    error: msgspec.Raw = _NO_MEMBER
    # Raw: informative only, never required; any shape but a short string is left out.
    id: msgspec.Raw = _NO_MEMBER
    model: msgspec.Raw = _NO_MEMBER


_DECODER: Final = msgspec.json.Decoder(_ReplyView)
#: One decoder for the labels (``msgspec.json.decode(..., type=str)`` builds one per call).
_LABEL_DECODER: Final = msgspec.json.Decoder(str)

_AT_PATH: Final = re.compile(r"(?P<what>.*) - at `(?P<path>\$[^`]*)`", re.DOTALL)
_MISSING_FIELD: Final = re.compile(r"Object missing required field `(?P<field>[^`]+)`")


def _translate(exc: msgspec.ValidationError) -> ResponseError:
    """Map msgspec's validation message to our error class and JSON path."""
    what, path = str(exc), "$"  # a problem at the top level has no " - at" suffix
    if (located := _AT_PATH.fullmatch(what)) is not None:
        what, path = located["what"], located["path"]
        path = shortened(path, MAX_PATH_LENGTH)  # one "[...]" per level of an untyped value
    if (missing := _MISSING_FIELD.fullmatch(what)) is not None:
        member = f"{path}.{missing['field']}"
        return MissingMemberError(f"the reply has no {member} member", path=member)
    detail = what[:1].lower() + what[1:200]
    return InvalidValueError(f"the reply has an invalid value at {path}: {detail}", path=path)


# --- replies --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplyLimits:
    """The bounds a reply is checked against (the ``[llm]`` settings of the same names)."""

    max_text_bytes: int
    max_tool_calls: int
    max_argument_bytes: int
    max_id_length: int
    max_name_length: int
    mint_missing_call_ids: bool

    def __post_init__(self) -> None:
        if self.max_id_length > MAX_CALL_ID_LENGTH or self.max_name_length > MAX_CALL_NAME_LENGTH:
            raise ValueError(
                f"id and name limits are at most {MAX_CALL_ID_LENGTH} and {MAX_CALL_NAME_LENGTH}"
            )

    @classmethod
    def from_config(cls, config: LLMConfig) -> ReplyLimits:
        """The limits set in an ``[llm]`` configuration."""
        return cls(
            max_text_bytes=config.max_text_bytes,
            max_tool_calls=config.max_tool_calls,
            max_argument_bytes=config.max_argument_bytes,
            max_id_length=config.max_id_length,
            max_name_length=config.max_name_length,
            mint_missing_call_ids=config.mint_missing_call_ids,
        )


class ParsedReply(msgspec.Struct, frozen=True):
    """One decoded reply: visible text, tool calls, usage and finish reason, never reasoning.

    ``minted_call_ids`` lists the ids generated for calls that came without one (only with
    ``mint_missing_call_ids``); the model never saw them.
    """

    text: str | None
    tool_calls: tuple[ToolCall, ...]
    minted_call_ids: frozenset[str]
    usage: Usage | None
    finish_reason: str | None
    response_id: str | None = None
    response_model: str | None = None


def decode_reply(
    body: bytes, limits: ReplyLimits, *, request_id: str, redactor: KeyRedactor | None = None
) -> ParsedReply:
    """Decode a 2xx chat-completions body, in one pass, into a :class:`ParsedReply`.

    Raises a :class:`~metacrate_grid_agent.errors.ResponseError` subclass naming the JSON
    path of the first problem found. ``request_id`` seeds the ids minted for calls
    without one, so the same reply to the same request always gets the same ids.
    ``redactor`` removes the key from any provider text quoted in an error message.
    """
    redactor = NO_KEY if redactor is None else redactor
    data = memoryview(body)[len(_BOM) :] if body[: len(_BOM)] == _BOM else body
    try:
        view = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise _translate(exc) from exc
    except msgspec.DecodeError as exc:
        raise MalformedJSONError(f"the reply is not valid JSON: {exc}", path="$") from exc
    except RecursionError as exc:
        raise InvalidValueError("the reply is nested too deeply to decode", path="$") from exc

    # An absent member is an empty Raw: falsy, with no call to _present.
    if view.error and _present(view.error):
        raise ChoiceError(error_member_message("the reply", view.error, redactor), path="$.error")
    if view.choices is None:
        raise MissingMemberError("the reply has no $.choices member", path="$.choices")
    if not view.choices:
        raise EmptyChoicesError("the reply has an empty choices array", path="$.choices")
    choice = view.choices[0]
    if choice.error and _present(choice.error):
        raise ChoiceError(
            error_member_message("choice 0", choice.error, redactor), path="$.choices[0].error"
        )
    finish_reason = choice.finish_reason
    if finish_reason == "error":
        raise ChoiceError(
            "choice 0 ended with finish_reason 'error'", path="$.choices[0].finish_reason"
        )
    if finish_reason is not None and len(finish_reason) > MAX_FINISH_REASON_LENGTH:
        raise OversizedValueError(
            f"finish_reason is {len(finish_reason)} characters long, "
            f"above {MAX_FINISH_REASON_LENGTH}",
            path="$.choices[0].finish_reason",
        )
    message = choice.message
    if message is None:
        raise MissingMemberError(
            "the reply has no $.choices[0].message member", path="$.choices[0].message"
        )
    content = message.content
    if (  # _reply_text's answer for a plain text that fits, without its calls
        type(content) is str
        and "<think" not in content
        and len(content) * _MAX_UTF8_BYTES <= limits.max_text_bytes
    ):
        text = content or None
    else:
        text = _reply_text(content, limits, "$.choices[0].message.content")
    calls, minted = _tool_calls(
        message.tool_calls, limits, request_id, "$.choices[0].message.tool_calls", redactor
    )
    usage = view.usage
    return ParsedReply(  # positional, in its order: cheaper than by name on every reply
        text,
        calls,
        minted,
        None
        if usage is None
        else Usage(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens),
        finish_reason,
        _label(view.id, redactor),
        _label(view.model, redactor),
    )


def _label(raw: msgspec.Raw, redactor: KeyRedactor) -> str | None:
    """A short string member, scrubbed; None for anything else (never an error)."""
    if not 2 < len(raw) <= MAX_REPLY_LABEL_BYTES:
        return None
    try:  # any other JSON value is refused by the str decoder: rare, so no check first
        text = _LABEL_DECODER.decode(raw)
    except msgspec.DecodeError:
        return None
    # scrub()'s shortcut without its call (the text is within the limit, as its raw JSON is).
    if redactor.leaves_plain(text):
        return text
    return scrub(text, redactor=redactor, limit=MAX_REPLY_LABEL_BYTES) or None


def _present(raw: msgspec.Raw) -> bool:
    """Whether an optional member was sent with a non-null value."""
    return len(raw) > 0 and bytes(raw) != b"null"


def _oversized(what: str, size: int, setting: str, limit: int, path: str) -> OversizedValueError:
    return OversizedValueError(f"{what} is {size} bytes, above {setting} = {limit}", path=path)


def _check_size(value: str, limit: int, what: str, setting: str, path: str) -> None:
    """Raise when ``value`` is over ``limit`` UTF-8 bytes."""
    if (size := len(value.encode())) > limit:
        raise _oversized(what, size, setting, limit, path)


#: Most UTF-8 bytes of one character: a text of n characters is at most 4n bytes.
_MAX_UTF8_BYTES: Final = 4
_THINK_OPEN: Final = re.compile(r"\s*<(think|thinking)>")
_SPACE: Final = re.compile(r"\s+")


def _strip_reasoning(text: str) -> str:
    """Remove leading ``<think>`` blocks and the whitespace after them; unclosed: all."""
    if "<think" not in text:  # both tags start so: no block, without a regular expression
        return text
    pos = 0
    while (opening := _THINK_OPEN.match(text, pos)) is not None:
        end = text.find(f"</{opening[1]}>", opening.end())
        if end == -1:
            return ""
        pos = end + len(opening[1]) + 3
    if pos == 0:
        return text
    space = _SPACE.match(text, pos)
    return text[pos if space is None else space.end() :]


def _reply_text(
    content: str | list[_PartView] | None, limits: ReplyLimits, path: str
) -> str | None:
    if content is None:
        return None
    if isinstance(content, str):
        text = content
    else:
        pieces: list[str] = []
        for index, part in enumerate(content):
            if part.type != "text":
                continue
            if not isinstance(part.text, str):
                raise InvalidValueError(
                    f"content part {index} has type 'text' but no string text",
                    path=f"{path}[{index}].text",
                )
            pieces.append(part.text)
        text = "".join(pieces)
    text = _strip_reasoning(text)
    if not text:
        return None
    if len(text) * _MAX_UTF8_BYTES > limits.max_text_bytes:  # else it fits, unencoded
        _check_size(text, limits.max_text_bytes, "the reply text", "max_text_bytes", path)
    return text


class OversizedToolCall(ToolCall, frozen=True, kw_only=True, dict=True):
    """A tool call whose arguments were over ``max_argument_bytes``: rejected, not an error.

    The id and name are kept; the arguments were dropped unread past their size, and the
    call carries ``"{}"`` in their place so that it stays a valid wire tool call when an
    assistant message echoes it back (the model then sees its call with ``{}`` arguments and,
    in the tool loop, an observation saying they were too large). ``argument_bytes`` is the
    size that was sent; it is not a wire member. Never run such a call: the tool loop
    rejects it as ``oversized`` before any executor sees it.
    """

    @classmethod
    def dropped(cls, id: str, name: str, argument_bytes: int) -> OversizedToolCall:  # noqa: A002
        """The call ``id`` to ``name`` whose ``argument_bytes`` bytes of arguments were dropped."""
        call = cls(id=id, function=FunctionCall(name=name, arguments="{}"))
        call.__dict__["argument_bytes"] = argument_bytes
        return call

    @property
    def argument_bytes(self) -> int:
        """The size of the arguments the endpoint sent, in UTF-8 bytes."""
        size = self.__dict__.get("argument_bytes", 0)
        return size if isinstance(size, int) else 0

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with the size (a plain struct pickle would keep the wire fields only)."""
        return (_dropped_call, (self.id, self.name, self.argument_bytes))

    def __copy__(self) -> OversizedToolCall:
        return OversizedToolCall.dropped(self.id, self.name, self.argument_bytes)


def _dropped_call(id: str, name: str, argument_bytes: int) -> OversizedToolCall:  # noqa: A002
    """Rebuild a pickled :class:`OversizedToolCall`."""
    return OversizedToolCall.dropped(id, name, argument_bytes)


def _arguments(value: str | dict[str, Any] | None, limits: ReplyLimits) -> str | int:
    """The arguments text (raw as sent, an object re-serialised, nothing as ``"{}"``), or,
    when it is over ``max_argument_bytes``, its size in bytes (the call is then rejected).
    """
    limit = limits.max_argument_bytes
    if isinstance(value, dict):
        encoded = _ENCODER.encode(value)
        return len(encoded) if len(encoded) > limit else encoded.decode()
    if value is None or not value or value.isspace():
        return "{}"
    # Measured in UTF-8 only when it could be over: 4 bytes a character fit (no copy).
    if len(value) * _MAX_UTF8_BYTES > limit and (size := len(value.encode())) > limit:
        return size
    return value


def _tool_calls(
    views: list[_ToolCallView] | None,
    limits: ReplyLimits,
    request_id: str,
    path: str,
    redactor: KeyRedactor,
) -> tuple[tuple[ToolCall, ...], frozenset[str]]:
    if not views:
        return (), _NO_MINTED
    if len(views) > limits.max_tool_calls:
        raise OversizedValueError(
            f"the reply has {len(views)} tool calls, above max_tool_calls = "
            f"{limits.max_tool_calls}",
            path=path,
        )
    seen: dict[str, int] = {}
    calls: list[ToolCall] = []
    missing: list[tuple[int, str, str | int]] = []  # calls without an id: minted at the end
    for index, view in enumerate(views):
        if view.type is not None and view.type != "function":
            raise InvalidValueError(
                f"tool call {index} has type {_echo(view.type, redactor)}, expected 'function'",
                path=f"{path}[{index}].type",
            )
        function = view.function
        name = function.name
        if not name:
            raise InvalidValueError(
                f"tool call {index} has an empty function name",
                path=f"{path}[{index}].function.name",
            )
        if len(name) > limits.max_name_length:
            raise OversizedValueError(
                f"tool call {index} has a name of {len(name)} characters, above "
                f"max_name_length = {limits.max_name_length}",
                path=f"{path}[{index}].function.name",
            )
        arguments = _arguments(function.arguments, limits)
        call_id = view.id or None
        if call_id is None:
            if not limits.mint_missing_call_ids:
                raise MissingCallIdError(
                    f"tool call {index} has {'no' if view.id is None else 'an empty'} id; "
                    "set mint_missing_call_ids = true in [llm] to give such calls a "
                    "generated id",
                    path=f"{path}[{index}].id",
                )
            missing.append((index, name, arguments))
            calls.append(_CALL_MODEL)  # a place held for the minted call
            continue
        if len(call_id) > limits.max_id_length:
            raise OversizedValueError(
                f"tool call {index} has an id of {len(call_id)} characters, above "
                f"max_id_length = {limits.max_id_length}",
                path=f"{path}[{index}].id",
            )
        if (first := seen.setdefault(call_id, index)) != index:
            raise DuplicateCallIdError(
                f"tool calls {first} and {index} share the id {_echo(call_id, redactor)}",
                path=f"{path}[{index}].id",
            )
        if isinstance(arguments, int):
            calls.append(OversizedToolCall.dropped(call_id, name, arguments))
            continue
        call = _new_call()  # _call(), without its call: see there
        _set_member(call, "id", call_id)
        _set_member(call, "function", FunctionCall(name, arguments))
        calls.append(call)
    if not missing:
        return tuple(calls), _NO_MINTED
    # Minted once every given id is known, so a minted id never takes a later given one.
    minted: set[str] = set()
    for index, name, arguments in missing:
        call_id = _mint_id(request_id, index, seen)
        seen[call_id] = index
        minted.add(call_id)
        calls[index] = _call(call_id, name, arguments)
    return tuple(calls), frozenset(minted)


_NO_MINTED: Final[frozenset[str]] = frozenset()
#: What every reply's tool call is copied from, then given its members.
_CALL_MODEL: Final = ToolCall(id="call", function=FunctionCall(name="tool", arguments="{}"))
# msgspec's stubs omit Struct.__copy__ (a copy runs no __post_init__).
_new_call: Final[Callable[[], ToolCall]] = _CALL_MODEL.__copy__  # type: ignore[attr-defined]
_set_member: Final = msgspec.structs.force_setattr


def _call(call_id: str, name: str, arguments: str | int) -> ToolCall:
    """The public call of a checked reply call (``arguments`` over the limit: its size),
    built without ToolCall's checks, which the reply's include: a copy of a valid call
    given these members (``tests/core/test_reply_calls.py``)."""
    if isinstance(arguments, int):
        return OversizedToolCall.dropped(call_id, name, arguments)
    call = _new_call()
    _set_member(call, "id", call_id)
    _set_member(call, "function", FunctionCall(name, arguments))
    return call


def _echo(value: str, redactor: KeyRedactor) -> str:
    """A short quote of an echoed value, redacted before it is cut."""
    return repr(scrub(value, redactor=redactor, limit=_ECHO_LIMIT))


def _mint_id(request_id: str, index: int, taken: Mapping[str, int]) -> str:
    """A deterministic id for call ``index``, distinct from every id in ``taken``."""
    salt = 0
    while True:  # ends: each retry needs a distinct taken id, and there are few of them
        seed = f"{request_id}:{index}" + (f":{salt}" if salt else "")
        digest = hashlib.blake2b(seed.encode(), digest_size=8).hexdigest()
        if (call_id := f"minted-{digest}") not in taken:
            return call_id
        salt += 1
