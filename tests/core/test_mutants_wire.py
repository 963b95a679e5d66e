"""Edges of the error-body parser and the redaction that the table tests do not reach.

Each test pins a boundary a mutation of ``_wire``, ``_error_body`` or ``_redact`` could
move without the envelope tables noticing: the cut at :data:`MAX_ERROR_BODY_BYTES`, the scan
for a trailing start of the key, the depth and item caps on nested error messages, and HTML
blocks left open.
"""

from __future__ import annotations

import copy
import hashlib
import json
import pickle
from typing import TYPE_CHECKING, Any, Final

import pytest

from metacrate_grid_agent._core._error_body import MAX_ERROR_BODY_BYTES, parse_error_body
from metacrate_grid_agent._core._redact import MAX_SCRUB_CHARS, KeyRedactor, redact, scrub
from metacrate_grid_agent._core._request import encode_request
from metacrate_grid_agent._core._types import (
    MAX_CALL_ID_LENGTH,
    MAX_CALL_NAME_LENGTH,
    ToolCall,
    ToolMessage,
)
from metacrate_grid_agent._core._wire import (
    OversizedToolCall,
    ParsedReply,
    ReplyLimits,
    decode_reply,
)
from metacrate_grid_agent.config import REDACTED
from metacrate_grid_agent.errors import (
    ChoiceError,
    InvalidMessageError,
    InvalidValueError,
    ResponseError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

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
    assert parse_error_body(body, redactor=KeyRedactor(SECRET)).excerpt is None
    longer = parse_error_body(body + b"efghijklmnop", redactor=KeyRedactor(SECRET))
    assert longer.excerpt is None


def test_a_body_under_the_cap_keeps_its_last_token() -> None:
    """A body shorter than the cap was not cut: its last word is shown as sent."""
    body = b" " * (MAX_ERROR_BODY_BYTES - 8) + b"sk-abcd"
    assert parse_error_body(body, redactor=KeyRedactor(SECRET)).excerpt == "sk-abcd"


def test_a_trailing_start_of_the_key_is_removed() -> None:
    """Text ending with the key's first characters (a cut echo) loses them."""
    assert redact("error near Zq9#", redactor=KeyRedactor(SECRET)) == "error near"
    # All but the last character is a slice of the key long enough to be redacted as one.
    assert redact(SECRET[:-1], redactor=KeyRedactor(SECRET)) == "[REDACTED]"
    assert scrub("error near   Zq9#key", redactor=KeyRedactor(SECRET)) == "error near"


def test_the_trailing_key_scan_finds_the_last_candidate() -> None:
    """An earlier look-alike of the key's start does not hide a real trailing start."""
    assert redact("x Zq9#k Zq9#key-01", redactor=KeyRedactor(SECRET)) == "x Zq9#k"
    assert redact("Zq9#Zq9#key", redactor=KeyRedactor(SECRET)) == "Zq9#"


def test_a_trailing_start_shorter_than_four_characters_is_kept() -> None:
    """Three characters are not a meaningful piece of the key: text stays as it is."""
    assert redact("error near Zq9", redactor=KeyRedactor(SECRET)) == "error near Zq9"


def test_nested_messages_are_read_four_levels_deep_and_no_deeper() -> None:
    """A message nested four levels is found; five levels falls back to an excerpt."""
    assert parse_error_body(_nested_message(4), redactor=KeyRedactor(SECRET)).message == "deep"
    deeper = parse_error_body(_nested_message(5), redactor=KeyRedactor(SECRET))
    assert deeper.message is None
    assert deeper.excerpt is not None
    assert deeper.excerpt.startswith('{"error":{"message":')


def test_detail_lists_are_read_eight_items_at_most() -> None:
    """FastAPI details: eight messages joined, each with at most eight location parts."""
    many = {"detail": [{"msg": f"m{i}", "loc": ["body", f"f{i}"]} for i in range(10)]}
    message = parse_error_body(json.dumps(many).encode(), redactor=KeyRedactor(SECRET)).message
    assert message == "; ".join(f"body.f{i}: m{i}" for i in range(8))
    long_loc = {"detail": [{"msg": "bad", "loc": list(range(12))}]}
    message = parse_error_body(json.dumps(long_loc).encode(), redactor=KeyRedactor(SECRET)).message
    assert message == "0.1.2.3.4.5.6.7: bad"


def test_an_unclosed_script_hides_the_rest_of_the_page() -> None:
    """Everything after an unclosed ``<script>`` is script, never shown."""
    page = b"<html><body>Oops<script>var k='not for display';"
    assert parse_error_body(page, redactor=KeyRedactor(SECRET)).excerpt == "Oops"


def test_closed_blocks_are_dropped_whatever_their_case_and_spacing() -> None:
    """Styles and scripts are dropped up to their (case-insensitive) closing tags."""
    page = b"<html><body>Oops<style>p{}</style> after <SCRIPT >x</script > end"
    assert parse_error_body(page, redactor=KeyRedactor(SECRET)).excerpt == "Oops after end"


LIMITS: Final = ReplyLimits(
    max_text_bytes=4096,
    max_tool_calls=8,
    max_argument_bytes=4096,
    max_id_length=64,
    max_name_length=64,
    mint_missing_call_ids=True,
)


def _decode(document: Any, request_id: str = "req-1") -> ParsedReply:
    return decode_reply(json.dumps(document).encode(), LIMITS, request_id=request_id)


def _text_reply(text: str) -> dict[str, Any]:
    return {"choices": [{"message": {"content": text}}]}


def test_id_and_name_limits_may_reach_the_longest_a_message_carries() -> None:
    """The id and name limits are inclusive of the longest call id and tool name a message
    may carry, and no higher."""
    ReplyLimits(
        max_text_bytes=1,
        max_tool_calls=1,
        max_argument_bytes=1,
        max_id_length=MAX_CALL_ID_LENGTH,
        max_name_length=MAX_CALL_NAME_LENGTH,
        mint_missing_call_ids=False,
    )
    with pytest.raises(ValueError, match="at most"):
        ReplyLimits(
            max_text_bytes=1,
            max_tool_calls=1,
            max_argument_bytes=1,
            max_id_length=MAX_CALL_ID_LENGTH + 1,
            max_name_length=1,
            mint_missing_call_ids=False,
        )


@pytest.mark.parametrize(
    ("build", "longest"),
    [
        (lambda text: ToolCall.create(text, "look", "{}"), MAX_CALL_ID_LENGTH),
        (lambda text: ToolCall.create("c1", text, "{}"), MAX_CALL_NAME_LENGTH),
        (lambda text: ToolMessage(tool_call_id=text, content="ok"), MAX_CALL_ID_LENGTH),
    ],
    ids=["call_id", "tool_name", "tool_call_id"],
)
def test_a_message_carries_ids_and_names_up_to_their_own_bound(
    build: Callable[[str], object], longest: int
) -> None:
    """A call id, a tool name and a tool message's call id are each bounded by the constant
    named for them, inclusive."""
    build("x" * longest)
    with pytest.raises(InvalidMessageError, match=f"at most {longest} chars"):
        build("x" * (longest + 1))


def test_a_one_character_error_member_is_an_error() -> None:
    """``"error": 0`` is a non-null error member, however short."""
    with pytest.raises(ChoiceError):
        _decode({**_text_reply("x"), "error": 0})


def test_every_leading_reasoning_block_is_removed() -> None:
    """Two leading think blocks are both removed; a later stray closing tag is text."""
    assert _decode(_text_reply("<think>a</think> <think>b</think> answer")).text == "answer"
    assert _decode(_text_reply("<think>a</think>mid</think>x")).text == "mid</think>x"


def test_a_text_with_a_think_tag_later_keeps_its_leading_space() -> None:
    """A text that does not open with a reasoning block but names one later is kept
    exactly, its leading whitespace too: only the space after a removed block goes."""
    assert _decode(_text_reply("  see <think> there")).text == "  see <think> there"


def _minted(request_id: str, index: int, salt: int = 0) -> str:
    seed = f"{request_id}:{index}" + (f":{salt}" if salt else "")
    return "minted-" + hashlib.blake2b(seed.encode(), digest_size=8).hexdigest()


def _call(call_id: str | None) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": "look", "arguments": "{}"}}
    if call_id is not None:
        call["id"] = call_id
    return call


def test_a_minted_id_steps_past_ids_already_taken() -> None:
    """A minted id that a given id already holds is salted, 1 then 2, until it is free."""
    taken = _minted("req-1", 1)
    reply = _decode({"choices": [{"message": {"tool_calls": [_call(taken), _call(None)]}}]})
    assert [c.id for c in reply.tool_calls] == [taken, _minted("req-1", 1, 1)]
    both = [_call(_minted("req-1", 2)), _call(_minted("req-1", 2, 1)), _call(None)]
    reply = _decode({"choices": [{"message": {"tool_calls": both}}]})
    assert reply.tool_calls[2].id == _minted("req-1", 2, 2)


def test_nested_detail_lists_are_read_four_levels_deep_and_no_deeper() -> None:
    """Lists inside lists count toward the same depth cap as objects."""

    def nested(depth: int) -> bytes:
        value: Any = "deep"
        for _ in range(depth):
            value = [value]
        return json.dumps({"detail": value}).encode()

    assert parse_error_body(nested(3), redactor=KeyRedactor(SECRET)).message == "deep"
    assert parse_error_body(nested(4), redactor=KeyRedactor(SECRET)).message is None


def test_a_location_is_added_only_to_a_msg_with_a_location_list() -> None:
    """Only FastAPI's ``msg`` with a non-empty ``loc`` list gets the location prefix."""
    for body in ({"message": "m", "loc": "abc"}, {"message": "m", "loc": ["a"]}):
        assert (
            parse_error_body(json.dumps(body).encode(), redactor=KeyRedactor(SECRET)).message == "m"
        )
    msg = {"msg": "m", "loc": "abc"}
    assert parse_error_body(json.dumps(msg).encode(), redactor=KeyRedactor(SECRET)).message == "m"


def test_an_empty_json_string_body_is_shown_as_it_is() -> None:
    """A body of ``""`` has no message: it is shown as an excerpt."""
    details = parse_error_body(b'""', redactor=KeyRedactor(SECRET))
    assert (details.message, details.excerpt) == (None, '""')


def test_a_closing_tag_before_a_block_does_not_end_it() -> None:
    """A stray ``</script>`` before a script does not close the script that follows."""
    page = b"<p>a</script>b<script>c</script>d</p>"
    assert parse_error_body(page, redactor=KeyRedactor(SECRET)).excerpt == "a bd"


def test_html_by_content_type_in_any_case_is_read_as_a_page() -> None:
    """``Text/HTML`` is HTML: tags are stripped, and a JSON-looking page is not parsed."""
    assert parse_error_body(
        b"Oops <b>x</b>", redactor=KeyRedactor(SECRET), content_type="Text/HTML"
    ).excerpt == ("Oops x")
    page = parse_error_body(
        b'{"error": {"message": "m"}}', redactor=KeyRedactor(SECRET), content_type="text/html"
    )
    assert (page.message, page.excerpt) == (None, '{"error": {"message": "m"}}')


SMALL: Final = ReplyLimits(
    max_text_bytes=16,
    max_tool_calls=8,
    max_argument_bytes=16,
    max_id_length=64,
    max_name_length=64,
    mint_missing_call_ids=True,
)


def _error_of(document: Any) -> str:
    with pytest.raises(ResponseError) as caught:
        decode_reply(
            json.dumps(document).encode(), SMALL, request_id="r", redactor=KeyRedactor(SECRET)
        )
    return f"{caught.value} @ {caught.value.path}"


def test_reply_errors_say_what_and_where_exactly() -> None:
    """Each decoding error's message and JSON path, as a caller reads them."""
    assert _error_of({"choices": "x"}) == (
        "the reply has an invalid value at $.choices: expected `array | null`, got `str` "
        "@ $.choices"
    )
    assert _error_of({"choices": [{"message": {"content": "x" * 17}}]}) == (
        "the reply text is 17 bytes, above max_text_bytes = 16 @ $.choices[0].message.content"
    )
    assert _error_of({}) == "the reply has no $.choices member @ $.choices"
    assert _error_of({"choices": []}) == "the reply has an empty choices array @ $.choices"
    assert _error_of({"choices": [{}]}) == (
        "the reply has no $.choices[0].message member @ $.choices[0].message"
    )
    assert _error_of({"choices": [{"message": {}, "finish_reason": "error"}]}) == (
        "choice 0 ended with finish_reason 'error' @ $.choices[0].finish_reason"
    )


def test_arguments_object_of_exactly_the_limit_passes() -> None:
    """An object re-serialised to exactly ``max_argument_bytes`` is accepted."""
    call = {"id": "a", "function": {"name": "n", "arguments": {"k": "x" * 8}}}
    reply = decode_reply(
        json.dumps({"choices": [{"message": {"tool_calls": [call]}}]}).encode(),
        SMALL,
        request_id="r",
    )
    assert reply.tool_calls[0].arguments == '{"k":"xxxxxxxx"}'


def test_finish_reason_of_exactly_64_characters_passes() -> None:
    """The finish-reason bound is inclusive."""
    document = {"choices": [{"message": {"content": "x"}, "finish_reason": "s" * 64}]}
    assert _decode(document).finish_reason == "s" * 64


def test_error_members_are_reported_with_message_type_and_code_scrubbed() -> None:
    """An error member's message, type and code, the key scrubbed; "no message" if none."""
    error = {"message": f"m {SECRET}", "type": "t", "code": "c"}
    assert _error_of({"error": error}) == (
        "the reply reports an error: m [REDACTED] (type t, code c) @ $.error"
    )
    choice = {"message": {"content": "x"}, "error": {"type": "t"}}
    assert _error_of({"choices": [choice]}) == (
        "choice 0 reports an error: no message (type t) @ $.choices[0].error"
    )
    choice = {"message": {"content": "x"}, "error": {"message": f"{SECRET} gone"}}
    assert _error_of({"choices": [choice]}) == (
        "choice 0 reports an error: [REDACTED] gone @ $.choices[0].error"
    )
    assert _error_of({"error": "plain"}) == "the reply reports an error: plain @ $.error"


def test_redact_replaces_the_key_in_any_case_and_json_escaped() -> None:
    """The key, folded to any case or JSON-escaped, is replaced; nothing else changes."""
    assert (
        redact(f"key {SECRET.upper()} here", redactor=KeyRedactor(SECRET)) == "key [REDACTED] here"
    )
    quoted = 'Zq9"key\\-0123456789'
    escaped = json.dumps(quoted)[1:-1]
    assert (
        redact(f"echo {escaped.lower()} end", redactor=KeyRedactor(quoted)) == "echo [REDACTED] end"
    )
    assert redact(f"echo {SECRET}", redactor=KeyRedactor(None)) == f"echo {SECRET}"


def _each_char(escape: Callable[[str], str]) -> Callable[[str], str]:
    return lambda text: "".join(escape(c) for c in text)


@pytest.mark.parametrize(
    "form",
    [
        _each_char(lambda c: f"\\u{ord(c):04x}"),
        _each_char(lambda c: f"\\U{ord(c):08X}"),
        _each_char(lambda c: f"\\x{ord(c):02x}"),
        _each_char(lambda c: f"%{ord(c):02X}"),
        _each_char(lambda c: f"&#{ord(c)};"),
        _each_char(lambda c: f"&#x{ord(c):x};"),
        lambda text: text.replace("#", "&num;"),
        lambda text: text.replace("-", "\\-"),
    ],
    ids=["u4", "U8", "x2", "percent", "decimal", "hex", "named", "backslash"],
)
def test_an_escaped_echo_is_redacted_exactly_where_it_stands(form: Callable[[str], str]) -> None:
    """Each escape form decodes to its character, and only the echo's span is replaced."""
    text = "before " + form(SECRET) + " after"
    assert redact(text, redactor=KeyRedactor(SECRET)) == f"before {REDACTED} after"


def test_an_escaped_slice_after_plain_text_keeps_the_text_around_it() -> None:
    """Positions map back through decoding: text before and after an escaped slice stays."""
    text = "ab\\n" + "".join(f"%{ord(c):02x}" for c in SECRET[:14]) + "\\tcd"
    assert redact(text, redactor=KeyRedactor(SECRET)) == f"ab\\n{REDACTED}\\tcd"


def test_the_redactors_repr_and_pickle_refusal() -> None:
    """No key gives a repr saying so; pickling fails with a reason, never the key."""
    assert repr(KeyRedactor(None)) == "KeyRedactor(None)"
    assert repr(KeyRedactor(SECRET)) == f"KeyRedactor({REDACTED!r})"
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(KeyRedactor(SECRET))


def test_a_key_that_is_the_marker_gives_an_empty_excerpt() -> None:
    """When redaction itself shows the key (the key is the marker), nothing is shown."""
    assert scrub("a [redacted] b", redactor=KeyRedactor("[redacted]")) == ""


def test_a_key_of_four_characters_is_not_scanned_for_prefixes() -> None:
    """Only a key longer than the shortest prefix has cut beginnings to remove."""
    assert KeyRedactor("abcd").cut_prefixes("x abcd…", "…") == "x abcd…"
    assert KeyRedactor("abcde").cut_prefixes("x abcd…", "…") == f"x {REDACTED}…"


def test_a_container_in_a_loc_is_shown_as_an_ellipsis() -> None:
    """A loc element that is neither a name nor an index is not rendered."""
    body = json.dumps({"detail": [{"msg": "bad", "loc": ["body", [1], 2]}]}).encode()
    assert parse_error_body(body, redactor=KeyRedactor(None)).message == "body.….2: bad"


def test_an_echoed_tool_call_type_is_cut_to_forty_characters() -> None:
    """An echoed value is bounded: a long ``type`` shows 39 characters and an ellipsis."""
    call = {"id": "c1", "type": "t" * 100, "function": {"name": "f", "arguments": "{}"}}
    message = _error_of({"choices": [{"message": {"tool_calls": [call]}}]})
    assert f"'{'t' * 39}…'" in message
    assert "t" * 40 not in message


def test_an_error_body_with_a_type_and_no_message_has_no_message() -> None:
    """A known shape without a message gives its type and leaves the message empty."""
    details = parse_error_body(b'{"error": {"type": "overloaded"}}', redactor=KeyRedactor(SECRET))
    assert (details.message, details.type, details.excerpt) == (None, "overloaded", None)


@pytest.mark.parametrize("blank", ["\x00\x01", "\x7f\x1b", "\u200b\n\t"])
def test_a_message_of_control_characters_only_is_no_message(blank: str) -> None:
    """A message, type or code that scrubs to nothing is absent (None), never ``""``."""
    body = json.dumps({"error": {"message": blank, "type": blank, "code": "c"}}).encode()
    details = parse_error_body(body, redactor=KeyRedactor(SECRET))
    assert (details.message, details.type, details.code) == (None, None, "c")
    body = json.dumps({"error": {"message": "m", "type": "t", "code": blank}}).encode()
    details = parse_error_body(body, redactor=KeyRedactor(SECRET))
    assert (details.message, details.type, details.code) == ("m", "t", None)


def test_a_copy_of_an_oversized_call_keeps_its_id_name_and_size() -> None:
    """``copy.copy`` of a rejected call is the same rejected call, size included."""
    call = OversizedToolCall.dropped("c1", "look", 70_000)
    copied = copy.copy(call)
    assert isinstance(copied, OversizedToolCall)
    assert (copied.id, copied.name, copied.arguments, copied.argument_bytes) == (
        "c1",
        "look",
        "{}",
        70_000,
    )


def test_a_redactor_is_true_only_with_a_key() -> None:
    """``bool`` says whether there is a key to find: none, or an empty one, is False."""
    assert (bool(KeyRedactor(None)), bool(KeyRedactor("")), bool(KeyRedactor("k"))) == (
        False,
        False,
        True,
    )


def test_pickling_a_redactor_says_why_it_cannot() -> None:
    """The refusal names the reason, in these words, and never the key."""
    with pytest.raises(
        TypeError, match=r"^a KeyRedactor holds the credential; it cannot be pickled$"
    ):
        pickle.dumps(KeyRedactor(SECRET))


def test_a_value_that_is_not_json_is_named_by_its_type() -> None:
    """A request holding a value JSON cannot carry says which type it was."""
    message: Any = {"role": "user", "content": object()}
    with pytest.raises(InvalidMessageError) as caught:
        encode_request([message], [])
    assert str(caught.value) == (
        "the request cannot be serialised: objects of type object are not JSON"
    )


#: Deeper than the decoder goes on any supported Python: its bound is the interpreter's
#: recursion limit, near 1,000 levels on 3.11, 1,500 on 3.12 and 10,000 on 3.13.
TOO_DEEP = 1_000_000


def test_a_reply_nested_too_deeply_says_so() -> None:
    """A reply nested past the decoder's depth is an InvalidValueError saying so, at ``$``."""
    part = b'{"type":"x","text":' + b"[" * TOO_DEEP + b"]" * TOO_DEEP + b"}"
    body = b'{"choices":[{"message":{"content":[' + part + b"]}}]}"
    with pytest.raises(InvalidValueError) as caught:
        decode_reply(body, LIMITS, request_id="r")
    assert (str(caught.value), caught.value.path) == (
        "the reply is nested too deeply to decode",
        "$",
    )


def test_scrub_refuses_a_limit_below_one_in_these_words() -> None:
    """``limit`` must be positive; the error says so."""
    with pytest.raises(ValueError, match=r"^limit must be at least 1$"):
        scrub("x", redactor=KeyRedactor(None), limit=0)


def test_a_text_of_exactly_the_limit_is_kept_whole() -> None:
    """Both bounds of scrub are inclusive: the scan cap, and the length shown."""
    text = "w" + "word " * (MAX_SCRUB_CHARS // 5 - 1) + "last!"
    assert len(text) == MAX_SCRUB_CHARS
    assert scrub(text, redactor=KeyRedactor(None), limit=MAX_SCRUB_CHARS) == text
    assert scrub("abcde", redactor=KeyRedactor(None), limit=5) == "abcde"


def test_a_cut_never_leaves_a_space_before_the_ellipsis() -> None:
    """The text is cut, then its trailing spaces dropped, then "…" added."""
    assert scrub("abc def ghi", redactor=KeyRedactor(None), limit=5) == "abc…"
    assert scrub("  abc def", redactor=KeyRedactor(None), limit=6) == "abc d…"


def test_text_over_the_scan_cap_made_of_one_token_is_dropped_whole() -> None:
    """Cut at MAX_SCRUB_CHARS inside a single run of key characters: nothing is shown."""
    assert scrub("x" * (MAX_SCRUB_CHARS + 1), redactor=KeyRedactor(None)) == ""


def test_redact_keeps_the_layout_when_no_key_ends_the_text() -> None:
    """``redact`` changes nothing but what it replaces: trailing spaces stay."""
    assert redact("a b  \n  ", redactor=KeyRedactor(SECRET)) == "a b  \n  "
