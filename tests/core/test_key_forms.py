"""Error bodies and echoes in any shape or depth: typed results, and no form of the key.

The audit's reproductions, each a regression test: a deeply nested error body, a long key
cut before it was redacted, and echoes of the key in an escaped, percent-encoded, HTML or
split form. Keys here match no credential pattern, so only the key's own redaction helps.
"""

from __future__ import annotations

import html
import json
import pickle
import traceback
import urllib.parse
from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metacrate_grid_agent._core._error_body import parse_error_body
from metacrate_grid_agent._core._redact import KeyRedactor, redact, scrub
from metacrate_grid_agent._core._wire import ReplyLimits, decode_reply
from metacrate_grid_agent.errors import ResponseError
from tests.conftest import CANARY_KEYS, assert_no_canary

if TYPE_CHECKING:
    from collections.abc import Callable

#: 64 hex characters: shaped like no provider's key.
HEX_KEY = CANARY_KEYS["hex64"]
LIMITS = ReplyLimits(
    max_text_bytes=1 << 20,
    max_tool_calls=8,
    max_argument_bytes=1 << 16,
    max_id_length=256,
    max_name_length=64,
    mint_missing_call_ids=False,
)


def nested_detail(depth: int) -> bytes:
    """FastAPI's detail list whose ``loc`` holds a list nested ``depth`` levels deep."""
    return ('{"detail":[{"msg":"x","loc":[' + "[" * depth + "]" * depth + "]}]}").encode()


def at_stack_depth(frames: int, action: Callable[[], object]) -> object:
    """Run ``action`` ``frames`` calls deeper: the overflow window moves with stack depth."""
    if frames == 0:
        return action()
    return at_stack_depth(frames - 1, action)


@pytest.mark.parametrize("depth", [900, 960, 988, 2000])
def test_a_deeply_nested_error_body_parses_at_any_stack_depth(depth: int) -> None:
    """parse_error_body never raises, whatever the nesting and the caller's stack depth."""
    redactor = KeyRedactor(HEX_KEY)
    for frames in range(0, 80, 4):
        details = at_stack_depth(
            frames, lambda: parse_error_body(nested_detail(depth), redactor=redactor)
        )
        assert details is not None


@pytest.mark.parametrize("depth", [900, 988, 2000])
def test_a_deeply_nested_error_member_of_a_reply_is_a_response_error(depth: int) -> None:
    """A 200 with a deep ``error`` member raises a ResponseError, never RecursionError."""
    body = b'{"choices":[],"error":' + nested_detail(depth) + b"}"
    for frames in range(0, 80, 4):
        with pytest.raises(ResponseError):
            at_stack_depth(frames, lambda: decode_reply(body, LIMITS, request_id="r"))


def test_a_key_redactor_never_shows_the_key() -> None:
    """Its repr is redacted and it refuses to pickle: frames that hold one show nothing."""
    redactor = KeyRedactor(HEX_KEY)
    assert HEX_KEY[:12] not in repr(redactor)
    with pytest.raises(TypeError):
        pickle.dumps(redactor)


def _tool_call_reply(**call: object) -> bytes:
    base = {"id": "c-1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    calls = [{**base, **call}]
    if "id" in call:
        calls.append({**base, **call})
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    return json.dumps({"choices": [{"message": message, "finish_reason": "tool_calls"}]}).encode()


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_tool_call_reply(type=HEX_KEY), id="tool-call-type"),
        pytest.param(_tool_call_reply(id=HEX_KEY), id="duplicate-id"),
    ],
)
def test_a_long_key_echoed_in_a_tool_call_shows_no_slice(body: bytes) -> None:
    """The echo is redacted before it is cut: not even its first 40 characters show."""
    with pytest.raises(ResponseError) as info:
        decode_reply(body, LIMITS, request_id="r", redactor=KeyRedactor(HEX_KEY))
    assert HEX_KEY[:12] not in str(info.value)
    assert "[REDACTED]" in str(info.value)


@pytest.mark.parametrize("size", [12, 20, 40, 63])
def test_every_long_slice_of_the_key_is_redacted(size: int) -> None:
    """A beginning, middle or end of the key of 12+ characters is redacted wherever it is."""
    redactor = KeyRedactor(HEX_KEY)
    for start in (0, 5, len(HEX_KEY) - size):
        piece = HEX_KEY[start : start + size]
        out = scrub(f"saw {piece} here", redactor=redactor)
        assert out == "saw [REDACTED] here"
        assert redact(f"saw {piece.upper()} here", redactor=redactor) == "saw [REDACTED] here"


def test_short_pieces_of_the_key_are_left_alone() -> None:
    """Eleven characters of a key identify nothing; ordinary text is not garbled."""
    piece = HEX_KEY[3:14]
    assert scrub(f"saw {piece} here", redactor=KeyRedactor(HEX_KEY)) == f"saw {piece} here"


FORM_KEYS = [
    pytest.param(r"Back\slash\Key\n0\x41-7f3a9c1e5b", id="backslash"),
    pytest.param("Quote'Key'Mixed\"7f3a9c1e5b2d", id="quotes"),
    pytest.param("Tag<b>Key</b>&amp;7f3a9c1e5b2d", id="html"),
    pytest.param("Pct%41Key/?&=#+7f3a9c1e5b2d", id="percent"),
    pytest.param(HEX_KEY, id="hex64"),
]
FORMS = [
    pytest.param(lambda key: key, id="raw"),
    pytest.param(repr, id="repr"),
    pytest.param(lambda key: repr(key.encode()), id="bytes-repr"),
    pytest.param(json.dumps, id="json"),
    pytest.param(lambda key: json.dumps(key).replace("-", "\\u002d"), id="json-unicode"),
    pytest.param(lambda key: repr(json.dumps(key)), id="repr-of-json"),
    pytest.param(lambda key: urllib.parse.quote(key, safe=""), id="percent"),
    pytest.param(lambda key: urllib.parse.quote(key, safe="/:?&=#"), id="percent-partial"),
    pytest.param(lambda key: urllib.parse.quote(key).lower(), id="percent-lower"),
    pytest.param(html.escape, id="html-escaped"),
    pytest.param("\u200b".join, id="zero-width-split"),
    pytest.param(lambda key: key[:10] + "\n" + key[10:], id="newline-split"),
    pytest.param(lambda key: key[:7] + "\r\n " + key[7:], id="folded"),
    pytest.param(lambda key: key.upper(), id="upper"),
]


@pytest.mark.parametrize("key", FORM_KEYS)
@pytest.mark.parametrize("form", FORMS)
def test_an_echo_in_a_changed_form_is_redacted(key: str, form: Callable[[str], str]) -> None:
    """Escaped, percent-encoded, HTML-escaped, split or folded, the key never shows."""
    redactor = KeyRedactor(key)
    echo = form(key)
    for out in (
        scrub(f"rejected {echo} here", redactor=redactor, limit=1000),
        redact(f"rejected {echo} here", redactor=redactor),
    ):
        assert "[REDACTED]" in out
        assert key.lower()[:12] not in out.lower()
        assert key.lower()[-12:] not in out.lower()


@pytest.mark.parametrize("key", FORM_KEYS)
@pytest.mark.parametrize(
    ("content_type", "wrap"),
    [
        pytest.param("text/html", lambda key: f"<html><p>bad key {key}</p></html>", id="html"),
        pytest.param(
            "text/html",
            lambda key: f"<p>bad key {html.escape(key)}</p>",
            id="html-escaped",
        ),
        pytest.param(
            "text/html",
            lambda key: f"<p>bad key {key[:6]}<b>{key[6:14]}</b>{key[14:]}</p>",
            id="html-markup-inside",
        ),
        pytest.param(
            "text/plain",
            lambda key: "see https://x.example/?k=" + urllib.parse.quote(key, safe=""),
            id="location",
        ),
        pytest.param(
            "application/json", lambda key: json.dumps({"error": {"message": key}}), id="json"
        ),
        pytest.param(
            "application/json",
            lambda key: json.dumps({"detail": [{"msg": "bad", "loc": ["header", key]}]}),
            id="fastapi-loc",
        ),
    ],
)
def test_an_error_body_never_shows_the_key_in_any_form(
    key: str, content_type: str, wrap: Callable[[str], str]
) -> None:
    """parse_error_body redacts the raw body before its tags are stripped or it is cut."""
    details = parse_error_body(
        wrap(key).encode(), redactor=KeyRedactor(key), content_type=content_type
    )
    shown = " ".join(v for v in (details.message, details.type, details.code, details.excerpt) if v)
    assert "[REDACTED]" in shown
    for start in range(len(key) - 11):
        assert key.lower()[start : start + 12] not in shown.lower()


#: Keys as the configuration accepts them: printable ASCII without spaces.
config_keys = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=12, max_size=80
)
ENCODINGS: list[Callable[[str], str]] = [
    repr,
    json.dumps,
    html.escape,
    lambda key: urllib.parse.quote(key, safe=""),
    "\u200b".join,
    str.upper,
]


@settings(max_examples=300)
@given(
    key=config_keys,
    before=st.text(max_size=40),
    after=st.text(max_size=40),
    steps=st.lists(st.sampled_from(ENCODINGS), max_size=2),
)
def test_no_slice_of_any_key_survives_up_to_two_encodings(
    key: str, before: str, after: str, steps: list[Callable[[str], str]]
) -> None:
    """Any accepted key, encoded up to twice in any of the usual ways, leaves no 12-slice."""
    echo = key
    for step in steps:
        echo = step(echo)
    out = redact(before + echo + after, redactor=KeyRedactor(key)).lower()
    leaked = [key[i : i + 12] for i in range(len(key) - 11) if key[i : i + 12].lower() in out]
    assert not [s for s in leaked if s.lower() not in (before + after).lower()]


def test_no_frame_of_the_error_path_holds_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever escapes from parsing, the captured locals of its frames show no key.

    The functions take a KeyRedactor, never the key: a reporter that records locals (as
    Sentry does by default) sees only its redacted repr.
    """
    from metacrate_grid_agent._core import _error_body

    def broken(text: str) -> str:
        raise RuntimeError("a bug below the error path")

    monkeypatch.setattr(_error_body, "_html_text", broken)
    with pytest.raises(RuntimeError) as info:
        parse_error_body(b"<p>oops</p>", redactor=KeyRedactor(HEX_KEY))
    report = traceback.TracebackException(
        info.type, info.value, info.value.__traceback__, capture_locals=True
    )
    shown = [
        f"{name}={value}"
        for frame in report.stack
        if frame.filename.endswith("_error_body.py")
        for name, value in (frame.locals or {}).items()
    ]
    assert any("KeyRedactor('[REDACTED]')" in entry for entry in shown)
    assert_no_canary(*shown)


#: Characters a reader does not see, one of each kind: a soft hyphen, the combining grapheme
#: joiner, an emoji variation selector, the Mongolian vowel separator, a deprecated format
#: character, a language tag, a Hangul filler, a supplementary variation selector.
INVISIBLES = [
    "\u00ad",
    "\u034f",
    "\ufe0f",
    "\u180e",
    "\u206a",
    "\U000e0001",
    "\u3164",
    "\U000e0100",
]


@pytest.mark.parametrize("key", FORM_KEYS)
@pytest.mark.parametrize("mark", INVISIBLES, ids=lambda mark: f"U+{ord(mark):04X}")
def test_a_key_interleaved_with_an_invisible_character_is_redacted(key: str, mark: str) -> None:
    """Between every two characters of the key, or once in its middle: the key never shows."""
    redactor = KeyRedactor(key)
    for echo in (mark.join(key), key[:9] + mark + key[9:]):
        for out in (
            scrub(f"rejected {echo} here", redactor=redactor, limit=1000),
            redact(f"rejected {echo} here", redactor=redactor),
        ):
            assert "[REDACTED]" in out
            solid = out.lower().replace(mark, "")
            assert key.lower()[:12] not in solid
            assert key.lower()[-12:] not in solid
