"""Unit tests for the chat-completions envelope (``_core._wire``), the error bodies it
meets (``_core._error_body``) and the scrubbing of what they quote (``_core._redact``).

The reply and error-body tables live in ``tests/core/envelopes/*.json``: one case per
provider shape or policy rule, each named, so a new provider quirk is one more JSON entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metacrate_grid_agent._core._error_body import (
    MAX_ERROR_BODY_BYTES,
    MESSAGE_LIMIT,
    ErrorDetails,
    parse_error_body,
)
from metacrate_grid_agent._core._redact import (
    EXCERPT_LIMIT,
    MAX_SCRUB_CHARS,
    NO_KEY,
    KeyRedactor,
    scrub,
)
from metacrate_grid_agent._core._request import encode_request, encode_tools
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
from metacrate_grid_agent._core._wire import (
    MAX_PATH_LENGTH,
    ParsedReply,
    ReplyLimits,
    _translate,
    decode_reply,
)
from metacrate_grid_agent.config import REDACTED, LLMConfig, Secret
from metacrate_grid_agent.errors import (
    ChoiceError,
    InvalidMessageError,
    InvalidValueError,
    MissingCallIdError,
    ResponseError,
    error_kinds,
)

if TYPE_CHECKING:
    from collections.abc import Callable

ENVELOPES = Path(__file__).parent / "envelopes"
REQUEST_ID = "req-0001"
CONFIG = LLMConfig(
    endpoint_url="https://llm.example/v1/chat/completions", api_key=Secret("grid-test-key")
)
LIMITS = ReplyLimits.from_config(CONFIG)
MINTING = dataclasses.replace(LIMITS, mint_missing_call_ids=True)


def load(name: str) -> Any:
    """A JSON data file of the envelope tables."""
    return json.loads((ENVELOPES / name).read_text("utf-8"))


def body_of(case: dict[str, Any]) -> bytes:
    """The body bytes of a table case: ``raw`` text, ``raw_hex`` bytes or a JSON ``body``."""
    if "raw" in case:
        return str(case["raw"]).encode()
    if "raw_hex" in case:
        return bytes.fromhex(case["raw_hex"])
    return json.dumps(case["body"]).encode()


def decode(body: bytes, limits: ReplyLimits = LIMITS) -> ParsedReply:
    """Decode with the default request id."""
    return decode_reply(body, limits, request_id=REQUEST_ID)


def reply_body(message: dict[str, Any], **choice: Any) -> bytes:
    """A minimal reply body around one message."""
    return json.dumps({"choices": [{"index": 0, "message": message, **choice}]}).encode()


REPLIES: list[dict[str, Any]] = load("replies.json")
GOOD = [case for case in REPLIES if "expect" in case]
BAD = [case for case in REPLIES if "error" in case]
ERROR_BODIES: dict[str, Any] = load("error_bodies.json")


# --- the reply table --------------------------------------------------------------------


@pytest.mark.parametrize("case", GOOD, ids=[case["name"] for case in GOOD])
def test_reply_table(case: dict[str, Any]) -> None:
    """Each provider's reply shape maps to exactly the expected text, calls, usage and finish.

    A ``null`` id in the table stands for a minted one; no reasoning ("CANARY") survives.
    """
    limits = dataclasses.replace(LIMITS, **case.get("limits", {}))
    reply = decode(body_of(case), limits)
    actual = {
        "text": reply.text,
        "tool_calls": [
            [None if call.id in reply.minted_call_ids else call.id, call.name, call.arguments]
            for call in reply.tool_calls
        ],
        "usage": None if reply.usage is None else msgspec.structs.asdict(reply.usage),
        "finish_reason": reply.finish_reason,
    }
    assert case["expect"] == actual
    assert len(reply.minted_call_ids) == sum(c[0] is None for c in case["expect"]["tool_calls"])
    assert "CANARY" not in repr(reply)


@pytest.mark.parametrize("case", BAD, ids=[case["name"] for case in BAD])
def test_reply_error_table(case: dict[str, Any]) -> None:
    """Each malformed or refused reply raises its documented kind at the offending JSON path.

    The class is the one registered for the kind, never retryable (the same body would
    come back), and an oversize message names the setting to raise.
    """
    limits = dataclasses.replace(LIMITS, **case.get("limits", {}))
    with pytest.raises(ResponseError) as info:
        decode(body_of(case), limits)
    error = info.value
    assert (case["error"]["kind"], case["error"]["path"]) == (error.kind, error.path)
    assert type(error) is error_kinds()[error.kind]
    assert not error.retryable
    assert error.message
    if error.kind == "oversized_value" and not str(error.path).endswith("finish_reason"):
        assert re.search(r"max_\w+ = \d+", error.message)


def test_reasoning_never_surfaces() -> None:
    """Reasoning in any member or a ``<think>`` prefix appears in no field and no repr."""
    canary = "CANARY-REASONING"
    message = {
        "role": "assistant",
        "content": f"  <think>{canary}</think>\n\nVisible answer.",
        "reasoning_content": canary,
        "reasoning": canary,
        "reasoning_details": [{"type": "reasoning.text", "text": canary}],
        "thinking_blocks": [{"type": "thinking", "thinking": canary, "signature": canary}],
        "provider_specific_fields": {"thinking": canary},
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "look", "arguments": "{}", "thinking": canary},
                "extra_content": {"google": {"thought_signature": canary}},
            }
        ],
    }
    parts = {
        "content": [
            {"type": "thinking", "thinking": canary},
            {"type": "reasoning", "text": canary},
            {"type": "text", "text": f"<think>{canary}</think>Visible answer."},
        ]
    }
    for body in (reply_body(message), reply_body(parts, reasoning_content=canary)):
        reply = decode(body)
        assert reply.text == "Visible answer."
        shown = [repr(reply), str(reply.text), str(reply.finish_reason), repr(reply.usage)]
        for call in reply.tool_calls:
            shown += [repr(call), call.id, call.name, call.arguments]
        assert not [text for text in shown if canary in text]


def _with_arguments(arguments: str) -> bytes:
    """A reply with one tool call whose ``arguments`` member is this JSON text, as it is."""
    return (
        '{"choices":[{"message":{"tool_calls":[{"id":"a","function":'
        f'{{"name":"f","arguments":{arguments}}}}}]}}}}]}}'
    ).encode()


def test_deep_nesting_is_a_response_error() -> None:
    """A pathologically nested value raises InvalidValueError, not RecursionError."""
    depth = 20_000
    with pytest.raises(InvalidValueError) as info:
        decode(_with_arguments('{"a":' * depth + "1" + "}" * depth))
    assert info.value.path == "$"


def test_the_path_of_a_deeply_nested_invalid_value_is_bounded() -> None:
    """The JSON path quoted for an invalid value deep in a reply has a bound, like all text.

    Protects: an endpoint nesting a bad number hundreds of levels deep inside the arguments
    got a message (and ``path``) of one "[...]" per level: 3 KiB at 600 levels. The path
    keeps its readable beginning and says it was cut.
    """
    depth = 600
    with pytest.raises(InvalidValueError) as info:
        decode(_with_arguments('{"e":' * depth + "1e999" + "}" * depth))
    path = info.value.path
    assert path is not None
    assert path.startswith("$.choices[0].message.tool_calls[0].function.arguments")
    assert len(path) <= MAX_PATH_LENGTH
    assert path.endswith("…")
    assert len(str(info.value)) <= MAX_PATH_LENGTH + 250


@pytest.mark.parametrize(("length", "cut"), [(MAX_PATH_LENGTH, False), (MAX_PATH_LENGTH + 1, True)])
def test_a_path_is_cut_only_past_its_bound(length: int, cut: bool) -> None:
    """A path of exactly MAX_PATH_LENGTH characters is quoted whole; one more is cut to it."""
    path = "$" + "x" * (length - 1)
    error = _translate(msgspec.ValidationError(f"Expected `str`, got `int` - at `{path}`"))
    assert error.path == (path[: MAX_PATH_LENGTH - 1] + "…" if cut else path)
    assert str(error).endswith(f" at {error.path}: expected `str`, got `int`")


def test_choice_error_message_is_scrubbed() -> None:
    """A provider's error in a 200 reply is reported with its message, minus key shapes."""
    body = reply_body(
        {"content": ""},
        error={"message": "upstream rejected sk-live-0123456789abcdef", "code": 502},
    )
    with pytest.raises(ChoiceError) as info:
        decode(body)
    assert "upstream rejected [REDACTED]" in info.value.message
    assert "code 502" in info.value.message
    assert "0123456789" not in info.value.message


# --- tool-call ids ----------------------------------------------------------------------


def minted(request_id: str, index: int) -> str:
    """The documented id formula for call ``index`` of a reply to ``request_id``."""
    digest = hashlib.blake2b(f"{request_id}:{index}".encode(), digest_size=8).hexdigest()
    return f"minted-{digest}"


NO_IDS = reply_body(
    {"tool_calls": [{"function": {"name": "a"}}, {"id": "", "function": {"name": "b"}}]}
)


def test_minted_ids_follow_the_documented_formula() -> None:
    """A minted id derives from the request id and the call's position, and is listed."""
    reply = decode(NO_IDS, MINTING)
    expected = [minted(REQUEST_ID, 0), minted(REQUEST_ID, 1)]
    assert expected == [call.id for call in reply.tool_calls]
    assert frozenset(expected) == reply.minted_call_ids


def test_minted_ids_are_deterministic_per_request() -> None:
    """The same reply to the same request gets the same ids; another request gets others."""
    first = decode_reply(NO_IDS, MINTING, request_id="req-a")
    again = decode_reply(NO_IDS, MINTING, request_id="req-a")
    other = decode_reply(NO_IDS, MINTING, request_id="req-b")
    assert first == again
    assert not first.minted_call_ids & other.minted_call_ids


def test_minted_id_never_repeats_a_provider_id() -> None:
    """A minted id that would equal an id the provider sent is replaced by a distinct one."""
    taken = minted(REQUEST_ID, 1)
    body = reply_body(
        {"tool_calls": [{"id": taken, "function": {"name": "a"}}, {"function": {"name": "b"}}]}
    )
    reply = decode(body, MINTING)
    ids = [call.id for call in reply.tool_calls]
    assert ids[0] == taken
    assert ids[1] != taken
    assert ids[1].startswith("minted-")
    assert reply.minted_call_ids == frozenset({ids[1]})


def test_missing_id_message_names_the_switch() -> None:
    """Refusing a call without an id tells the user which setting accepts such calls."""
    with pytest.raises(MissingCallIdError) as info:
        decode(NO_IDS)
    assert "mint_missing_call_ids = true" in info.value.message
    assert info.value.path == "$.choices[0].message.tool_calls[0].id"


# --- limits -----------------------------------------------------------------------------


def test_limits_come_from_the_config() -> None:
    """``ReplyLimits.from_config`` carries every reply bound of the ``[llm]`` table."""
    config = msgspec.structs.replace(
        CONFIG,
        max_text_bytes=1000,
        max_tool_calls=3,
        max_argument_bytes=200,
        max_id_length=40,
        max_name_length=32,
        mint_missing_call_ids=True,
    )
    expected = ReplyLimits(
        max_text_bytes=1000,
        max_tool_calls=3,
        max_argument_bytes=200,
        max_id_length=40,
        max_name_length=32,
        mint_missing_call_ids=True,
    )
    assert expected == ReplyLimits.from_config(config)


def test_limits_refuse_ids_the_public_types_would_refuse() -> None:
    """An id limit above what ``ToolCall`` accepts fails early, not as a non-response error."""
    with pytest.raises(ValueError, match="at most"):
        dataclasses.replace(LIMITS, max_id_length=5000)


# --- requests ---------------------------------------------------------------------------


def test_encode_request_is_the_exact_openai_shape() -> None:
    """Every message type serialises to the chat-completions wire shape, byte for byte."""
    call = ToolCall.create("call_1", "look", '{"dir":"north"}')
    messages: list[Message] = [
        SystemMessage(content="Be brief."),
        SystemMessage(content=(TextPart(text="Rule one."),)),
        UserMessage(content="Hi, é."),
        UserMessage(
            content=(
                TextPart(text="What is here?"),
                ImagePart.of("https://img.example/a.png", "low"),
                ImagePart.of("data:image/png;base64,iVBORw0KGgo="),
            )
        ),
        AssistantMessage(content="Looking."),
        AssistantMessage(tool_calls=(call,)),
        AssistantMessage(content="Both.", tool_calls=(call,)),
        ToolMessage(tool_call_id="call_1", content="A door."),
        ToolMessage(tool_call_id="call_1", content=(TextPart(text="A door."),)),
    ]
    schema = {"type": "object", "properties": {"dir": {"type": "string"}}, "required": ["dir"]}
    tools = [ToolDefinition.create("look", "Look around.", schema)]
    wire_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "look", "arguments": '{"dir":"north"}'},
    }
    expected = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": [{"type": "text", "text": "Rule one."}]},
            {"role": "user", "content": "Hi, é."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is here?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://img.example/a.png", "detail": "low"},
                    },
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
                    },
                ],
            },
            {"role": "assistant", "content": "Looking."},
            {"role": "assistant", "tool_calls": [wire_call]},
            {"role": "assistant", "content": "Both.", "tool_calls": [wire_call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "A door."},
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": [{"type": "text", "text": "A door."}],
            },
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "look", "description": "Look around.", "parameters": schema},
            }
        ],
    }
    compact = json.dumps(expected, separators=(",", ":"), ensure_ascii=False).encode()
    assert compact == encode_request(messages, tools)
    # Tools serialised once and spliced in give the same bytes.
    assert compact == encode_request(messages, tools, tools_json=encode_tools(tools))


@pytest.mark.parametrize("tools", [[], ()], ids=["list", "tuple"])
def test_encode_request_omits_empty_tools(tools: list[ToolDefinition] | tuple[()]) -> None:
    """Without tools the body is ``messages`` alone: no tools, model or stream member."""
    expected = b'{"messages":[{"role":"user","content":"hi"}]}'
    assert expected == encode_request((UserMessage(content="hi"),), tools)


def test_encode_request_accepts_read_only_schemas() -> None:
    """A schema given as a read-only mapping serialises like a dict."""
    schema = types.MappingProxyType({"type": "object"})
    body = encode_request([UserMessage(content="hi")], [ToolDefinition.create("f", "", schema)])
    assert b'"function":{"name":"f","parameters":{"type":"object"}}' in body


def test_encode_request_refuses_values_that_are_not_json() -> None:
    """A schema holding a non-JSON value raises InvalidMessageError, never a msgspec error."""
    tool = ToolDefinition.create("f", "", {"default": object()})
    with pytest.raises(InvalidMessageError, match="cannot be serialised"):
        encode_request([UserMessage(content="hi")], [tool])
    with pytest.raises(InvalidMessageError, match="cannot be serialised"):
        encode_tools([tool])


# --- error bodies -----------------------------------------------------------------------

SECRET: str = ERROR_BODIES["secret"]


@pytest.mark.parametrize(
    "case", ERROR_BODIES["cases"], ids=[case["name"] for case in ERROR_BODIES["cases"]]
)
def test_error_body_table(case: dict[str, Any]) -> None:
    """Each common error shape yields its message, type and code; anything else an excerpt."""
    details = parse_error_body(
        body_of(case), redactor=KeyRedactor(SECRET), content_type=case.get("content_type")
    )
    assert case["expect"] == dataclasses.asdict(details)


def test_error_message_is_cut_after_scrubbing() -> None:
    """A long provider message is cut to MESSAGE_LIMIT characters, ending in an ellipsis."""
    body = json.dumps({"error": {"message": "word " * 400}}).encode()
    message = parse_error_body(body, redactor=KeyRedactor(SECRET)).message
    assert message is not None
    assert len(message) == MESSAGE_LIMIT
    assert message.endswith("…")


def test_json_escaped_secret_is_redacted_in_excerpts() -> None:
    """A key with JSON-escaped characters is redacted in its escaped form too."""
    secret = 'ab"cd\\ef-0123456789'
    body = b'{"unknown": ' + json.dumps(secret).encode() + b"}"
    details = parse_error_body(body, redactor=KeyRedactor(secret))
    assert ErrorDetails(None, None, None, '{"unknown":"[REDACTED]"}') == details


def test_unicode_escaped_secret_is_redacted_in_excerpts() -> None:
    """JSON may spell any character as an escape; the excerpt is re-encoded plainly first."""
    escaped = "".join(f"\\u{ord(c):04x}" if c == "-" else c for c in SECRET)
    body = b'{"received": "' + escaped.encode() + b'"}'
    assert SECRET not in body.decode()
    details = parse_error_body(body, redactor=KeyRedactor(SECRET))
    assert ErrorDetails(None, None, None, '{"received":"[REDACTED]"}') == details


def test_error_body_cut_never_shows_part_of_the_key() -> None:
    """A key split by the MAX_ERROR_BODY_BYTES cut is dropped whole, not shown in part."""
    body = b" " * (MAX_ERROR_BODY_BYTES - 10) + SECRET.encode() + b" tail"
    assert ErrorDetails(None, None, None, None) == parse_error_body(
        body, redactor=KeyRedactor(SECRET)
    )


def test_error_body_cut_by_the_reader_never_shows_part_of_the_key() -> None:
    """A body a reader already cut inside the key (no way to know it) shows none of it."""
    body = b"invalid key: " + SECRET.encode()[:12]
    assert ErrorDetails(None, None, None, "invalid key: [REDACTED]") == parse_error_body(
        body, redactor=KeyRedactor(SECRET)
    )
    body = b"invalid key: " + SECRET.encode()[:8]
    assert ErrorDetails(None, None, None, "invalid key:") == parse_error_body(
        body, redactor=KeyRedactor(SECRET)
    )
    body = b"<p>" + b" " * (MAX_ERROR_BODY_BYTES - 10) + SECRET.encode()[:7]
    assert ErrorDetails(None, None, None, None) == parse_error_body(
        body, redactor=KeyRedactor(SECRET)
    )


def test_large_error_body_is_read_only_in_part() -> None:
    """A huge body yields a short excerpt from its beginning."""
    details = parse_error_body(b"abc " * (4 << 20), redactor=KeyRedactor(SECRET))
    assert details.excerpt is not None
    assert details.excerpt.startswith("abc abc")
    assert len(details.excerpt) == EXCERPT_LIMIT


# --- scrub ------------------------------------------------------------------------------


def test_scrub_redacts_before_cutting() -> None:
    """A key straddling the cut is redacted whole first, so no prefix of it is shown."""
    expected = "x" * 195 + "[RED…"
    assert expected == scrub("x" * 195 + SECRET, redactor=KeyRedactor(SECRET))
    out = scrub("x" * 190 + " sk-" + "A1" * 20, redactor=NO_KEY)
    assert "sk-A" not in out


def test_scrub_cuts_long_input_at_a_token_boundary() -> None:
    """Input beyond MAX_SCRUB_CHARS is dropped without leaving part of a key at the cut."""
    out = scrub(" " * (MAX_SCRUB_CHARS - 5) + SECRET + " end", redactor=KeyRedactor(SECRET))
    assert not out


def test_scrub_redacts_credential_shapes() -> None:
    """Bearer tokens and common API-key shapes are redacted even when no secret is given."""
    text = "Authorization: bearer abc.DEF_123-xyz sk-ant-api03-AbCdEfGh12 AIza" + "x" * 35
    assert f"Authorization: bearer {REDACTED} {REDACTED} {REDACTED}" == scrub(text, redactor=NO_KEY)


def test_scrub_flattens_control_characters() -> None:
    """Line breaks, control and invisible formatting characters become single spaces."""
    expected = "a b c d e"
    assert expected == scrub("\n a\r\n\tb\x00c\u2028d\u202ee \x7f", redactor=NO_KEY)


def test_scrub_refuses_a_limit_below_one() -> None:
    """A limit of zero is a programming error, not an empty excerpt."""
    with pytest.raises(ValueError, match="at least 1"):
        scrub("text", redactor=NO_KEY, limit=0)


# --- properties -------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def usually(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly (7 in 8) the well-typed value, now and then any JSON value at all."""
    return st.sampled_from([True] * 7 + [False]).flatmap(lambda ok: good if ok else json_values)


def seldom(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly null, now and then ``value``."""
    return st.one_of(st.none(), st.none(), st.none(), value)


def members(
    required: dict[str, st.SearchStrategy[Any]] | None = None, **optional: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    """An object with the ``required`` members and each optional one present or absent."""
    return st.fixed_dictionaries(required or {}, optional=optional)


arguments_like = st.text(max_size=12) | st.dictionaries(
    st.text(max_size=4), json_scalars, max_size=3
)
functions_like = members(
    {"name": usually(st.sampled_from(["f", "f", "walk_far", ""]))},
    arguments=usually(arguments_like),
)
ids_like = st.text(min_size=1, max_size=12) | st.sampled_from(["call_long_id", "a", ""])
calls_like = members(
    {"function": usually(functions_like), "id": usually(ids_like)},
    type=usually(st.just("function")),
)
parts_like = members(
    type=usually(st.sampled_from(["text", "thinking"])), text=usually(st.text(max_size=20))
)
content_like = (
    st.text(max_size=30)
    | st.sampled_from(["<think>x</think> y", "<think>", "é" * 20])
    | st.lists(parts_like, max_size=3)
)
messages_like = members(
    {"tool_calls": usually(st.lists(calls_like, max_size=3))},
    content=usually(content_like),
    reasoning_content=json_values,
)
choices_like = members(
    {"message": usually(messages_like)},
    finish_reason=usually(st.sampled_from(["stop", "tool_calls", "length", "error"])),
    error=seldom(json_values),
)
counts_like = usually(st.integers(0, 10**6) | st.integers(min_value=-1, max_value=2**54))
reply_like = members(
    {"choices": usually(st.lists(choices_like, min_size=1, max_size=2))},
    usage=usually(members(prompt_tokens=counts_like, total_tokens=counts_like)),
    error=seldom(json_values),
)
# The first value of each list is the one Hypothesis favours: the roomy one.
small_limits = st.builds(
    ReplyLimits,
    max_text_bytes=st.sampled_from([1 << 16, 8, 1]),
    max_tool_calls=st.sampled_from([32, 2, 0]),
    max_argument_bytes=st.sampled_from([1 << 16, 16, 2]),
    max_id_length=st.sampled_from([256, 4]),
    max_name_length=st.sampled_from([64, 4]),
    mint_missing_call_ids=st.booleans(),
)


def decode_checked(body: bytes, limits: ReplyLimits) -> None:
    """Decode; a ResponseError is fine, a result must respect every bound."""
    try:
        reply = decode(body, limits)
    except ResponseError:
        return
    if reply.text is not None:
        assert reply.text
        assert len(reply.text.encode()) <= limits.max_text_bytes
    ids = [call.id for call in reply.tool_calls]
    assert len(ids) <= limits.max_tool_calls
    assert len(set(ids)) == len(ids)
    assert reply.minted_call_ids <= set(ids)
    for call in reply.tool_calls:
        assert len(call.arguments.encode()) <= limits.max_argument_bytes
        assert 0 < len(call.name) <= limits.max_name_length
        assert call.id in reply.minted_call_ids or len(call.id) <= limits.max_id_length


@settings(max_examples=300)
@given(body=st.binary(max_size=300), limits=small_limits)
def test_any_bytes_decode_or_raise_a_response_error(body: bytes, limits: ReplyLimits) -> None:
    """Arbitrary bytes either decode within bounds or raise a ResponseError, nothing else."""
    decode_checked(body, limits)


@pytest.mark.slow
@settings(max_examples=300)
@given(value=json_values, limits=small_limits)
def test_any_json_decodes_or_raises_a_response_error(value: Any, limits: ReplyLimits) -> None:
    """Arbitrary JSON values either decode within bounds or raise a ResponseError."""
    decode_checked(json.dumps(value).encode(), limits)


@pytest.mark.slow
@settings(max_examples=200)
@given(value=reply_like, limits=small_limits)
def test_reply_like_json_decodes_or_raises_a_response_error(
    value: dict[str, Any], limits: ReplyLimits
) -> None:
    """Reply-shaped JSON with any value in any member stays within bounds or raises ours."""
    decode_checked(json.dumps(value).encode(), limits)


@settings(max_examples=200)
@given(case=st.sampled_from(GOOD), data=st.data())
def test_damaged_replies_decode_or_raise_a_response_error(
    case: dict[str, Any], data: st.DataObject
) -> None:
    """A real reply cut short or with one byte changed still raises only a ResponseError."""
    body = body_of(case)
    index = data.draw(st.integers(0, max(len(body) - 1, 0)))
    flipped = body[:index] + bytes([body[index] ^ 0x20]) + body[index + 1 :] if body else body
    damaged = data.draw(st.sampled_from([body[:index], flipped]))
    decode_checked(damaged, LIMITS)


key_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=8, max_size=40)


def as_json(shape: Callable[[str], Any]) -> Callable[[str], bytes]:
    """A body builder serialising ``shape(text)`` as JSON."""
    return lambda text: json.dumps(shape(text)).encode()


ERROR_SHAPES: list[Callable[[str], bytes]] = [
    lambda text: text.encode(),
    lambda text: f"<p>{text}</p>".encode(),
    lambda text: ('{"error": "' + text).encode(),
    lambda text: (text + "\n\x00").encode(),
    as_json(lambda text: {"error": {"message": text, "type": text, "code": text}}),
    as_json(lambda text: {"error": text, "error_type": text}),
    as_json(lambda text: [{"error": {"message": text, "status": text}}]),
    as_json(lambda text: {"object": "error", "message": text, "type": "x", "code": 400}),
    as_json(lambda text: {"detail": [{"loc": ["body", text], "msg": text}]}),
    as_json(lambda text: {"detail": text}),
    as_json(lambda text: {"unknown": text}),
]


@pytest.mark.slow
@settings(max_examples=300)
@given(
    secret=key_text,
    before=st.text(max_size=30),
    after=st.text(max_size=30),
    shape=st.sampled_from(ERROR_SHAPES),
    content_type=st.sampled_from([None, "application/json", "text/html", "text/plain"]),
)
def test_error_bodies_never_raise_or_leak_the_key(
    secret: str,
    before: str,
    after: str,
    shape: Callable[[str], bytes],
    content_type: str | None,
) -> None:
    """However the key is embedded in an error body, no returned string shows it."""
    details = parse_error_body(
        shape(before + secret + after), redactor=KeyRedactor(secret), content_type=content_type
    )
    for value in dataclasses.astuple(details):
        assert value is None or (secret not in value and len(value) <= MESSAGE_LIMIT)


@pytest.mark.slow
@settings(max_examples=300)
@given(
    text=st.text(max_size=300),
    secret=st.none() | st.text(min_size=1, max_size=12) | key_text,
    limit=st.integers(1, 300),
)
def test_scrub_is_bounded_and_never_shows_the_secret(
    text: str, secret: str | None, limit: int
) -> None:
    """Scrubbed text fits the limit, is one clean line, and never contains the secret."""
    out = scrub(text + (secret or "") + text, redactor=KeyRedactor(secret), limit=limit)
    assert len(out) <= limit
    assert out == out.strip()
    assert not re.search(r"[\x00-\x1f\x7f-\x9f]|\s\s", out)
    if secret:
        assert secret not in out


@settings(max_examples=200)
@given(text=st.text(max_size=100), secret=key_text, data=st.data())
def test_scrub_never_ends_with_the_beginning_of_the_key(
    text: str, secret: str, data: st.DataObject
) -> None:
    """A text cut inside the key (by whoever read it) loses the piece of the key it shows."""
    piece = secret[: data.draw(st.integers(4, len(secret)))]
    out = scrub(text + piece, redactor=KeyRedactor(secret), limit=1000)
    assert not out.endswith(piece)
