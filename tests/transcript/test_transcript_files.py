"""Crafted transcript files: every malformed one is a typed ``TranscriptError``, never a crash.

A transcript is a file an operator may be handed from anywhere. :func:`load` checks every
record's shape (types, bounds, nesting) and names the line and the field it refuses;
:func:`report`, :func:`report_html` and :func:`replay` then never meet a value of the wrong
type. The property at the end mutates real transcripts (wrong types in every field, deep
nesting, huge numbers, non-finite numbers, missing and extra members, cut and reordered
lines) and finds no other exception.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import pickle
from typing import TYPE_CHECKING, Any, Final

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from metacrate_grid_agent import (
    Failure,
    LLMClient,
    Message,
    SessionGeneration,
    SystemMessage,
    ToolLoopConfig,
    UserMessage,
)
from metacrate_grid_agent.errors import GridAgentError, error_kinds
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from metacrate_grid_agent.transcript import (
    MAX_LIST_ITEMS,
    REPLY_SETTINGS,
    Transcript,
    TranscriptError,
    TranscriptWriter,
    load,
    replay,
    report,
    report_html,
)
from metacrate_grid_agent.transcript._schema import MAX_ITEMS, MAX_NESTING, ReplySettings
from tests.llm_transport.loop_support import (
    SESSION,
    SYSTEM,
    TOOLS,
    RecordingExecutor,
    Step,
    call,
    calls_reply,
    make_loop,
    start_loop,
)
from tests.llm_transport.support import make_config

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

#: Nesting far past any bound and past the interpreter's recursion limit.
DEEP: Final = 100_000
#: Longest TranscriptError message: a reason, a line number and a field path, never a file.
MAX_MESSAGE_CHARS: Final = 500
#: Stand-ins, replaced in the JSON text, for values ``json.dumps`` cannot write.
RAW: Final = {
    "<deep>": "[" * DEEP + "]" * DEEP,
    "<deep-object>": '{"a":' * DEEP + "1" + "}" * DEEP,
    "<huge-int>": "9" * 5000,
    "<huge-float>": "1e400",
    "<nan>": "NaN",
    "<infinity>": "-Infinity",
}


def _script() -> list[Reply]:
    """A retry, a failed and a rejected call, an ok call with a long reply, the final text."""
    return [
        Reply.error(503, "busy", headers=(("Retry-After", "0"),)),
        calls_reply(call("c1", "look", {"radius": 5}), call("c2", "move", {"x": -1}), usage=(9, 4)),
        calls_reply(
            call("c3", "move", {"x": 1, "y": 2}),
            *(call(f"c{n}", "look", {"radius": n, "note": "n" * 1500}) for n in range(4, 8)),
            text="walking " * 200,
            usage=(12, 3),
        ),
        Reply.completion("I looked and walked.", usage=(15, 6)),
    ]


async def _record(
    max_field_bytes: int = 16 * 1024,
    max_record_bytes: int = 256 * 1024,
    goal: str | list[Message] = "walk to the fountain",
) -> list[str]:
    """A real session's transcript lines, written with the writer's bounds."""
    stream = io.StringIO()
    executor = RecordingExecutor({"c1": Step(outcome=Failure("too dark")), "c3": Step()})
    async with FakeEndpoint(_script()) as endpoint:
        llm = make_config(endpoint.url)
        writer = TranscriptWriter(
            stream,
            secret=llm.api_key,
            max_field_bytes=max_field_bytes,
            max_record_bytes=max_record_bytes,
        )
        config = ToolLoopConfig()
        writer.begin(session_id=SESSION, generation=0, goal=goal,
                     tools=TOOLS, config=config, system_prompt=SYSTEM, llm=llm)  # fmt: skip
        async with LLMClient(llm) as client:
            handle = start_loop(
                make_loop(client, executor, config=config),
                goal,
                generation=SessionGeneration(SESSION),
                on_event=writer,
            )
            run = await handle.finish()
    assert run.result.outcome == "completed"
    return stream.getvalue().splitlines()


@pytest.fixture(scope="module")
def recorded() -> list[str]:
    """The transcript of one session, with every kind of record the loop writes."""
    return asyncio.run(_record())


@pytest.fixture(scope="module")
def tight() -> list[str]:
    """The same session written with a 4 KiB record bound: the long reply is oversized."""
    return asyncio.run(_record(max_field_bytes=1024, max_record_bytes=4096))


@pytest.fixture(scope="module")
def from_messages() -> list[str]:
    """The same session started from a whole history (``initial_messages`` in the header)."""
    history: list[Message] = [
        SystemMessage(content=SYSTEM),
        UserMessage(content="walk to the fountain"),
    ]
    return asyncio.run(_record(goal=history))


def _records(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


def _dumps(record: object) -> str:
    text = json.dumps(record)
    for marker, raw in RAW.items():
        text = text.replace(json.dumps(marker), raw)
    return text


def _line_of(records: list[dict[str, Any]], kind: str) -> int:
    """The 0-based index of the first record of ``kind``."""
    return next(i for i, r in enumerate(records) if r["type"] == kind)


def _assert_typed(error: TranscriptError) -> None:
    """A TranscriptError is one bounded, printable line, inside the library's error tree."""
    message = str(error)
    assert isinstance(error, GridAgentError)
    assert error.kind == "transcript"
    assert message.isprintable(), message
    assert len(message) <= MAX_MESSAGE_CHARS, message


def _all_uses(transcript: Transcript) -> Iterator[tuple[str, Callable[[], object]]]:
    yield "report", lambda: report(transcript)
    yield "report_html", lambda: report_html(transcript)
    yield "replay", lambda: asyncio.run(replay(transcript))


# --- the error --------------------------------------------------------------------------------


def test_transcript_error_is_in_the_tree_and_pickles() -> None:
    """``TranscriptError`` is a ``GridAgentError`` of kind ``transcript`` (still a
    ``ValueError``), listed by ``error_kinds``, and keeps its line and field over pickling."""
    error = TranscriptError("line 3 (reply): tool_calls: missing", line=3, path="tool_calls")
    assert isinstance(error, GridAgentError)
    assert isinstance(error, ValueError)
    assert error_kinds()["transcript"] is TranscriptError
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert (type(copy), str(copy), copy.line, copy.path, copy.retryable) == (
        TranscriptError, str(error), 3, "tool_calls", False
    )  # fmt: skip


def test_the_schema_follows_the_writer() -> None:
    """The header's client settings are exactly the writer's ``REPLY_SETTINGS``, and lists
    are bounded as the writer bounds them."""
    assert tuple(f.name for f in msgspec.structs.fields(ReplySettings)) == REPLY_SETTINGS
    assert MAX_ITEMS == MAX_LIST_ITEMS


# --- crafted records --------------------------------------------------------------------------


def test_a_line_nested_100000_deep_is_refused_before_decoding(recorded: list[str]) -> None:
    """Deep nesting in any member is refused by a depth bound counted on the text, not by a
    RecursionError (the record bound is raised here so that the depth is what refuses)."""
    records = _records(recorded)
    index = _line_of(records, "reply")
    for marker in ("<deep>", "<deep-object>"):
        lines = list(recorded)
        lines[index] = _dumps({**records[index], "text": marker})
        with pytest.raises(TranscriptError) as caught:
            load(lines, max_record_bytes=1 << 20)
        _assert_typed(caught.value)
        assert caught.value.line == index + 1
        assert f"nested more than {MAX_NESTING} levels deep" in str(caught.value)


@pytest.mark.parametrize("marker", ["<deep>", "<deep-object>"])
@pytest.mark.parametrize("as_file", [False, True], ids=["lines", "file"])
def test_a_last_line_nested_100000_deep_without_a_newline_is_refused(
    recorded: list[str], tmp_path: Path, marker: str, *, as_file: bool
) -> None:
    """A last line with no newline after it is checked for a cut (a crashed writer) with the
    same depth and length bounds as every line: 100,000 levels there are refused for their
    depth, never decoded into a RecursionError, and never taken for a cut record."""
    records = _records(recorded)
    lines = [*recorded[:-1], _dumps({**records[-1], "text": marker})]
    source: list[str] | Path = lines
    if as_file:
        source = tmp_path / "deep-last.jsonl"
        source.write_text("\n".join(lines), encoding="utf-8")  # no newline at the end
    with pytest.raises(TranscriptError) as caught:
        load(source, max_record_bytes=1 << 20)
    _assert_typed(caught.value)
    assert caught.value.line == len(lines)
    assert f"nested more than {MAX_NESTING} levels deep" in str(caught.value)


def test_the_nesting_bound_is_exact(recorded: list[str]) -> None:
    """A line nested exactly ``MAX_NESTING`` deep is decoded (and then refused for its
    shape); one level more is refused for its depth. Brackets inside strings do not count."""
    records = _records(recorded)
    index = _line_of(records, "reply")
    for levels, expected in ((MAX_NESTING, "text: expected"), (MAX_NESTING + 1, "nested")):
        nested: object = []
        for _ in range(levels - 2):  # the record and the innermost list are two levels
            nested = [nested]
        lines = list(recorded)
        lines[index] = json.dumps({**records[index], "text": nested})
        with pytest.raises(TranscriptError, match=expected):
            load(lines)
    # A changed line breaks the hash chain: the check of the schema reads a file without it.
    unchained = [{k: v for k, v in r.items() if k != "prev"} for r in records]
    lines = [json.dumps(r) for r in unchained]
    lines[index] = json.dumps({**unchained[index], "text": "[{" * 1000 + '\\"]' * 50})
    assert load(lines).records[index - 1]["text"].startswith("[{[{")


def test_a_boolean_version_is_not_version_1(recorded: list[str]) -> None:
    """``"v": true`` equals 1 in Python; the header's version must be the integer 1."""
    lines = list(recorded)
    lines[0] = json.dumps({**json.loads(lines[0]), "v": True})
    with pytest.raises(TranscriptError) as caught:
        load(lines)
    _assert_typed(caught.value)
    assert (caught.value.line, caught.value.path) == (1, "v")


#: (record type, member, the value written in its place, the field path named; None deletes)
WRONG_FIELDS: Final = [
    ("request", "t", "abc", "t"),
    ("request", "seq", -1, "seq"),
    ("reply", "latency_s", "<infinity>", None),
    ("reply", "latency_s", "<nan>", None),
    ("reply", "latency_s", "<huge-float>", "latency_s"),
    ("reply", "attempts", "<huge-int>", "attempts"),
    ("reply", "attempt_records", [5], "attempt_records[0]"),
    ("reply", "tool_calls", None, "tool_calls"),
    ("reply", "tool_calls", [{"id": "c1", "name": "look"}], "tool_calls[0].arguments"),
    ("reply", "usage", {"prompt_tokens": True}, "usage.prompt_tokens"),
    ("session", "tools", 5, "tools"),
    ("session", "generation", "abc", "generation"),
    ("session", "generation", -5, "generation"),
    ("session", "goal", 5, "goal"),
    ("session", "llm", {"max_tool_calls": "many"}, "llm.max_tool_calls"),
    ("tool_result", "status", 5, "status"),
    ("tool_result", "observation", ["x"], "observation"),
    ("finish", "error", "boom", "error"),
    ("finish", "unreported_calls", [{}], "unreported_calls[0].id"),
]


@pytest.mark.parametrize(("kind", "member", "value", "path"), WRONG_FIELDS)
def test_a_member_of_the_wrong_type_names_its_line_and_field(
    recorded: list[str], kind: str, member: str, value: object, path: str | None
) -> None:
    """Each wrong member (a string time, a non-finite or huge number, a call without its
    arguments, a negative generation, a non-string goal, ...) is refused on load, with the
    line and the field path; a deleted required member (``None``) is named as missing."""
    records = _records(recorded)
    index = _line_of(records, kind)
    changed = dict(records[index])
    if value is None:
        del changed[member]
    else:
        changed[member] = value
    lines = list(recorded)
    lines[index] = _dumps(changed)
    with pytest.raises(TranscriptError) as caught:
        load(lines)
    _assert_typed(caught.value)
    assert caught.value.line == index + 1
    assert f"line {index + 1}" in str(caught.value)
    if path is not None:
        assert caught.value.path == path
        assert path in str(caught.value)
    if value is None:
        assert "missing" in str(caught.value)


@pytest.mark.parametrize(
    "line",
    ["5", "[]", "null", '"session"', "{}", '{"type": 5}', '{"type": "telemetry", "seq": 1}'],
)
def test_a_line_that_is_no_record_is_refused(recorded: list[str], line: str) -> None:
    """A JSON value that is not an object, has no string ``type``, or names an unknown
    record type is refused with its line number."""
    lines = [*recorded[:2], line, *recorded[2:]]
    with pytest.raises(TranscriptError) as caught:
        load(lines)
    _assert_typed(caught.value)
    assert caught.value.line == 3


def test_a_second_header_is_refused(recorded: list[str]) -> None:
    """The session record is the first line and only the first."""
    with pytest.raises(TranscriptError) as caught:
        load([*recorded, recorded[0]])
    _assert_typed(caught.value)
    assert caught.value.line == len(recorded) + 1


def test_lines_and_records_are_bounded(recorded: list[str]) -> None:
    """A line longer than the record bound, or more text than the total bound, is refused
    (from a file or from any iterable of lines) before it is decoded."""
    long_line = _dumps({**json.loads(recorded[1]), "request_id": "r" * 300_000})
    with pytest.raises(TranscriptError) as caught:
        load([*recorded[:1], long_line])
    _assert_typed(caught.value)
    assert caught.value.line == 2
    with pytest.raises(TranscriptError) as caught:
        load(iter([*recorded, *recorded[1:] * 50]), max_total_bytes=64 * 1024)
    _assert_typed(caught.value)
    assert "larger than" in str(caught.value)


def test_an_error_quotes_no_more_than_a_short_excerpt(recorded: list[str]) -> None:
    """A refused line's content appears, if at all, as a short escaped excerpt."""
    records = _records(recorded)
    index = _line_of(records, "request")
    hostile = "\x1b[2J\u202e" + "secret-ish " * 1000
    lines = list(recorded)
    lines[index] = json.dumps({**records[index], "type": hostile})
    with pytest.raises(TranscriptError) as caught:
        load(lines)
    _assert_typed(caught.value)
    assert "secret-ish " * 10 not in str(caught.value)


def test_oversized_records_load_report_and_replay(tight: list[str]) -> None:
    """A record the writer cut to its scalars (``"oversized": true``) is a valid record: the
    report shows it and the replay notes it, with no error."""
    records = _records(tight)
    assert any(r.get("oversized") and r["type"] == "reply" for r in records)
    transcript = load(tight)
    assert any("reply" in line for line in report(transcript))
    assert report_html(transcript).startswith("<!doctype html>")
    found = asyncio.run(replay(transcript))
    assert any("oversized" in note for note in found.notes)


def test_the_real_transcripts_survive_every_use(
    recorded: list[str], from_messages: list[str]
) -> None:
    """The unmutated transcripts load, report and replay with no difference."""
    for lines in (recorded, from_messages):
        transcript = load(lines)
        assert report(transcript)
        assert report_html(transcript)
        assert asyncio.run(replay(transcript)).same


# --- the property -----------------------------------------------------------------------------

#: Values written in place of any member: wrong types, bounds, non-finite and huge numbers.
HOSTILE: Final = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([-1, 2**53 + 1, 2**63, -(2**63) - 1, 10**30, *RAW]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["", "x" * 300, "\x00\x1b\u2028", "ok", "failed", "read_only", "session"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["id", "name", "kind", "x"]), st.integers(), max_size=2),
)


#: Edits of one line, "alike" (a value of the member's own type) and "set" the likeliest.
ACTIONS: Final = ("alike", "alike", "set", "set", "delete", "add", "line")


def _alike(value: object) -> st.SearchStrategy[Any]:
    """Another value of the same JSON type: it passes the schema and reaches the readers."""
    if isinstance(value, bool) or value is None:
        return st.one_of(st.booleans(), st.none())
    if isinstance(value, int):
        return st.integers(0, 10**6)
    if isinstance(value, float):
        return st.floats(0.0, 1e6)
    if isinstance(value, str):
        return st.one_of(
            st.text(max_size=20),
            st.sampled_from(["ok", "failed", "ambiguous", "cancelled", "rejected", "cut (x)",
                             "cut mid-flight (x)", "superseded", "wall_clock", "look", "move",
                             "c1", "c3", '{"radius": 1}', "{}", "mutating", "read_only", ""]),
        )  # fmt: skip
    if isinstance(value, list):
        return st.just(value[::-1]) | st.just([]) | st.just(value + value)
    return st.just({})


def _paths(value: object, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a member or item of ``value`` (depth-first)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key)
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*path, index)
            yield from _paths(item, (*path, index))


def _mutate(data: st.DataObject, lines: list[str]) -> list[str]:
    """One to three edits of ``lines``: a member replaced (by a hostile value or one of its
    own type), deleted or added, or a line replaced, cut, doubled or dropped."""
    lines = list(lines)
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(ACTIONS))
        try:
            record = json.loads(lines[index])
        except (ValueError, RecursionError):  # a line an earlier edit made unreadable
            record = None
        if action == "line" or not isinstance(record, dict):
            edit = data.draw(st.sampled_from(["cut", "double", "drop", "raw"]))
            if edit == "cut":
                lines[index] = lines[index][: data.draw(st.integers(0, len(lines[index])))]
            elif edit == "double":
                lines.insert(index, lines[index])
            elif edit == "drop" and len(lines) > 1:
                del lines[index]
            else:
                lines[index] = _dumps(data.draw(HOSTILE))
            continue
        paths = list(_paths(record))
        path = data.draw(st.sampled_from(paths)) if paths else ()
        parent: Any = record
        for step in path[:-1]:
            parent = parent[step]
        if action == "alike" and path:
            parent[path[-1]] = data.draw(_alike(parent[path[-1]]))
        elif action == "add":
            key = data.draw(st.sampled_from(["extra", "oversized", "redacted", "type"]))
            target = parent if isinstance(parent, dict) else record
            target[key] = data.draw(HOSTILE)
        elif action == "delete" and path and isinstance(parent, dict):
            del parent[path[-1]]
        elif path:
            parent[path[-1]] = data.draw(HOSTILE)
        lines[index] = _dumps(record)
    return lines


@pytest.mark.slow
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_mutated_transcripts_raise_only_transcript_errors(
    recorded: list[str], tight: list[str], from_messages: list[str], data: st.DataObject
) -> None:
    """Whatever is changed in a real transcript, ``load``, ``report``, ``report_html`` and
    ``replay`` succeed or raise ``TranscriptError`` (one bounded, printable line); no
    ValueError, KeyError, TypeError, RecursionError or other error escapes. Half the
    transcripts have no hash chain, so that edits get past ``load``."""
    lines = data.draw(st.sampled_from([recorded, tight, from_messages]))
    if data.draw(st.booleans()):  # without the hash chain, most edits reach report and replay
        lines = [_dumps({k: v for k, v in json.loads(x).items() if k != "prev"}) for x in lines]
    lines = _mutate(data, lines)
    try:
        transcript = load(lines)
    except TranscriptError as error:
        _assert_typed(error)
        event("refused by load")
        return
    for name, use in _all_uses(transcript):
        try:
            use()
        except TranscriptError as error:
            _assert_typed(error)
            event(f"refused by {name}")
        else:
            event(f"used by {name}")


def test_a_transcript_path_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """``load`` reads only a regular file: a FIFO (or a link to one) is a TranscriptError
    naming what it is, never a reader waiting forever for a writer."""
    from tests.config.test_config_files import bounded

    fifo, link = tmp_path / "t.fifo", tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    link.symlink_to(fifo)
    for path in (fifo, link):
        with pytest.raises(TranscriptError) as caught:
            bounded(lambda path=path: load(path), fifo)  # type: ignore[misc]
        assert "it is a FIFO, not a regular file" in str(caught.value)
