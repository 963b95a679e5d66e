"""Hostile nesting and shape fuzzing of the two parsers that read endpoint bytes.

``decode_reply`` (2xx bodies) and ``parse_error_body`` (error bodies) read whatever the
endpoint sends. The properties kept here, for any input:

* only our typed errors (:class:`GridAgentError` subclasses) escape ``decode_reply``;
* ``parse_error_body`` never raises;
* nothing is unbounded: every string and count returned or quoted has its cap, and no
  string returned by ``parse_error_body`` contains the key.

The inputs are JSON *text* built directly (so nesting is not limited by Python's own
recursion): nesting up to and far beyond the recursion limit, numbers of thousands of
digits and out-of-range exponents, every container type (and every scalar) in every
position of a real provider reply from ``tests/core/envelopes/``, and byte-level mutations
of those replies. The default profile runs 100 examples a property (seconds); the long
profile (``HYPOTHESIS_PROFILE=long``, see ``tests/proof_profiles.py``) runs 100,000.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metacrate_grid_agent._core._error_body import MESSAGE_LIMIT, ErrorDetails, parse_error_body
from metacrate_grid_agent._core._redact import EXCERPT_LIMIT, KeyRedactor
from metacrate_grid_agent._core._wire import (
    MAX_FINISH_REASON_LENGTH,
    ParsedReply,
    ReplyLimits,
    decode_reply,
)
from metacrate_grid_agent.errors import ChoiceError, GridAgentError, ResponseError

if TYPE_CHECKING:
    from collections.abc import Callable

ENVELOPES: Final = Path(__file__).parent / "envelopes"
#: A key no credential pattern recognises: only the literal-key redaction can hide it.
SECRET: Final = "grid-fuzz-key-5e1b9c0d7a3f4826b4c2"
REQUEST_ID: Final = "fuzz-g0-t1"
LIMITS: Final = ReplyLimits(
    max_text_bytes=4096,
    max_tool_calls=8,
    max_argument_bytes=4096,
    max_id_length=64,
    max_name_length=64,
    mint_missing_call_ids=True,
)
STRICT_IDS: Final = ReplyLimits(
    max_text_bytes=4096,
    max_tool_calls=8,
    max_argument_bytes=4096,
    max_id_length=64,
    max_name_length=64,
    mint_missing_call_ids=False,
)
#: Longest message a typed error from ``decode_reply`` may carry (its parts are capped at
#: 200 to 500 characters each; this only says "bounded", with room to spare).
MAX_ERROR_TEXT: Final = 4096
#: Members the parsers read, so hostile values land where they are looked at.
READ_KEYS: Final = (
    "error", "message", "msg", "detail", "loc", "type", "code", "status", "error_type",
    "choices", "content", "tool_calls", "function", "name", "arguments", "id", "usage",
    "prompt_tokens", "completion_tokens", "total_tokens", "finish_reason", "text",
)  # fmt: skip
LIMIT: Final = sys.getrecursionlimit()


def _load(name: str) -> list[dict[str, Any]]:
    data = json.loads((ENVELOPES / name).read_text("utf-8"))
    cases: list[dict[str, Any]] = data["cases"] if isinstance(data, dict) else data
    return [case for case in cases if "body" in case]


REPLIES: Final = [case["body"] for case in _load("replies.json")]
ERROR_BODIES: Final = [case["body"] for case in _load("error_bodies.json")]


# --- deep nesting ----------------------------------------------------------------------------


def _nested_loc(depth: int) -> bytes:
    """An error body whose ``detail[0].loc[0]`` is a list nested ``depth`` levels deep."""
    return ('{"detail":[{"msg":"x","loc":[' + "[" * depth + "]" * depth + "]}]}").encode()


# --- JSON text strategies --------------------------------------------------------------------

_huge_numbers = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
    st.integers(min_value=1, max_value=5000).map(lambda n: "9" * n),
    st.integers(min_value=1, max_value=5000).map(lambda n: "-0." + "1" * n + "e-99999"),
    st.sampled_from(["1e999", "-1e999", "1e-999", "-0", "0.0e0", "9007199254740993", "1E+400"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
_strings = st.one_of(
    st.text(max_size=64).map(json.dumps),
    st.sampled_from([SECRET, "Bearer " + SECRET, "<script>" + SECRET, "sk-" + "a" * 40]).map(
        json.dumps
    ),
    st.sampled_from(['"\\ud800"', '"\\u0000"', '"<think>"', '"</think>"', '"function"', '""']),
)
_scalars = st.one_of(st.sampled_from(["null", "true", "false"]), _huge_numbers, _strings)


def _array(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"


def _object(members: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members) + "}"


_keys = st.one_of(st.sampled_from(READ_KEYS), st.text(max_size=8))
_shallow = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(_array),
        st.lists(st.tuples(_keys, inner), max_size=4).map(_object),
    ),
    max_leaves=12,
)

#: Opening and closing text of one nesting level, by container kind.
_LEVELS: Final[dict[str, tuple[str, str]]] = {
    "list": ("[", "]"),
    "object": ('{"a":', "}"),
    "message": ('{"message":', "}"),
    "error": ('{"error":', "}"),
    "detail": ('{"detail":[{"msg":"m","loc":', "]}]}"),
}


@st.composite
def deep(draw: st.DrawFn) -> str:
    """A value nested up to and beyond the recursion limit, levels of any container kind."""
    depth = draw(
        st.one_of(
            st.integers(min_value=0, max_value=64),
            st.integers(min_value=LIMIT - 200, max_value=LIMIT + 50),
            st.integers(min_value=0, max_value=20_000),
        )
    )
    kinds = draw(st.lists(st.sampled_from(sorted(_LEVELS)), min_size=1, max_size=3))
    leaf = draw(_shallow)
    opening = "".join(_LEVELS[kinds[i % len(kinds)]][0] for i in range(depth))
    closing = "".join(_LEVELS[kinds[i % len(kinds)]][1] for i in reversed(range(depth)))
    return opening + leaf + closing


hostile = st.one_of(_scalars, _shallow, deep())

_HOLE: Final = "\u0000hole\u0000"


def _positions(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every position in a decoded JSON document (the root included)."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_positions(item, (*path, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_positions(item, (*path, index)))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {k: _replace(v, rest, new) if k == head else v for k, v in value.items()}
    return [_replace(v, rest, new) if i == head else v for i, v in enumerate(value)]


@st.composite
def spliced(draw: st.DrawFn, documents: list[Any]) -> bytes:
    """A real document with one position replaced, or one member added, by a hostile value."""
    document = draw(st.sampled_from(documents))
    path = draw(st.sampled_from(_positions(document)))
    if draw(st.booleans()):
        target = json.loads(json.dumps(document))
        node = target
        for step in path:
            node = node[step]
        if isinstance(node, dict):  # add a member rather than replace the object
            node[draw(st.sampled_from(READ_KEYS))] = _HOLE
            text = json.dumps(target)
            return text.replace(json.dumps(_HOLE), draw(hostile)).encode("utf-8", "surrogatepass")
    text = json.dumps(_replace(document, path, _HOLE))
    return text.replace(json.dumps(_HOLE), draw(hostile)).encode("utf-8", "surrogatepass")


_MUTATIONS: Final[tuple[str, ...]] = ("truncate", "delete", "duplicate", "insert", "flip")
_INSERTS: Final = (
    b"[",
    b"{",
    b"]",
    b"}",
    b'"',
    b"\\",
    b",",
    b":",
    b"\x00",
    b"\xff",
    b"\xef\xbb\xbf",
)


@st.composite
def mutated(draw: st.DrawFn, documents: list[Any]) -> bytes:
    """A real document's bytes with a few byte-level mutations (cuts, splices, bad bytes)."""
    data = bytearray(json.dumps(draw(st.sampled_from(documents))).encode())
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        at = draw(st.integers(min_value=0, max_value=len(data)))
        kind = draw(st.sampled_from(_MUTATIONS))
        if kind == "truncate":
            del data[at:]
        elif kind == "delete":
            del data[at : at + draw(st.integers(min_value=1, max_value=16))]
        elif kind == "duplicate":
            data[at:at] = data[at : at + draw(st.integers(min_value=1, max_value=64))]
        elif kind == "insert":
            data[at:at] = draw(st.sampled_from(_INSERTS)) * draw(st.integers(1, 3))
        elif at < len(data):
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
    return bytes(data)


reply_bodies = st.one_of(
    spliced(REPLIES),
    mutated(REPLIES),
    spliced(ERROR_BODIES),
    hostile.map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.binary(max_size=256),
)
error_bodies = st.one_of(
    spliced(ERROR_BODIES),
    mutated(ERROR_BODIES),
    spliced(REPLIES),
    hostile.map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.binary(max_size=256),
)


# --- properties ------------------------------------------------------------------------------


def _run(action: Callable[[], Any]) -> Any:
    """``action()``: any exception but the typed ones the caller expects fails the test."""
    return action()


def _check_reply(reply: ParsedReply, limits: ReplyLimits) -> None:
    assert reply.text is None or len(reply.text.encode()) <= limits.max_text_bytes
    assert len(reply.tool_calls) <= limits.max_tool_calls
    for call in reply.tool_calls:
        assert 0 < len(call.id) <= max(limits.max_id_length, 24)
        assert 0 < len(call.name) <= limits.max_name_length
        assert len(call.arguments.encode()) <= limits.max_argument_bytes
    assert len({call.id for call in reply.tool_calls}) == len(reply.tool_calls)
    assert reply.finish_reason is None or len(reply.finish_reason) <= MAX_FINISH_REASON_LENGTH


def _decode_or_typed_error(body: bytes, limits: ReplyLimits) -> None:
    error: GridAgentError | None = None
    try:
        reply = _run(
            lambda: decode_reply(body, limits, request_id=REQUEST_ID, redactor=KeyRedactor(SECRET))
        )
    except GridAgentError as exc:
        error = exc
    else:
        _check_reply(reply, limits)
    assert error is None or len(str(error)) <= MAX_ERROR_TEXT


def _check_details(details: ErrorDetails) -> None:
    assert isinstance(details, ErrorDetails)
    # A message that scrubs to nothing (control characters only) is None, never "".
    assert details.message is None or 0 < len(details.message) <= MESSAGE_LIMIT
    for text in (details.type, details.code, details.excerpt):
        assert text is None or len(text) <= EXCERPT_LIMIT
    for text in (details.message, details.type, details.code, details.excerpt):
        assert text is None or SECRET.lower() not in text.lower()


@given(body=reply_bodies)
def test_decode_reply_raises_only_typed_errors(body: bytes) -> None:
    """Any 2xx body decodes within its limits or raises one of our typed errors."""
    _decode_or_typed_error(body, LIMITS)


@given(body=reply_bodies)
def test_decode_reply_without_minting_raises_only_typed_errors(body: bytes) -> None:
    """Without minted ids too: a missing or repeated id is a typed error, nothing else."""
    _decode_or_typed_error(body, STRICT_IDS)


@given(body=error_bodies, content_type=st.sampled_from([None, "application/json", "text/html"]))
def test_parse_error_body_never_raises_and_is_bounded(
    body: bytes, content_type: str | None
) -> None:
    """Any error body gives bounded, key-free details and never raises."""
    _check_details(
        _run(
            lambda: parse_error_body(body, redactor=KeyRedactor(SECRET), content_type=content_type)
        )
    )


@given(value=deep())
def test_deep_nesting_in_an_error_member_is_a_choice_error(value: str) -> None:
    """A 200 reply whose ``error`` member nests at any depth is a ChoiceError, nothing else."""
    body = ('{"choices":[],"error":' + value + "}").encode("utf-8", "surrogatepass")
    try:
        _run(
            lambda: decode_reply(body, LIMITS, request_id=REQUEST_ID, redactor=KeyRedactor(SECRET))
        )
    except ChoiceError:
        return
    except GridAgentError:  # "null" or an invalid leaf: another typed error is fine
        return


# --- nesting around the recursion limit (an error body once escaped as RecursionError) -----


def test_parse_error_body_survives_nesting_around_the_recursion_limit() -> None:
    """An error body nested at every depth near the recursion limit gives details, no raise."""
    for depth in range(LIMIT - 200, LIMIT + 10):
        _check_details(parse_error_body(_nested_loc(depth), redactor=KeyRedactor(SECRET)))


def test_decode_reply_survives_a_nested_error_member_around_the_recursion_limit() -> None:
    """A 200 reply whose ``error`` holds such a body is a typed reply error at every depth.

    Where the caller's stack is already deep, the decoder itself gives up (invalid_value);
    elsewhere the error member is read (choice_error). Never an untyped RecursionError.
    """
    for depth in range(LIMIT - 200, LIMIT + 10):
        inner = _nested_loc(depth).decode()
        body = ('{"choices":[],"error":' + inner + "}").encode()
        with pytest.raises(ResponseError):
            decode_reply(body, LIMITS, request_id=REQUEST_ID, redactor=KeyRedactor(SECRET))
