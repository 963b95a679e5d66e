"""The reply's own ``id`` and ``model`` members: read when they are short strings, scrubbed,
never required (any other shape leaves them out and the reply still decodes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from metacrate_grid_agent._core._redact import KeyRedactor
from metacrate_grid_agent._core._wire import MAX_REPLY_LABEL_BYTES, ReplyLimits, decode_reply
from metacrate_grid_agent.config import LLMConfig, Secret

KEY = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
LIMITS = ReplyLimits.from_config(
    LLMConfig(endpoint_url="https://llm.example/v1/chat/completions", api_key=Secret(KEY))
)


def _body(**members: Any) -> bytes:
    reply = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], **members}
    return json.dumps(reply).encode()


def test_id_and_model_are_read() -> None:
    """A reply's ``id`` and ``model`` come back as ``response_id`` and ``response_model``."""
    parsed = decode_reply(_body(id="chatcmpl-1", model="m-7"), LIMITS, request_id="r")
    assert (parsed.response_id, parsed.response_model) == ("chatcmpl-1", "m-7")


@pytest.mark.parametrize(
    "value",
    [None, 7, ["a"], {"a": 1}, "", "x" * (MAX_REPLY_LABEL_BYTES + 1)],
    ids=["null", "number", "list", "object", "empty", "too-long"],
)
def test_any_other_shape_is_left_out_and_the_reply_decodes(value: Any) -> None:
    """An ``id`` or ``model`` that is not a short string is never an error: it is left out."""
    parsed = decode_reply(_body(id=value, model=value), LIMITS, request_id="r")
    assert (parsed.text, parsed.response_id, parsed.response_model) == ("hi", None, None)


def test_absent_members_are_none() -> None:
    """A reply without them decodes as before."""
    parsed = decode_reply(_body(), LIMITS, request_id="r")
    assert (parsed.response_id, parsed.response_model) == (None, None)


def test_a_key_echoed_in_id_or_model_is_redacted() -> None:
    """The key echoed in ``id`` or ``model`` never comes back."""
    parsed = decode_reply(
        _body(id=f"id-{KEY}", model=f"Bearer {KEY}"),
        LIMITS,
        request_id="r",
        redactor=KeyRedactor(KEY),
    )
    shown = f"{parsed.response_id} {parsed.response_model}"
    assert KEY[:16] not in shown
    assert "[REDACTED]" in shown


def test_a_label_of_exactly_the_bound_is_read_whole() -> None:
    """The bound on ``id`` and ``model`` is inclusive: a string whose raw JSON is exactly
    MAX_REPLY_LABEL_BYTES bytes comes back whole; a label with spaces (scrubbed, not taken
    as plain) is cut at that bound too, not at the shorter excerpt bound of errors."""
    plain = "m" * (MAX_REPLY_LABEL_BYTES - 2)
    spaced = "model " * ((MAX_REPLY_LABEL_BYTES - 2) // 6)
    spaced = spaced[:-1] + "x"
    assert len(json.dumps(plain)) == MAX_REPLY_LABEL_BYTES
    parsed = decode_reply(_body(id=plain, model=spaced), LIMITS, request_id="r")
    assert (parsed.response_id, parsed.response_model) == (plain, spaced)
