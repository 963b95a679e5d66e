"""The file journal's line format: a transcript that can be resumed.

Each line is a transcript record (:mod:`metacrate_grid_agent.transcript`: ``type``, ``seq``,
``t``, the hash chain ``prev``, and the members its type has, redacted and bounded for
display) that also carries ``j``, the journal record itself
(:mod:`metacrate_grid_agent._core._journal`) whole: never cut, so the exact history can be
rebuilt, with the key redacted. ``grid-agent report`` and ``replay`` read the transcript
members and ignore ``j``; :func:`read_records` reads ``j`` back, under the transcript
loader's rules (line length and nesting checked on the text before decoding, strict shapes,
the hash chain) with bounds sized for whole records. The format's constants are the
transcript's (a test checks they agree): this package does not import the transcript's,
which reaches the test kit for its replay.

Journal record to transcript record: header to ``session``, request to ``request``, reply
to ``reply``, model error to ``request_failed``, summary to ``compaction``, verdict to
``approval``, call to ``tool_call``, result to ``tool_result``, finish to ``finish``.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Final

import msgspec

from metacrate_grid_agent._core._journal import (
    Call,
    Finish,
    Header,
    ModelError,
    Record,
    Reply,
    Request,
    Result,
    Summary,
    Verdict,
    decode_record,
)
from metacrate_grid_agent._core._redact import ContentGuard, bounded_text
from metacrate_grid_agent._core._types import Usage
from metacrate_grid_agent.config import Secret
from metacrate_grid_agent.errors import JournalError

__all__ = [
    "MAX_JOURNAL_BYTES",
    "MAX_JOURNAL_RECORDS",
    "MAX_JOURNAL_RECORD_BYTES",
    "LineWriter",
    "read_records",
]

#: The transcript format's schema name, version and chain start (``transcript._writer``).
SCHEMA: Final = "metacrate-grid-agent.transcript"
SCHEMA_VERSION: Final = 1
CHAIN_START: Final = "0" * 64
#: The transcript writer's bound on a display text and on a displayed list.
DEFAULT_MAX_FIELD_BYTES: Final = 16 * 1024
MAX_LIST_ITEMS: Final = 64
#: Deepest nesting of a journal line (the transcript's ``MAX_NESTING``).
MAX_NESTING: Final = 64
_STRING: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET: Final = re.compile(r"[\[\]{}]")
_NESTING_STEP: Final = {"[": 1, "{": 1, "]": -1, "}": -1}
#: The transcript types a journal line may have, one per journal record type.
_TYPES: Final = frozenset(
    {"session", "request", "reply", "request_failed", "compaction", "approval", "tool_call",
     "tool_result", "finish"}
)  # fmt: skip


#: The longest texts (in characters, at most four UTF-8 bytes each) that :func:`_bounded`
#: shows untouched under the display bound and under an id's 256 bytes.
_SHORT: Final = DEFAULT_MAX_FIELD_BYTES // 4
_SHORT_ID: Final = 256 // 4


def _bounded(text: str, limit: int = DEFAULT_MAX_FIELD_BYTES) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes for display (short texts untouched, at once)."""
    return text if len(text) * 4 <= limit else bounded_text(text, limit)


def line_hash(line: str) -> str:
    """The ``prev`` the next line holds of ``line`` (the transcript's hash chain)."""
    return hashlib.sha256(line.encode("utf-8")).hexdigest()


def _too_deep(line: str) -> bool:
    """Whether ``line``'s arrays and objects nest deeper than ``MAX_NESTING`` (brackets
    inside strings not counted; a line with fewer brackets than the bound is not parsed)."""
    if line.count("[") + line.count("{") <= MAX_NESTING:
        return False
    brackets = _BRACKET.findall(_STRING.sub("", line))
    return max(accumulate(map(_NESTING_STEP.__getitem__, brackets)), default=0) > MAX_NESTING


#: Longest journal line read back: a reply at the ceiling of ``max_response_bytes`` (64 MiB)
#: decoded, plus its display members.
MAX_JOURNAL_RECORD_BYTES: Final = 80 * 1024 * 1024
#: Largest journal file read back (each record's size is bounded by its own settings).
MAX_JOURNAL_BYTES: Final = 512 * 1024 * 1024
#: Most records one journal holds when read back (every bound of a session is far below).
MAX_JOURNAL_RECORDS: Final = 1_000_000
_ASCII_LOWER: Final = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_STATUS: Final = {"success": "ok", "failure": "failed", "ambiguous": "ambiguous"}


class _Line(msgspec.Struct):
    """A journal line as the resume reads it: its type, chain link and journal record."""

    type: str
    prev: str
    j: Record


_LINE: Final = msgspec.json.Decoder(_Line)
_ENCODE: Final = msgspec.json.Encoder().encode


# The lines as written: each a struct whose fields are the transcript record's members in
# order, then ``j`` (the journal record's own bytes, encoded once), so a line is one msgspec
# encoding with no intermediate dict. The header and the finish (once per run) are dicts.


class _Shown(msgspec.Struct, tag_field="type"):
    seq: int
    t: float
    prev: str


class _RequestLine(_Shown, tag="request"):
    turn: int
    request_id: str
    j: Record


class _ShownToolCall(msgspec.Struct):
    id: str
    name: str
    arguments: str


class _ReplyLine(_Shown, tag="reply"):
    turn: int
    request_id: str
    text: str | None
    tool_calls: list[_ShownToolCall]
    usage: Usage | None
    finish_reason: str | None
    attempts: int
    latency_s: float
    attempt_records: tuple[()]
    j: Record


class _ShownError(msgspec.Struct):
    kind: str
    message: str
    status: int | None
    request_id: str | None
    attempts: int


class _FailedLine(_Shown, tag="request_failed"):
    turn: int
    request_id: str | None
    error: _ShownError
    cancel_reason: None
    attempt_records: tuple[()]
    j: Record


class _CompactionLine(_Shown, tag="compaction"):
    turn: int
    j: Record


class _ApprovalLine(_Shown, tag="approval"):
    turn: int
    id: str
    name: str
    verdict: str
    reason: str | None
    wait_s: float
    timed_out: bool
    j: Record


class _CallLine(_Shown, tag="tool_call"):
    turn: int
    id: str
    name: str
    arguments: str
    effect: str
    j: Record


class _ResultLine(_Shown, tag="tool_result"):
    turn: int
    id: str
    name: str
    status: str
    observation: str
    latency_s: float
    arguments: str
    j: Record


@dataclass(slots=True)
class LineWriter:
    """Turns records into chained lines for one journal (its position in the chain)."""

    guard: ContentGuard
    needle: bytes = field(default=b"", repr=False)
    """The key as it stands inside a line's JSON strings (a quote or backslash escaped, see
    :meth:`ContentGuard.contains_secret_json`), ASCII letters folded to lower case, in UTF-8:
    found in a line's bytes folded alike, with no decoding."""
    seq: int = 0
    prev: str = CHAIN_START
    turn: int = 0
    calls: dict[str, Call] = field(default_factory=dict)
    reported: list[str] = field(default_factory=list)
    """The call ids a result line showed (the finish lists the others). A list: a set of a
    session's ids costs several times the memory, and the finish reads it once."""
    _shown: Any = None
    """How the current record's display texts are shown: bounded only, or (when the record
    holds the key) redacted and bounded."""

    @classmethod
    def for_secret(cls, secret: Secret | str | None) -> LineWriter:
        """A writer that redacts ``secret``."""
        value = secret.reveal() if isinstance(secret, Secret) else secret
        # As the key stands in a line: inside a JSON string (a quote or backslash escaped).
        in_json = json.dumps(value or "")[1:-1]
        return cls(ContentGuard(secret), in_json.translate(_ASCII_LOWER).encode())

    def fresh(self) -> LineWriter:
        """A writer for another journal, at the chain's start, sharing this one's guard."""
        return LineWriter(self.guard, self.needle)

    def resume_after(self, lines: Sequence[str], records: Sequence[Record]) -> None:
        """Continue the chain after ``lines`` (the journal as read back)."""
        self.seq = len(lines)
        self.prev = line_hash(lines[-1]) if lines else CHAIN_START
        for record in records:
            self._track(record)

    def line(self, record: Record) -> bytes:
        """The next line (with its newline) for ``record``."""
        self._shown = _bounded
        try:
            text = _ENCODE(self._shown_line(record, record))
        except (msgspec.EncodeError, UnicodeEncodeError):
            raise JournalError("a record could not be encoded (text that is not UTF-8)") from None
        # The line holds the key only if the record does (its display members are cut from
        # the record's texts; redacting texts without the key changes nothing). bytes.lower()
        # folds ASCII letters only, as contains_secret does on the decoded text.
        if self.needle and self.needle in text.lower():
            self._shown = self._text
            text = _ENCODE(self._shown_line(record, self._redacted(record)))
        self.prev = hashlib.sha256(text).hexdigest()  # line_hash, without decoding
        self.seq += 1
        return text + b"\n"

    def _track(self, record: Record) -> None:
        if isinstance(record, Request):
            self.turn = record.turn
        elif isinstance(record, Call):
            self.calls = {record.call_id: record}
        elif isinstance(record, Result):
            self.reported.append(record.call_id)

    def _text(self, text: str, limit: int = DEFAULT_MAX_FIELD_BYTES) -> str:
        return self.guard.text(text, limit)

    def _redacted(self, record: Record) -> Record:
        """``record`` with every text that shows the key redacted (never cut)."""
        data = msgspec.to_builtins(record)
        return decode_record(msgspec.json.encode(self._scrub(data)))

    def _scrub(self, data: Any) -> Any:
        if isinstance(data, str):
            return self.guard.text(data, max(len(data.encode()), 64) * 4)
        if isinstance(data, dict):
            return {k: self._scrub(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self._scrub(v) for v in data]
        return data

    def _shown_line(self, record: Record, j: Record) -> Any:
        """The line of ``record``: its transcript members (redacted, bounded: for display
        only), then ``j``; what the writer tracks of it (see :meth:`_track`) noted first."""
        text = self._shown
        bounded = text is _bounded  # then a text short enough is shown as it is, at once
        seq, prev = self.seq, self.prev
        if isinstance(record, Header):
            return self._dict_line("session", 0.0, self._header_view(record), j)
        t = 0.0 if record.t < 0 else record.t
        if isinstance(record, Call):
            self.calls = {record.call_id: record}
            call_id, arguments = record.call_id, record.arguments
            if not (bounded and len(call_id) <= _SHORT_ID and len(arguments) <= _SHORT):
                call_id, arguments = text(call_id, 256), text(arguments)
            return _CallLine(
                seq, t, prev, self.turn, call_id, record.name, arguments, record.effect, j
            )
        if isinstance(record, Result):
            self.reported.append(record.call_id)
            call = self.calls.get(record.call_id)
            call_id, observation = record.call_id, record.observation
            arguments = "" if call is None else call.arguments
            if not (
                bounded
                and len(call_id) <= _SHORT_ID
                and len(observation) <= _SHORT
                and len(arguments) <= _SHORT
            ):
                call_id, observation = text(call_id, 256), text(observation)
                arguments = text(arguments)
            return _ResultLine(
                seq, t, prev, self.turn, call_id, "" if call is None else call.name,
                _STATUS[record.status], observation, max(0.0, round(record.latency_s, 6)),
                arguments, j,
            )  # fmt: skip
        if isinstance(record, Request):
            self.turn = record.turn
            return _RequestLine(seq, t, prev, record.turn, record.request_id, j)
        if isinstance(record, Reply):
            c = record.completion
            return _ReplyLine(
                seq, t, prev, self.turn, c.request_id,
                None if c.text is None else text(c.text),
                [
                    _ShownToolCall(text(k.id, 256), text(k.name, 256), text(k.arguments))
                    for k in c.tool_calls[:MAX_LIST_ITEMS]
                ],
                c.usage,
                None if c.finish_reason is None else text(c.finish_reason, 64),
                c.attempts, max(0.0, round(c.latency_s, 6)), (), j,
            )  # fmt: skip
        if isinstance(record, ModelError):
            error = _ShownError(
                record.error_kind, text(record.message, 1024), record.status,
                record.request_id, record.attempts,
            )  # fmt: skip
            return _FailedLine(seq, t, prev, self.turn, record.request_id, error, None, (), j)
        if isinstance(record, Summary):
            return _CompactionLine(seq, t, prev, self.turn, j)
        if isinstance(record, Verdict):
            call = self.calls.get(record.call_id)
            return _ApprovalLine(
                seq, t, prev, self.turn, text(record.call_id, 256),
                "" if call is None else call.name,
                "approved" if record.approved else "denied",
                None if record.reason is None else text(record.reason, 1024),
                max(0.0, round(record.latency_s, 6)), False, j,
            )  # fmt: skip
        return self._dict_line("finish", t, self._finish_view(record), j)

    def _dict_line(self, kind: str, t: float, members: dict[str, Any], j: Record) -> dict[str, Any]:
        return {"type": kind, "seq": self.seq, "t": t, "prev": self.prev, **members, "j": j}

    def _header_view(self, record: Header) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "v": SCHEMA_VERSION,
            "library": record.library,
            "session_id": record.session_id,
            "generation": record.generation,
            "config": record.config,
            "tools": [
                {
                    "name": p.name,
                    "description": p.description,
                    "parameters": p.parameters,
                    "effect": p.effect,
                    "timeout_s": p.timeout_s,
                }
                for p in record.tools
            ],
            "initial_messages": [
                self._scrub_view(msgspec.to_builtins(m)) for m in record.history[:MAX_LIST_ITEMS]
            ],
            "journal": record.run_id,
        }

    def _finish_view(self, record: Finish) -> dict[str, Any]:
        report = record.report
        text = self._shown
        error = None
        if report is not None and report.error_kind is not None:
            error = {
                "kind": report.error_kind,
                "message": text(report.error_message or "", 1024),
                "status": None,
                "request_id": None,
                "attempts": report.attempts,
            }
        usage = None if report is None else report.usage or None
        reported = set(self.reported)
        return {
            "turn": self.turn,
            "session_id": "",
            "generation": 0,
            "outcome": record.outcome,
            "bound": None if report is None else report.bound,
            "cancel_reason": None if report is None or report.cancel_reason is None
            else text(report.cancel_reason, 256),
            "error": error,
            "turns": 0 if report is None else report.turns,
            "calls": 0 if report is None else report.calls,
            "usage": usage,
            "attempts": 0 if report is None else report.attempts,
            "latency_s": 0.0 if report is None else max(0.0, round(report.latency_s, 6)),
            "compactions": 0 if report is None else report.compactions,
            "final_text": None if report is None or report.final_text is None
            else text(report.final_text),
            "finish_reason": None if report is None or report.finish_reason is None
            else text(report.finish_reason, 64),
            "ambiguous_call": None if report is None or report.ambiguous_call is None
            else text(report.ambiguous_call, 256),
            "unreported_calls": []
            if report is None
            else [
                {"id": text(c.call_id, 256), "name": text(c.name, 256), "status": c.status,
                 "observation": text(c.observation)}
                for c in report.call_list
                if c.call_id not in reported
            ],
            "records_dropped": 0,
        }  # fmt: skip

    def _scrub_view(self, data: Any) -> Any:
        if isinstance(data, str):
            return self._text(data)
        if isinstance(data, dict):
            return {str(k): self._scrub_view(v) for k, v in list(data.items())[:MAX_LIST_ITEMS]}
        if isinstance(data, list):
            return [self._scrub_view(v) for v in data[:MAX_LIST_ITEMS]]
        return data


def read_records(data: bytes, run_id: str) -> tuple[tuple[str, ...], tuple[Record, ...], int]:
    """The complete lines of a journal file, their records, and the byte length they span.

    A last line cut mid-way by a crash (no newline after it) is left out: the returned
    length ends before it, so the writer can cut it off and go on. Every line is checked
    as a transcript record and its hash chain verified, then its ``j`` decoded as a journal
    record; any failure is a :class:`JournalError` naming the line.
    """
    if len(data) > MAX_JOURNAL_BYTES:
        raise JournalError(f"run {run_id}: journal larger than {MAX_JOURNAL_BYTES} bytes")
    end = data.rfind(b"\n") + 1
    try:
        text = data[:end].decode("utf-8")
    except UnicodeDecodeError:
        raise JournalError(f"run {run_id}: journal is not UTF-8 text", run_id=run_id) from None
    lines = text.split("\n")[:-1] if text else []
    if len(lines) > MAX_JOURNAL_RECORDS:
        raise JournalError(f"run {run_id}: more than {MAX_JOURNAL_RECORDS} records")
    records: list[Record] = []
    prev = CHAIN_START
    for number, line in enumerate(lines, 1):
        where = f"run {run_id}: journal line {number}"
        if len(line) + 1 > MAX_JOURNAL_RECORD_BYTES:
            raise JournalError(f"{where} is longer than {MAX_JOURNAL_RECORD_BYTES} bytes")
        if _too_deep(line):
            raise JournalError(f"{where} is nested more than {MAX_NESTING} levels deep")
        try:
            decoded = _LINE.decode(line)
        except msgspec.DecodeError as exc:
            reason = ascii(str(exc).replace("`", ""))[1:121]  # escaped: it may quote the file
            raise JournalError(
                f"{where} holds no journal record ({reason})", run_id=run_id
            ) from None
        record = decoded.j
        if decoded.type not in _TYPES:
            raise JournalError(f"{where}: not a journal line", run_id=run_id)
        if decoded.prev != prev:
            raise JournalError(
                f"{where} breaks the hash chain (a line before it was changed, removed or "
                "inserted)",
                run_id=run_id,
            )
        if (number == 1) != isinstance(record, Header):
            raise JournalError(f"{where}: the header must come first, once", run_id=run_id)
        records.append(record)
        prev = line_hash(line)
    return tuple(lines), tuple(records), end
