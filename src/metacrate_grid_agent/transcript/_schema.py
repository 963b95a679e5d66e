"""The transcript's record schema: one frozen msgspec struct per record type, and the line check.

A transcript may come from anywhere, so every line is checked before anything uses it: its
length and its nesting (counted on the text, before any decoder recurses), then JSON, then
its shape against the struct of its ``type``: strict types (``true`` is no version 1, a
string is no time), finite numbers within bounds, no negative count. A member the writer
always writes must be there, except in a record the writer cut to its scalars
(``"oversized": true``) or withheld (``"redacted": true``); there the missing members take
empty defaults. Unknown members are ignored. Every refusal is a :class:`TranscriptError`
naming the line and the field path, quoting at most a short, escaped excerpt.

The reading half of :mod:`metacrate_grid_agent.transcript` (``load``), ``_report.py`` and
``_replay.py`` use the structs, so no value of the wrong type reaches them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import Annotated, Any, ClassVar, Final, TypeAlias, TypeVar

import msgspec

from metacrate_grid_agent._core._tools import Effect
from metacrate_grid_agent.errors import TranscriptError

__all__ = [
    "MAX_NESTING",
    "Approval",
    "Attempt",
    "Compaction",
    "Event",
    "Finish",
    "FinishError",
    "Record",
    "Reply",
    "ReplyCall",
    "ReplySettings",
    "Request",
    "RequestFailed",
    "Session",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Totals",
    "Unreported",
    "Usage",
    "cut_mid_line",
    "decode_line",
    "excerpt",
    "kind_of",
    "parse",
    "parse_all",
]

#: Deepest nesting of one line: the deepest the writer makes is a tool schema (at most
#: ``MAX_SCHEMA_DEPTH``, 32) three levels into the header; far below any recursion limit.
MAX_NESTING: Final = 64
#: Largest count, turn or token number: exact in a float, so in every JSON reader.
MAX_COUNT: Final = 2**53
#: Longest time or latency, in seconds (about 31 years): bounds the numbers, not the session.
MAX_SECONDS: Final = 1e9
#: Most items of one recorded list: the writer's ``MAX_LIST_ITEMS``.
MAX_ITEMS: Final = 64
#: Characters of file content quoted in an error message (escaped).
MAX_EXCERPT: Final = 40
#: Characters of a field path (its keys come from the file) and of a reason, in a message.
MAX_PATH: Final = 120

_T = TypeVar("_T")
#: A recorded list, at most as long as the writer keeps.
_Items = Annotated[tuple[_T, ...], msgspec.Meta(max_length=MAX_ITEMS)]
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_SECONDS)]
#: An HTTP status as the client saw it (three digits).
Status = Annotated[int, msgspec.Meta(ge=0, le=999)]


class _Part(msgspec.Struct, frozen=True, kw_only=True):
    """A member made of members; all of them are required."""


class ToolSpec(_Part, frozen=True, kw_only=True):
    name: str
    description: str
    parameters: dict[str, Any]
    effect: Effect
    timeout_s: Seconds | None
    #: The MCP server the tool's calls go to (absent in older files, and for other tools).
    server: str | None = None


class ReplyCall(_Part, frozen=True, kw_only=True):
    id: str
    name: str
    arguments: str
    arguments_cut: bool = False


class ReplySettings(msgspec.Struct, frozen=True, kw_only=True):
    """The client settings that decide how a reply is read (``REPLY_SETTINGS``), each
    optional: the replay passes those recorded to the client, which checks them."""

    mint_missing_call_ids: bool | None = None
    max_prompt_bytes: Count | None = None
    max_response_bytes: Count | None = None
    max_text_bytes: Count | None = None
    max_tool_calls: Count | None = None
    max_argument_bytes: Count | None = None
    max_id_length: Count | None = None
    max_name_length: Count | None = None


class Usage(_Part, frozen=True, kw_only=True):
    prompt_tokens: Count | None
    completion_tokens: Count | None
    total_tokens: Count | None


class Attempt(_Part, frozen=True, kw_only=True):
    attempt: Count
    outcome: str
    status: Status | None
    error_kind: str | None
    latency_s: Seconds
    delay_s: Seconds | None
    delay_source: str | None


class FinishError(_Part, frozen=True, kw_only=True):
    kind: str
    message: str
    status: Status | None
    request_id: str | None
    attempts: Count


class Totals(_Part, frozen=True, kw_only=True):
    prompt_tokens: Count
    completion_tokens: Count
    total_tokens: Count
    requests: Count
    requests_without_usage: Count


class Unreported(_Part, frozen=True, kw_only=True):
    id: str
    name: str
    status: str
    observation: str


class _Record(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Members of every record; a subclass's ``optional`` names members it may lack."""

    optional: ClassVar[frozenset[str]] = frozenset()

    seq: Count
    t: Seconds = 0.0
    prev: str | None = None
    oversized: bool = False
    redacted: bool = False


class Session(_Record, tag="session", frozen=True, kw_only=True):
    """The header. Only what every header has is required: one written before the session's
    own (events with no ``begin``) has nothing else."""

    optional = frozenset(
        {"session_id", "generation", "started_at", "endpoint", "config", "llm", "tools",
         "system_prompt", "labels", "goal", "initial_messages"}
    )  # fmt: skip

    schema: str = ""
    v: int = 0
    library: str = ""
    session_id: str = ""
    generation: Count = 0
    #: When the session started, ISO 8601 in UTC (absent in older files).
    started_at: str | None = None
    endpoint: str | None = None
    config: dict[str, Any] | None = None
    llm: ReplySettings | None = None
    tools: tuple[ToolSpec, ...] | None = None
    system_prompt: str | None = None
    labels: dict[str, str] | None = None
    goal: str | None = None
    initial_messages: _Items[dict[str, Any]] | None = None


class _Event(_Record, frozen=True, kw_only=True):
    turn: Count = 0


class Request(_Event, tag="request", frozen=True, kw_only=True):
    request_id: str = ""


class Reply(_Event, tag="reply", frozen=True, kw_only=True):
    request_id: str = ""
    text: str | None = None
    tool_calls: _Items[ReplyCall] = ()
    usage: Usage | None = None
    finish_reason: str | None = None
    attempts: Count = 0
    latency_s: Seconds = 0.0
    attempt_records: _Items[Attempt] = ()


class Approval(_Event, tag="approval", frozen=True, kw_only=True):
    """One approval question, settled; a record written before verdicts were kept has only
    its ``turn``."""

    optional = frozenset({"id", "name", "verdict", "reason", "wait_s", "timed_out"})

    id: str = ""
    name: str = ""
    verdict: str | None = None
    reason: str | None = None
    wait_s: Seconds | None = None
    timed_out: bool = False


class RequestFailed(_Event, tag="request_failed", frozen=True, kw_only=True):
    """A model request that failed (``error``) or was cut from outside (no ``error``; the
    ``cancel_reason`` when the session's token cut it): every attempt it made."""

    request_id: str | None = None
    error: FinishError | None = None
    cancel_reason: str | None = None
    attempt_records: _Items[Attempt] = ()


class ToolCall(_Event, tag="tool_call", frozen=True, kw_only=True):
    id: str = ""
    name: str = ""
    arguments: str = ""
    effect: str = ""


class ToolResult(_Event, tag="tool_result", frozen=True, kw_only=True):
    id: str = ""
    name: str = ""
    status: str = ""
    observation: str = ""
    latency_s: Seconds = 0.0
    arguments: str = ""


class Compaction(_Event, tag="compaction", frozen=True, kw_only=True):
    pass


class Finish(_Event, tag="finish", frozen=True, kw_only=True):
    session_id: str = ""
    generation: Count = 0
    outcome: str = ""
    bound: str | None = None
    cancel_reason: str | None = None
    error: FinishError | None = None
    turns: Count = 0
    calls: Count = 0
    usage: Totals | None = None
    attempts: Count = 0
    latency_s: Seconds = 0.0
    compactions: Count = 0
    final_text: str | None = None
    finish_reason: str | None = None
    ambiguous_call: str | None = None
    unreported_calls: _Items[Unreported] = ()
    records_dropped: Count = 0


Event: TypeAlias = (
    Request | Reply | RequestFailed | Approval | ToolCall | ToolResult | Compaction | Finish
)
Record: TypeAlias = Session | Event

_TYPES: Final[dict[str, type[Session] | type[Event]]] = {
    str(cls.__struct_config__.tag): cls
    for cls in (
        Session,
        Request,
        Reply,
        RequestFailed,
        Approval,
        ToolCall,
        ToolResult,
        Compaction,
        Finish,
    )
}
#: Members no record must have: the markers, and the hash chain (absent in older files).
_MARKERS: Final = frozenset({"oversized", "redacted", "prev"})
#: The members each record type must have unless it is marked.
_REQUIRED: Final = {
    kind: frozenset(f.encode_name for f in msgspec.structs.fields(cls)) - _MARKERS - cls.optional
    for kind, cls in _TYPES.items()
}


def kind_of(record: Record) -> str:
    """The record's ``type``."""
    return str(record.__struct_config__.tag)


# --- checking ---------------------------------------------------------------------------------

#: A JSON string (its escapes included), whose brackets do not nest.
_STRING: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET: Final = re.compile(r"[\[\]{}]")
_NESTING_STEP: Final = {"[": 1, "{": 1, "]": -1, "}": -1}
#: ``msgspec``'s "... - at `$.a[0]`" and "Object missing required field `x`".
_AT: Final = re.compile(r"^(?P<reason>.*?)(?: - at `(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING: Final = re.compile(r"^Object missing required field `(?P<name>[^`]*)`$")


def excerpt(value: object, limit: int = MAX_EXCERPT, *, quote: bool = True) -> str:
    """``value`` as a short, escaped, single-line quotation (``quote=False``: no quotes)."""
    text = str(value)
    shown = repr(text if len(text) <= limit else text[: limit - 1] + "…")
    return shown if quote else shown[1:-1]


def _nesting(line: str) -> int:
    brackets = _BRACKET.findall(_STRING.sub("", line))
    return max(accumulate(map(_NESTING_STEP.__getitem__, brackets)), default=0)


def _refusal(where: str, line: int | None, reason: str, path: str | None = None) -> TranscriptError:
    if path is not None and len(path) > MAX_PATH:
        path = path[: MAX_PATH - 1] + "…"
    field = "" if path is None else f"{excerpt(path, MAX_PATH, quote=False)}: "
    return TranscriptError(f"transcript {where}: {field}{reason}", line=line, path=path)


def _invalid(exc: msgspec.ValidationError, where: str, line: int | None) -> TranscriptError:
    found = _AT.match(str(exc))
    assert found is not None  # noqa: S101 - the pattern matches every text
    reason, at = found["reason"], found["path"]
    path = None if at is None or at == "$" else at.removeprefix("$").removeprefix(".")
    missing = _MISSING.match(reason)
    if missing is not None:
        path = missing["name"] if path is None else f"{path}.{missing['name']}"
        reason = "missing"
    reason = reason.replace("`", "")
    reason = excerpt(reason[:1].lower() + reason[1:], MAX_PATH, quote=False)
    return _refusal(where, line, reason, path)


def cut_mid_line(text: str, *, max_record_bytes: int) -> bool:
    """Whether ``text``, a last line with no newline after it, is a record whose writing was
    cut off (the process killed): not JSON, within the bounds of every line. A line longer
    or deeper than those is not taken for a cut: :func:`decode_line` refuses it, and it is
    never decoded here (100,000 levels would exhaust the decoder's recursion)."""
    if len(text) + 1 > max_record_bytes or _nesting(text) > MAX_NESTING:
        return False
    try:
        msgspec.json.decode(text)
    except msgspec.ValidationError:  # JSON, with a number out of range: not a cut
        return False
    except msgspec.DecodeError:
        return True
    return False


def decode_line(text: str, line: int, *, max_record_bytes: int) -> dict[str, Any]:
    """One line as a JSON object with a known string ``type``; :class:`TranscriptError` if not.

    The length and the nesting are checked on the text, before decoding.
    """
    where = f"line {line}"
    if len(text) + 1 > max_record_bytes:
        raise _refusal(where, line, f"longer than the record bound ({max_record_bytes} bytes)")
    if _nesting(text) > MAX_NESTING:
        raise _refusal(where, line, f"nested more than {MAX_NESTING} levels deep")
    try:
        data = msgspec.json.decode(text)
    except msgspec.ValidationError:  # a number out of range: the record's schema places it
        raise _out_of_range(text, line) from None
    except msgspec.DecodeError as exc:
        raise _refusal(where, line, f"not JSON ({excerpt(exc, 80, quote=False)})") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise _refusal(where, line, "not a transcript record (a JSON object with a type)")
    if data["type"] not in _TYPES:
        raise _refusal(where, line, f"unknown record type {excerpt(data['type'])}", "type")
    return data


def _out_of_range(text: str, line: int) -> TranscriptError:
    where = f"line {line}"
    cls = None
    try:
        kind = msgspec.json.decode(text, type=_Kind).type
        cls = _TYPES.get(kind)
        if cls is not None:
            msgspec.json.decode(text, type=cls)
    except msgspec.ValidationError as exc:
        return _invalid(exc, where if cls is None else f"{where} ({kind})", line)
    except msgspec.DecodeError:  # pragma: no cover - the text was JSON a moment ago
        pass
    return _refusal(where, line, "a number is out of range")


class _Kind(msgspec.Struct):
    type: str


def parse(data: Mapping[str, Any], where: str, line: int | None = None) -> Record:
    """One decoded record, checked against the struct of its ``type``."""
    kind = data.get("type")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None or not isinstance(kind, str):
        raise _refusal(where, line, "not a transcript record of a known type", "type")
    where = f"{where} ({kind})"
    if data.get("oversized") is not True and data.get("redacted") is not True:
        missing = sorted(_REQUIRED[kind] - data.keys())
        if missing:
            raise _refusal(where, line, "missing", missing[0])
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        raise _invalid(exc, where, line) from None


def parse_all(
    header: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
) -> tuple[Session, tuple[Event, ...]]:
    """A transcript's header and records, checked (for a ``Transcript`` built in code)."""
    first = parse(header, "header")
    if not isinstance(first, Session):
        raise _refusal("header", None, "not a session record", "type")
    events: list[Event] = []
    for number, data in enumerate(records, 1):
        record = parse(data, f"record {number}")
        if isinstance(record, Session):
            raise _refusal(f"record {number}", None, "a second session record", "type")
        events.append(record)
    return first, tuple(events)
