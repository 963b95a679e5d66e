"""The one escaping rule (``display_safe``) and the library's reports that apply it.

The rule escapes each character that could move the cursor, start a terminal sequence,
reorder or hide text. It is checked over all of Unicode against
:func:`tests.terminal_safety.is_unsafe`, a statement of the rule written out independently of
the code, and on hostile transcripts through ``report``, ``report_html`` and
``ReplayReport.lines()``, whose every line must hold none of those characters.
"""

from __future__ import annotations

import json
import sys

import pytest

from metacrate_grid_agent._core._redact import display_safe
from metacrate_grid_agent.transcript import (
    SCHEMA,
    SCHEMA_VERSION,
    Difference,
    ReplayReport,
    load,
    report,
    report_html,
)
from tests.terminal_safety import HOSTILE, HOSTILE_LINES, HOSTILE_SHOWN, is_unsafe, unsafe

#: Every code point but the surrogates, as one text (the surrogates are checked apart).
EVERY_CHARACTER = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


@pytest.mark.slow
def test_every_unsafe_character_becomes_a_visible_escape_and_nothing_else_changes() -> None:
    """Over all of Unicode: each unsafe character is shown as ``\\xNN``, ``\\uNNNN`` or
    ``\\UNNNNNNNN``, every other character is kept as it is."""
    expected = "".join(_escape(c) if is_unsafe(c) else c for c in EVERY_CHARACTER)
    assert expected == display_safe(EVERY_CHARACTER)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (HOSTILE, "\\x1b]0;pwn\\x07\\x1b[2K\\x0d\\x1b[8m\\u202e\\u2066\\u034f\\ufe0f\\xad\\x9b"),
        ("a\tb\nc\r\n", "a\\x09b\\x0ac\\x0d\\x0a"),
        ("\ud800 and \udfff", "\\ud800 and \\udfff"),
        ("\u2028\u2029\x85\ufeff\u200b", "\\u2028\\u2029\\x85\\ufeff\\u200b"),
        ("\U000e0041\U000e0100\U000f0000", "\\U000e0041\\U000e0100\\U000f0000"),
        ("a\u034fb\u3164c\ufe0f", "a\\u034fb\\u3164c\\ufe0f"),
    ],
)
def test_hostile_texts_are_escaped_exactly(text: str, expected: str) -> None:
    """Controls (tab and line breaks too), lone surrogates, separators, tags, variation
    selectors and private use: each escaped where it stood; also in a text Python calls
    printable, whose only unsafe characters are default-ignorable ones (a grapheme joiner,
    a Hangul filler, a variation selector)."""
    assert expected == display_safe(text)


def test_ordinary_text_is_kept_and_escaping_twice_changes_nothing() -> None:
    """Letters of any script, accents, emoji, spaces of every width and a literal backslash
    are shown as they are; an escaped text is left alone by a second pass."""
    ordinary = "héllo wörld 日本語 e\u0301 👍 a\u00a0b\u3000c \\x1b 한국어 العربية"
    assert ordinary == display_safe(ordinary)
    once = display_safe(HOSTILE + HOSTILE_LINES)
    assert once == display_safe(once)


def _hostile_transcript() -> list[str]:
    """A transcript of the right shape whose every printed text field is hostile."""
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    totals = {**usage, "requests": 1, "requests_without_usage": 0}
    attempt = {
        "attempt": 1,
        "outcome": HOSTILE,
        "status": 503,
        "error_kind": HOSTILE,
        "latency_s": 0.1,
        "delay_s": 0.5,
        "delay_source": HOSTILE,
    }
    records: list[dict[str, object]] = [
        {
            "type": "session", "schema": SCHEMA, "v": SCHEMA_VERSION, "seq": 0, "t": 0.0,
            "library": HOSTILE, "session_id": HOSTILE, "generation": 1,
            "endpoint": HOSTILE, "goal": HOSTILE_LINES,
        },
        {"type": "request", "seq": 1, "t": 0.1, "turn": 1, "request_id": HOSTILE},
        {
            "type": "reply", "seq": 2, "t": 0.2, "turn": 1, "request_id": HOSTILE,
            "text": HOSTILE_LINES,
            "tool_calls": [{"id": HOSTILE, "name": HOSTILE, "arguments": HOSTILE_LINES}],
            "usage": usage, "finish_reason": HOSTILE, "attempts": 2, "latency_s": 0.1,
            "attempt_records": [attempt],
        },
        {
            "type": "tool_call", "seq": 3, "t": 0.3, "turn": 1, "id": HOSTILE,
            "name": HOSTILE, "arguments": HOSTILE_LINES, "effect": HOSTILE,
        },
        {
            "type": "tool_result", "seq": 4, "t": 0.4, "turn": 1, "id": HOSTILE,
            "name": HOSTILE, "status": HOSTILE, "observation": HOSTILE_LINES,
            "latency_s": 0.1, "arguments": HOSTILE_LINES,
        },
        {
            "type": "finish", "seq": 5, "t": 0.6, "turn": 1, "session_id": HOSTILE,
            "generation": 1, "outcome": HOSTILE, "bound": HOSTILE,
            "cancel_reason": HOSTILE, "finish_reason": HOSTILE,
            "error": {
                "kind": HOSTILE, "message": HOSTILE_LINES, "status": 503,
                "request_id": HOSTILE, "attempts": 2,
            },
            "turns": 1, "calls": 1, "attempts": 2, "usage": totals, "latency_s": 0.6,
            "compactions": 0, "final_text": HOSTILE_LINES, "ambiguous_call": HOSTILE,
            "unreported_calls": [
                {"id": HOSTILE, "name": HOSTILE, "status": HOSTILE, "observation": HOSTILE},
            ],
            "records_dropped": 0,
        },
    ]  # fmt: skip
    return [json.dumps(r) for r in records]


def test_the_text_report_escapes_every_field() -> None:
    """Each line of ``report`` is safe, and the hostile values are shown, escaped."""
    lines = report(load(_hostile_transcript()))
    assert [(line, unsafe(line, between_lines="")) for line in lines if unsafe(line)] == []
    assert HOSTILE_SHOWN in "\n".join(lines)


def test_the_html_report_shows_the_same_escapes_and_nothing_reorders_its_text() -> None:
    """The page holds no control, format, separator or ignorable character: each is shown
    as the same visible escape as in the text report (after HTML escaping)."""
    page = report_html(load(_hostile_transcript()))
    assert unsafe(page) == []
    assert "\\u202e\\u2066\\u034f\\ufe0f\\xad\\x9b" in page
    assert "\\x1b]0;pwn\\x07\\x1b[2K" in page


def test_the_replay_report_escapes_differences_and_notes() -> None:
    """``ReplayReport.lines()``: a difference's place and values and every note are escaped."""
    found = ReplayReport(
        differences=(Difference(HOSTILE, HOSTILE_LINES, HOSTILE),),
        notes=(HOSTILE_LINES,),
        result=None,
        replayed=load(_hostile_transcript()),
    )
    lines = found.lines()
    assert [line for line in lines if unsafe(line, between_lines="")] == []
    assert HOSTILE_SHOWN in "\n".join(lines)
