"""Edges of the error-body parser and the redaction that the table tests do not reach.

Each test pins a boundary a mutation of ``_wire`` could move without the envelope tables
noticing: the cut at :data:`MAX_ERROR_BODY_BYTES`, the scan for a trailing start of the
key, the depth and item caps on nested error messages, and HTML blocks left open.
"""

from __future__ import annotations

import json
from typing import Any, Final

from metacrate_grid_agent._wire import MAX_ERROR_BODY_BYTES, parse_error_body, redact, scrub

#: A key no credential pattern recognises, so only the literal-key rules can hide it.
SECRET: Final = "Zq9#key-0123456789abcdef"


def _nested_message(depth: int) -> bytes:
    value: Any = "deep"
    for _ in range(depth):
        value = {"message": value}
    return json.dumps({"error": value}).encode()


def test_a_token_cut_at_the_body_cap_is_dropped_whole() -> None:
    """A body of exactly the cap may have been cut there: its trailing token is dropped."""
    partial = b"sk-abcd"  # too short for the credential pattern once cut
    body = b" " * (MAX_ERROR_BODY_BYTES - len(partial)) + partial
    assert len(body) == MAX_ERROR_BODY_BYTES
    assert parse_error_body(body, secret=SECRET).excerpt is None
    longer = parse_error_body(body + b"efghijklmnop", secret=SECRET)
    assert longer.excerpt is None


def test_a_body_under_the_cap_keeps_its_last_token() -> None:
    """A body shorter than the cap was not cut: its last word is shown as sent."""
    body = b" " * (MAX_ERROR_BODY_BYTES - 8) + b"sk-abcd"
    assert parse_error_body(body, secret=SECRET).excerpt == "sk-abcd"


def test_a_trailing_start_of_the_key_is_removed() -> None:
    """Text ending with the key's first characters (a cut echo) loses them."""
    assert redact("error near Zq9#", secret=SECRET) == "error near"
    assert redact(SECRET[:-1], secret=SECRET) == ""
    assert scrub("error near   Zq9#key", secret=SECRET) == "error near"


def test_the_trailing_key_scan_finds_the_last_candidate() -> None:
    """An earlier look-alike of the key's start does not hide a real trailing start."""
    assert redact("x Zq9#k Zq9#key-01", secret=SECRET) == "x Zq9#k"
    assert redact("Zq9#Zq9#key", secret=SECRET) == "Zq9#"


def test_a_trailing_start_shorter_than_four_characters_is_kept() -> None:
    """Three characters are not a meaningful piece of the key: text stays as it is."""
    assert redact("error near Zq9", secret=SECRET) == "error near Zq9"


def test_nested_messages_are_read_four_levels_deep_and_no_deeper() -> None:
    """A message nested four levels is found; five levels falls back to an excerpt."""
    assert parse_error_body(_nested_message(4), secret=SECRET).message == "deep"
    deeper = parse_error_body(_nested_message(5), secret=SECRET)
    assert deeper.message is None
    assert deeper.excerpt is not None
    assert deeper.excerpt.startswith('{"error":{"message":')


def test_detail_lists_are_read_eight_items_at_most() -> None:
    """FastAPI details: eight messages joined, each with at most eight location parts."""
    many = {"detail": [{"msg": f"m{i}", "loc": ["body", f"f{i}"]} for i in range(10)]}
    message = parse_error_body(json.dumps(many).encode(), secret=SECRET).message
    assert message == "; ".join(f"body.f{i}: m{i}" for i in range(8))
    long_loc = {"detail": [{"msg": "bad", "loc": list(range(12))}]}
    message = parse_error_body(json.dumps(long_loc).encode(), secret=SECRET).message
    assert message == "0.1.2.3.4.5.6.7: bad"


def test_an_unclosed_script_hides_the_rest_of_the_page() -> None:
    """Everything after an unclosed ``<script>`` is script, never shown."""
    page = b"<html><body>Oops<script>var k='not for display';"
    assert parse_error_body(page, secret=SECRET).excerpt == "Oops"


def test_closed_blocks_are_dropped_whatever_their_case_and_spacing() -> None:
    """Styles and scripts are dropped up to their (case-insensitive) closing tags."""
    page = b"<html><body>Oops<style>p{}</style> after <SCRIPT >x</script > end"
    assert parse_error_body(page, secret=SECRET).excerpt == "Oops after end"
