"""The chat-completions envelope: request bodies out, replies and error bodies in.

Rule 1: this module never awaits, never reads a clock and never touches a socket. It maps
values to bytes (:func:`encode_request`) and bytes to values (:func:`decode_reply`,
:func:`parse_error_body`); the transport does the I/O around it.

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

Error bodies are never trusted to have a shape: :func:`parse_error_body` reads the common
ones, falls back to a short excerpt, and passes every string it returns through
:func:`scrub`, which removes the key and anything shaped like a credential.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, NoReturn, TypeAlias

import msgspec

from metacrate_grid_agent._core._types import (
    MAX_CALL_ID_LENGTH,
    MAX_CALL_NAME_LENGTH,
    FunctionCall,
    Message,
    ToolCall,
    ToolDefinition,
    Usage,
)
from metacrate_grid_agent.config import REDACTED, LLMConfig
from metacrate_grid_agent.errors import (
    ChoiceError,
    DuplicateCallIdError,
    EmptyChoicesError,
    InvalidMessageError,
    InvalidValueError,
    MalformedJSONError,
    MissingCallIdError,
    MissingMemberError,
    OversizedValueError,
    ResponseError,
)

__all__ = [
    "EXCERPT_LIMIT",
    "MAX_ERROR_BODY_BYTES",
    "MAX_FINISH_REASON_LENGTH",
    "MAX_PATH_LENGTH",
    "MAX_SCRUB_CHARS",
    "MAX_TOKEN_COUNT",
    "MESSAGE_LIMIT",
    "MIN_KEY_SLICE",
    "NO_KEY",
    "ErrorDetails",
    "KeyRedactor",
    "OversizedToolCall",
    "ParsedReply",
    "ReplyLimits",
    "decode_reply",
    "encode_request",
    "encode_tools",
    "parse_error_body",
    "redact",
    "scrub",
]

#: Longest excerpt of an unrecognised error body, and of an error ``type`` or ``code``.
EXCERPT_LIMIT: Final = 200
#: Longest error message kept: context-length messages with their numbers run to ~250.
MESSAGE_LIMIT: Final = 500
#: Bytes of an error body examined; error bodies are small, an HTML page is cut here.
MAX_ERROR_BODY_BYTES: Final = 64 * 1024
#: Characters :func:`scrub` examines; anything longer is cut first (at a token boundary).
MAX_SCRUB_CHARS: Final = 64 * 1024
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


# --- requests -------------------------------------------------------------------------------


def _enc_hook(obj: object) -> object:
    """Serialise the read-only mappings a tool schema may be built from."""
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"objects of type {type(obj).__name__} are not JSON")


_ENCODER: Final = msgspec.json.Encoder(enc_hook=_enc_hook)


class _RequestBody(msgspec.Struct, omit_defaults=True):
    messages: Sequence[Message]
    tools: Sequence[ToolDefinition] = ()


def encode_request(
    messages: Sequence[Message],
    tools: Sequence[ToolDefinition],
    *,
    tools_json: bytes | None = None,
) -> bytes:
    """The request body: exactly ``messages`` and, when there are any, ``tools``.

    The body names no ``model`` and no ``stream``: the endpoint URL selects the model and
    replies are never streamed. ``tools_json``, when given, is :func:`encode_tools` of
    ``tools``, kept from an earlier request: the same bytes, not serialised again.
    Raises ``InvalidMessageError`` when a value is not JSON.
    """
    try:
        if tools_json is not None and tools:
            return b"".join(
                (b'{"messages":', _ENCODER.encode(messages), b',"tools":', tools_json, b"}")
            )
        return _ENCODER.encode(_RequestBody(messages=messages, tools=tools if tools else ()))
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"the request cannot be serialised: {exc}") from exc


def encode_tools(tools: Sequence[ToolDefinition]) -> bytes:
    """The JSON array of ``tools``, as :func:`encode_request` writes it into a body."""
    try:
        return _ENCODER.encode(tools)
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"the request cannot be serialised: {exc}") from exc


# --- reply views: only the members read, everything else is skipped by the decoder -------

_TokenCount: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_COUNT)]


class _UsageView(msgspec.Struct):
    prompt_tokens: _TokenCount | None = None
    completion_tokens: _TokenCount | None = None
    total_tokens: _TokenCount | None = None


class _FunctionView(msgspec.Struct):
    name: str
    # A dict is decoded only here: some providers send the arguments as an object.
    arguments: str | dict[str, Any] | None = None


class _ToolCallView(msgspec.Struct, kw_only=True):
    id: str | None = None
    type: str | None = None
    function: _FunctionView


class _PartView(msgspec.Struct):
    type: str | None = None
    # Any: a non-text part may carry anything under "text"; only text parts are checked.
    text: Any = None


class _MessageView(msgspec.Struct):
    content: str | list[_PartView] | None = None
    tool_calls: list[_ToolCallView] | None = None


class _ChoiceView(msgspec.Struct):
    message: _MessageView | None = None
    finish_reason: str | None = None
    error: msgspec.Raw = _NO_MEMBER


class _ReplyView(msgspec.Struct):
    choices: list[_ChoiceView] | None = None
    usage: _UsageView | None = None
    error: msgspec.Raw = _NO_MEMBER


_DECODER: Final = msgspec.json.Decoder(_ReplyView)
# Error bodies have no fixed shape; they are small and decoded only on the error path.
_ANY_DECODER: Final = msgspec.json.Decoder()

_AT_PATH: Final = re.compile(r"(?P<what>.*) - at `(?P<path>\$[^`]*)`", re.DOTALL)
_MISSING_FIELD: Final = re.compile(r"Object missing required field `(?P<field>[^`]+)`")


def _translate(exc: msgspec.ValidationError) -> ResponseError:
    """Map msgspec's validation message to our error class and JSON path."""
    what, path = str(exc), "$"  # a problem at the top level has no " - at" suffix
    if (located := _AT_PATH.fullmatch(what)) is not None:
        what, path = located["what"], located["path"]
        if len(path) > MAX_PATH_LENGTH:  # one "[...]" per level of an untyped value
            path = path[: MAX_PATH_LENGTH - 1] + "…"
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

    if _present(view.error):
        raise ChoiceError(_error_message("the reply", view.error, redactor), path="$.error")
    if view.choices is None:
        raise MissingMemberError("the reply has no $.choices member", path="$.choices")
    if not view.choices:
        raise EmptyChoicesError("the reply has an empty choices array", path="$.choices")
    choice = view.choices[0]
    if _present(choice.error):
        raise ChoiceError(
            _error_message("choice 0", choice.error, redactor), path="$.choices[0].error"
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
    path = "$.choices[0].message"
    text = _reply_text(message.content, limits, f"{path}.content")
    calls, minted = _tool_calls(
        message.tool_calls, limits, request_id, f"{path}.tool_calls", redactor
    )
    usage = view.usage
    return ParsedReply(
        text=text,
        tool_calls=calls,
        minted_call_ids=minted,
        usage=None
        if usage is None
        else Usage(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens),
        finish_reason=finish_reason,
    )


def _present(raw: msgspec.Raw) -> bool:
    """Whether an optional member was sent with a non-null value."""
    return len(raw) > 0 and bytes(raw) != b"null"


def _error_message(owner: str, raw: msgspec.Raw, redactor: KeyRedactor) -> str:
    fields = _decode_error_fields(bytes(raw))
    if fields is None:
        return f"{owner} reports an error"
    message, kind, code = (_shown(f, redactor) for f in fields)
    extra = ", ".join(f"{k} {v}" for k, v in (("type", kind), ("code", code)) if v)
    return f"{owner} reports an error: {message or 'no message'}" + (f" ({extra})" if extra else "")


def _oversized(what: str, size: int, setting: str, limit: int, path: str) -> OversizedValueError:
    return OversizedValueError(f"{what} is {size} bytes, above {setting} = {limit}", path=path)


def _check_size(value: str, limit: int, what: str, setting: str, path: str) -> None:
    """Raise when ``value`` is over ``limit`` UTF-8 bytes."""
    if (size := len(value.encode())) > limit:
        raise _oversized(what, size, setting, limit, path)


_THINK_OPEN: Final = re.compile(r"\s*<(think|thinking)>")
_SPACE: Final = re.compile(r"\s+")


def _strip_reasoning(text: str) -> str:
    """Remove leading ``<think>`` blocks and the whitespace after them; unclosed: all."""
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
    def dropped(cls, id: str, name: str, argument_bytes: int) -> OversizedToolCall:
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


def _dropped_call(id: str, name: str, argument_bytes: int) -> OversizedToolCall:
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
    if (size := len(value.encode())) > limit:
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
        return (), frozenset()
    if len(views) > limits.max_tool_calls:
        raise OversizedValueError(
            f"the reply has {len(views)} tool calls, above max_tool_calls = "
            f"{limits.max_tool_calls}",
            path=path,
        )
    seen: dict[str, int] = {}
    checked: list[tuple[str | None, str, str | int]] = []
    for index, view in enumerate(views):
        at = f"{path}[{index}]"
        if view.type is not None and view.type != "function":
            raise InvalidValueError(
                f"tool call {index} has type {_echo(view.type, redactor)}, expected 'function'",
                path=f"{at}.type",
            )
        name = view.function.name
        if not name:
            raise InvalidValueError(
                f"tool call {index} has an empty function name", path=f"{at}.function.name"
            )
        if len(name) > limits.max_name_length:
            raise OversizedValueError(
                f"tool call {index} has a name of {len(name)} characters, above "
                f"max_name_length = {limits.max_name_length}",
                path=f"{at}.function.name",
            )
        arguments = _arguments(view.function.arguments, limits)
        call_id = view.id or None
        if call_id is None:
            if not limits.mint_missing_call_ids:
                raise MissingCallIdError(
                    f"tool call {index} has {'no' if view.id is None else 'an empty'} id; "
                    "set mint_missing_call_ids = true in [llm] to give such calls a "
                    "generated id",
                    path=f"{at}.id",
                )
        elif len(call_id) > limits.max_id_length:
            raise OversizedValueError(
                f"tool call {index} has an id of {len(call_id)} characters, above "
                f"max_id_length = {limits.max_id_length}",
                path=f"{at}.id",
            )
        elif (first := seen.setdefault(call_id, index)) != index:
            raise DuplicateCallIdError(
                f"tool calls {first} and {index} share the id {_echo(call_id, redactor)}",
                path=f"{at}.id",
            )
        checked.append((call_id, name, arguments))
    minted: set[str] = set()
    calls: list[ToolCall] = []
    for index, (given, name, arguments) in enumerate(checked):
        call_id = given
        if call_id is None:
            call_id = _mint_id(request_id, index, seen)
            seen[call_id] = index
            minted.add(call_id)
        if isinstance(arguments, int):
            calls.append(OversizedToolCall.dropped(call_id, name, arguments))
        else:
            calls.append(ToolCall.create(call_id, name, arguments))
    return tuple(calls), frozenset(minted)


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


# --- error bodies ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorDetails:
    """What an error body says, every string scrubbed; ``excerpt`` when no shape is known."""

    message: str | None
    type: str | None
    code: str | None
    excerpt: str | None


_MESSAGE_KEYS: Final = ("message", "msg", "detail", "error")
_MAX_DETAIL_ITEMS: Final = 8
_MAX_DETAIL_DEPTH: Final = 4


def _message_of(value: object, depth: int = 0) -> str | None:
    """The message in a string, an object's message member, or a FastAPI detail list."""
    if isinstance(value, str):
        return value or None
    if depth >= _MAX_DETAIL_DEPTH:
        return None
    if isinstance(value, list):
        found = (_message_of(item, depth + 1) for item in value[:_MAX_DETAIL_ITEMS])
        return "; ".join(m for m in found if m) or None
    if isinstance(value, dict):
        for key in _MESSAGE_KEYS:
            message = _message_of(value.get(key), depth + 1)
            if message:
                loc = value.get("loc")
                if key == "msg" and isinstance(loc, list) and loc:
                    return ".".join(_loc_part(p) for p in loc[:_MAX_DETAIL_ITEMS]) + ": " + message
                return message
    return None


def _loc_part(value: object) -> str:
    """One element of a FastAPI ``loc``: a name or an index; anything else is not shown.

    Never ``str()`` of a decoded container: its depth is the endpoint's to choose, and
    rendering it could recurse past the interpreter's limit.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # msgspec bounds integers to 64 bits
    return "…"


def _decode_error_fields(body: bytes) -> tuple[str | None, str | None, str | None] | None:
    """Message, type and code from the common error shapes; None when none applies."""
    try:
        document = _ANY_DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(document, list) and document:  # Google wraps the error in an array
        document = document[0]
    if isinstance(document, str):  # a bare JSON string is the message itself
        return (document, None, None) if document else None
    if not isinstance(document, dict):
        return None
    error = document.get("error")
    source = error if isinstance(error, dict) else document
    message = _message_of(source)
    kind = next(
        (v for k in ("type", "status", "error_type") if isinstance(v := source.get(k), str) and v),
        None,
    )
    code = source.get("code")
    code = str(code) if isinstance(code, str | int) and not isinstance(code, bool) else None
    if message is None and kind is None and not code:
        return None
    return message, kind, code or None


_BLOCK_OPEN: Final = re.compile(r"<(script|style)\b", re.IGNORECASE)
_BLOCK_CLOSE: Final = {
    "script": re.compile(r"</script\s*>", re.IGNORECASE),
    "style": re.compile(r"</style\s*>", re.IGNORECASE),
}
_TAG: Final = re.compile(r"<[^<>]*>")


def _html_text(page: str) -> str:
    """The visible text of an HTML page, in linear time (scripts and styles dropped)."""
    kept: list[str] = []
    pos = 0
    while (block := _BLOCK_OPEN.search(page, pos)) is not None:
        kept.append(page[pos : block.start()])
        end = _BLOCK_CLOSE[block[1].lower()].search(page, block.end())
        pos = len(page) if end is None else end.end()
    kept.append(page[pos:])
    return html.unescape(_TAG.sub(" ", "".join(kept)))


def parse_error_body(
    body: bytes, *, redactor: KeyRedactor, content_type: str | None = None
) -> ErrorDetails:
    """Read an error body: message, type and code of a known shape, or a short excerpt.

    Known shapes: ``{"error": {...}}``, ``{"error": "text"}``, a top-level ``message``
    (vLLM, Mistral), FastAPI's ``detail``, a bare JSON string, and any of these wrapped in
    an array (Google). Anything else gives an excerpt: of an HTML page (by content type
    or a leading ``<``) its visible text, otherwise the body as text. Only the first
    :data:`MAX_ERROR_BODY_BYTES` bytes are read. Never raises; every string returned is
    scrubbed of the key and credential-shaped text. An HTML page is redacted before its
    tags are stripped, so markup inside an echoed key cannot split it.
    """
    head = bytes(body[:MAX_ERROR_BODY_BYTES])
    is_html = head.lstrip()[:1] == b"<" or (
        content_type is not None and "html" in content_type.lower()
    )
    fields = None if is_html else _decode_error_fields(head)
    if fields is not None:
        message, kind, code = fields
        return ErrorDetails(
            message=_shown(message, redactor, MESSAGE_LIMIT),
            type=_shown(kind, redactor),
            code=_shown(code, redactor),
            excerpt=None,
        )
    text = _canonical_json(head) if not is_html else None
    if text is None:
        text = head.decode(errors="replace")
        if len(body) >= MAX_ERROR_BODY_BYTES:  # cut here, or by a reader with the same cap
            text = _drop_partial_token(text)
    if is_html:
        text = _html_text(redact(text, redactor=redactor))
    excerpt = scrub(text, redactor=redactor)
    return ErrorDetails(message=None, type=None, code=None, excerpt=excerpt or None)


def _shown(text: str | None, redactor: KeyRedactor, limit: int = EXCERPT_LIMIT) -> str | None:
    """``text`` scrubbed, or None when nothing is left to show (say, only control characters)."""
    return (scrub(text, redactor=redactor, limit=limit) or None) if text else None


def _canonical_json(head: bytes) -> str | None:
    """A JSON body of unknown shape, re-encoded without escapes (None if not JSON).

    JSON lets any character be written as ``\\uXXXX``, so a key can be echoed in a form no
    text search finds; decoding and re-encoding puts it back in plain characters.
    """
    try:
        return _ENCODER.encode(msgspec.json.decode(head)).decode()
    except (msgspec.DecodeError, RecursionError, UnicodeError, TypeError):
        return None


# --- scrubbing ------------------------------------------------------------------------------

_CREDENTIAL: Final = re.compile(
    r"(?P<scheme>\b(?i:bearer)\s+)[A-Za-z0-9._~+/=-]{8,}"
    r"|(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{8,}"  # OpenAI, Anthropic, OpenRouter, DeepSeek
    r"|\bAIza[0-9A-Za-z_-]{30,}"  # Google
    r"|\b(?:hf_|gsk_|xai-)[A-Za-z0-9]{20,}"  # Hugging Face, Groq, xAI
)
# Characters a reader does not see, which an echo may hide between the key's characters:
# Unicode's default-ignorable code points (soft hyphen, joiners, variation selectors, the
# Mongolian vowel separator, Hangul fillers, tags) and every format character (Cf), as of
# Unicode 15.1; first and last of each run.
_INVISIBLE: Final = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x0600, 0x0605), (0x061C, 0x061C),
    (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2),
    (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F),
    (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)  # fmt: skip
# Blanks: whitespace, the C0 and C1 controls, and the invisible characters.
_BLANK_CHARS: Final = "\\s\x00-\x1f\x7f-\x9f" + "".join(
    f"\\U{first:08x}-\\U{last:08x}" for first, last in _INVISIBLE
)
_BLANK: Final = re.compile(f"[{_BLANK_CHARS}]+")
# A key is printable ASCII without spaces (the configuration insists), so a cut that may
# split one drops the whole trailing run of such characters.
_NOT_KEY_CHAR: Final = re.compile(r"[^\x21-\x7e]")
# Blanks a server or a reader may insert into an echo (every character _BLANK matches:
# Unicode whitespace ends at U+3000), dropped at C speed by str.translate.
_DROP_BLANKS: Final = {
    c: None
    for c in (*range(0x3100), *(c for first, last in _INVISIBLE for c in range(first, last + 1)))
    if _BLANK.match(chr(c))
}
# What an echo of the key may be wrapped in: backslash escapes (JSON, repr, C), percent
# escapes (URLs) and HTML character references.
_ESCAPE: Final = re.compile(
    r"\\(?:u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|x[0-9a-fA-F]{2}|.)"
    r"|%[0-9a-fA-F]{2}"
    r"|&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?",
    re.DOTALL,
)
_BACKSLASH_ESCAPES: Final = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "0": "\0"}
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

#: Shortest piece of the key redacted wherever it appears (a whole key shorter than this
#: is redacted only whole): a slice this long of a random key identifies it.
MIN_KEY_SLICE: Final = 12
#: Shortest beginning of the key removed where a text ends (a cut may stop inside it).
_MIN_KEY_PREFIX: Final = 4
#: Length of the anchors, the pieces of the key looked for first.
_ANCHOR: Final = MIN_KEY_SLICE // 2
#: Distance between the anchors used: a span of MIN_KEY_SLICE characters has this many
#: places where a piece of _ANCHOR characters fits whole, one of them a multiple of it. So a
#: slice of the key that long holds a whole anchor, and a span of a text a whole piece
#: looked up; no longer stride would do.
_STRIDE: Final = MIN_KEY_SLICE - _ANCHOR + 1
#: Longest key whose anchors are searched for; a longer key's are looked up instead.
_SEARCHED_KEY_LENGTH: Final = 96
#: Decoding rounds for echoes escaped more than once (a repr of a JSON string).
_DECODE_ROUNDS: Final = 2


_Mapped: TypeAlias = tuple[str, list[int], list[int]]


def _mapped(text: str, pattern: re.Pattern[str]) -> _Mapped | None:
    """``text`` with each match of ``pattern`` decoded, and where each character came from.

    Returns the new text and, for its character ``i``, the span ``starts[i]:ends[i]`` of
    ``text`` it came from; None when nothing matched. Only run once a cheap test (the same
    decoding, without positions) found the key, so its cost is never the endpoint's to set.
    """
    pieces: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    pos = 0
    for match in pattern.finditer(text):
        begin, end = match.span()
        pieces.append(text[pos:begin])
        starts.extend(range(pos, begin))
        ends.extend(range(pos + 1, begin + 1))
        pos = end
        char = _plain_token(match)
        pieces.append(char)
        starts.extend([begin] * len(char))
        ends.extend([end] * len(char))
    if not pieces:
        return None
    pieces.append(text[pos:])
    starts.extend(range(pos, len(text)))
    ends.extend(range(pos + 1, len(text) + 1))
    return "".join(pieces), starts, ends


def _decode_one(token: str) -> str:
    """The text one escape stands for."""
    lead = token[0]
    if lead == "\\":
        if len(token) == 2:  # a backslash and one character
            return _BACKSLASH_ESCAPES.get(token[1], token[1])
        code = int(token[2:], 16)  # \xHH, \uHHHH or \UHHHHHHHH
        return chr(code) if code < 0x110000 else token  # chr takes U+0000 to U+10FFFF
    if lead == "%":
        return chr(int(token[1:], 16))
    if lead == "&":
        return html.unescape(token)
    return ""  # a blank


def _plain_token(match: re.Match[str]) -> str:
    """What one escape (or blank) decodes to, blanks dropped."""
    return _decode_one(match[0]).translate(_DROP_BLANKS)


class KeyRedactor:
    """Finds the key in texts, in every form an echo of it takes, and redacts it.

    The functions of this module take one of these instead of the key itself, so no frame
    of theirs holds the key as a local: a tool that records a traceback's locals shows only
    this object's repr, which is redacted. It refuses to be pickled.

    Found, case-insensitively: the key; any slice of it of :data:`MIN_KEY_SLICE` characters
    or more (a whole key when it is shorter); both in the text as it is, with blanks dropped
    (a key split by a line break or by characters a reader does not see: zero-width spaces,
    soft hyphens, variation selectors, any format character), and with backslash, percent
    and HTML escapes decoded (a key quoted by ``repr``, JSON, a URL or an HTML page).
    """

    __slots__ = ("_folded", "_solid")

    def __init__(self, key: str | None) -> None:
        self._folded = (key or "").translate(_ASCII_LOWER)
        self._solid = _BLANK.sub("", self._folded)

    def __repr__(self) -> str:
        return f"KeyRedactor({REDACTED!r})" if self._folded else "KeyRedactor(None)"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a KeyRedactor holds the credential; it cannot be pickled")

    def __bool__(self) -> bool:
        return bool(self._folded)

    def redact(self, text: str) -> str:
        """``text`` with every piece of the key found replaced by :data:`REDACTED`."""
        if not self._folded or not text:
            return text
        spans = self._spans(text)
        if not spans:
            return text
        kept: list[str] = []
        pos = 0
        for begin, end in spans:
            kept.append(text[pos:begin] + REDACTED)
            pos = end
        kept.append(text[pos:])
        return "".join(kept)

    def shows_key(self, text: str) -> bool:
        """Whether ``text`` holds the whole key, as it is (case-insensitively)."""
        return bool(self._folded) and self._folded in text.translate(_ASCII_LOWER)

    def trailing_prefix(self, text: str) -> int:
        """Length of the longest beginning of the key (4+ characters) ending ``text``.

        The whole key counts; a key of four characters or fewer has no such beginning.
        """
        folded = self._folded
        if len(folded) <= _MIN_KEY_PREFIX:
            return 0
        tail = text[-len(folded) :].translate(_ASCII_LOWER)
        start = tail.find(folded[:_MIN_KEY_PREFIX])
        while start >= 0:
            if folded.startswith(tail[start:]):
                return len(tail) - start
            start = tail.find(folded[:_MIN_KEY_PREFIX], start + 1)
        return 0

    def cut_prefixes(self, text: str, marker: str) -> str:
        """Replace each beginning of the key (4+ characters) followed by ``marker`` or the end.

        For texts an earlier bound cut inside the key and marked the cut with ``marker`` (not
        empty): each piece of ``text`` between markers loses its :meth:`trailing_prefix`.
        """
        pieces = text.split(marker)
        for index, piece in enumerate(pieces):
            if size := self.trailing_prefix(piece):
                pieces[index] = piece[: len(piece) - size] + REDACTED
        return marker.join(pieces)

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """The merged spans of ``text`` that show the key or a slice of it."""
        found = self._matches(text.translate(_ASCII_LOWER), self._folded)
        if self._decoded_hit(text):
            found += self._decoded_spans(text)
        found.sort()
        merged: list[tuple[int, int]] = []
        for begin, end in found:
            if merged and begin <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((begin, end))
        return merged

    def _decoded_hit(self, text: str) -> bool:
        """Whether a changed form of ``text`` shows a slice of the key (no position kept).

        The forms: blanks dropped, then escapes decoded (twice, for an echo escaped twice).
        The cheap test, at C speed but for one call per escape: positions are worked out
        only on a hit, which an endpoint cannot cause without knowing the key.
        """
        source = text.translate(_DROP_BLANKS)
        if len(source) != len(text) and self._matches(source.translate(_ASCII_LOWER), self._solid):
            return True
        for _ in range(_DECODE_ROUNDS):
            plain, count = _ESCAPE.subn(_plain_token, source)
            if count == 0:
                return False
            if self._matches(plain.translate(_ASCII_LOWER), self._solid):
                return True
            source = plain
        return False

    def _decoded_spans(self, text: str) -> list[tuple[int, int]]:
        """Spans of ``text`` whose changed forms (see :meth:`_decoded_hit`) show the key."""
        found: list[tuple[int, int]] = []
        source, starts = text, list(range(len(text)))
        ends = [i + 1 for i in starts]
        for pattern in (_BLANK, *(_ESCAPE,) * _DECODE_ROUNDS):
            mapped = _mapped(source, pattern)
            if mapped is None:
                continue
            source, inner_starts, inner_ends = mapped
            starts = [starts[i] for i in inner_starts]
            ends = [ends[i - 1] for i in inner_ends]
            for begin, end in self._matches(source.translate(_ASCII_LOWER), self._solid):
                found.append((starts[begin], ends[end - 1]))
        return found

    @staticmethod
    def _matches(text: str, key: str) -> list[tuple[int, int]]:
        """Spans of ``text`` equal to a slice of ``key`` of MIN_KEY_SLICE characters or more.

        A key of MIN_KEY_SLICE characters or fewer is searched for whole. A longer key's slice
        holds the anchor at a multiple of _STRIDE in the key, and covers the piece at a
        multiple of _STRIDE in the text: a key of up to _SEARCHED_KEY_LENGTH characters has
        those anchors searched for (one ``str.find`` each, at C speed, and one more per hit);
        a longer key's anchors are indexed, and the piece at each multiple of _STRIDE of the
        text looked up (one slice each), so the cost never grows with the key. A hit is
        extended both ways as far as text and key agree at that alignment. Both arguments
        are already case-folded.
        """
        if not key:
            return []
        spans: list[tuple[int, int]] = []
        if len(key) <= MIN_KEY_SLICE:
            start = text.find(key)
            while start != -1:
                spans.append((start, start + len(key)))
                start = text.find(key, start + 1)
            return spans
        if len(key) <= _SEARCHED_KEY_LENGTH:
            for offset in range(0, len(key) - _ANCHOR + 1, _STRIDE):
                anchor = key[offset : offset + _ANCHOR]
                hit = text.find(anchor)
                while hit != -1:
                    spans += _extend(text, key, hit, offset)
                    hit = text.find(anchor, hit + 1)
            return spans
        index: dict[str, list[int]] = {}
        for offset in range(len(key) - _ANCHOR + 1):
            index.setdefault(key[offset : offset + _ANCHOR], []).append(offset)
        for hit in range(0, len(text), _STRIDE):  # a short last piece is in no index
            for offset in index.get(text[hit : hit + _ANCHOR], ()):
                spans += _extend(text, key, hit, offset)
        return spans


def _extend(text: str, key: str, hit: int, offset: int) -> list[tuple[int, int]]:
    """The span around ``text[hit:]`` that agrees with ``key`` aligned at ``offset``."""
    shift = hit - offset  # where key[0] would sit in text
    begin, end = hit, hit + _ANCHOR
    while begin > 0 and begin - shift > 0 and text[begin - 1] == key[begin - 1 - shift]:
        begin -= 1
    while end < len(text) and end - shift < len(key) and text[end] == key[end - shift]:
        end += 1
    return [(begin, end)] if end - begin >= MIN_KEY_SLICE else []


#: The redactor of a call made without a key: only credential shapes are redacted.
NO_KEY: Final = KeyRedactor(None)


def _drop_partial_token(text: str) -> str:
    """Cut the trailing run of key characters, which a truncation may have split."""
    found = _NOT_KEY_CHAR.search(text[::-1])
    return "" if found is None else text[: len(text) - found.start()]


def _drop_key_prefix(text: str, redactor: KeyRedactor) -> str:
    """Remove a trailing beginning of the key: the text may have been cut inside it."""
    if (size := redactor.trailing_prefix(text)) == 0:
        return text
    return text[: len(text) - size].rstrip()


def redact(text: str, *, redactor: KeyRedactor) -> str:
    """``text`` with the key and credential-shaped text replaced, nothing else changed.

    For messages the library writes itself, which may quote a short piece of what the
    endpoint sent; unlike :func:`scrub` it keeps the layout and does not cut.
    """
    text = _CREDENTIAL.sub(lambda m: (m["scheme"] or "") + REDACTED, redactor.redact(text))
    return _drop_key_prefix(text, redactor)


def scrub(text: str, *, redactor: KeyRedactor, limit: int = EXCERPT_LIMIT) -> str:
    """``text`` made safe to show: no key, no credential, one line, at most ``limit`` chars.

    Replaces the key (in every form :class:`KeyRedactor` finds) and anything shaped like a
    bearer token or an API key with ``[REDACTED]``, turns control characters and line
    breaks into spaces, collapses whitespace, then cuts to ``limit`` characters ending in
    "…". Redaction runs on the whole text before any cut, so a cut never shows part of a
    key; and a text that ends with the beginning of the key (say, a body cut short by its
    reader) loses that beginning. ``limit`` must be positive.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if len(text) > MAX_SCRUB_CHARS:
        text = _drop_partial_token(text[:MAX_SCRUB_CHARS])
    text = _BLANK.sub(" ", redact(text, redactor=redactor)).strip()
    text = _drop_key_prefix(text, redactor)
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    if redactor.shows_key(text):  # only when the key is part of the marker or "…"
        return ""
    return text
