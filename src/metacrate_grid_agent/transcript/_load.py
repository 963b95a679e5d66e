"""Reading a session transcript back: :func:`load` (bounded, every record checked against
its schema) and :class:`Transcript`. Public through :mod:`metacrate_grid_agent.transcript`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from metacrate_grid_agent._files import read_regular
from metacrate_grid_agent.errors import TranscriptError
from metacrate_grid_agent.transcript._schema import cut_mid_line, decode_line, excerpt, parse
from metacrate_grid_agent.transcript._writer import (
    CHAIN_START,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_MAX_TOTAL_BYTES,
    MAX_RECORDS,
    SCHEMA,
    SCHEMA_VERSION,
    line_hash,
)

__all__ = ["CUT_NOTE", "NO_FINISH_NOTE", "UNCHAINED_NOTE", "Transcript", "load"]

#: The note of a transcript whose last line was cut mid-way (the process was killed).
CUT_NOTE: Final = "the last record is incomplete (cut mid-line) and was left out"
#: The note of a transcript with no ``finish`` record.
NO_FINISH_NOTE: Final = "the session ended without a finish record (process killed?)"
#: The note of a transcript written before records carried the hash chain.
UNCHAINED_NOTE: Final = (
    "written without a hash chain (an older library): its integrity cannot be checked"
)


@dataclass(frozen=True, slots=True)
class Transcript:
    """A transcript read back: its header and every later record, in order.

    :func:`load` has checked every record's shape; :func:`report`, :func:`report_html` and
    :func:`replay` check a transcript built in code alike (:class:`TranscriptError`).
    """

    header: Mapping[str, Any]
    records: tuple[Mapping[str, Any], ...]
    notes: tuple[str, ...] = ()
    """What :func:`load` noticed without refusing the file: a cut last record, no finish
    record, no hash chain to check. One line each."""

    def of_type(self, kind: str) -> list[Mapping[str, Any]]:
        """The records of one ``type``, in order."""
        return [r for r in self.records if r.get("type") == kind]

    @property
    def finish(self) -> Mapping[str, Any] | None:
        """The ``finish`` record, if the session got that far."""
        found = self.of_type("finish")
        return found[-1] if found else None


def load(
    source: str | Path | Iterable[str],
    *,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Transcript:
    """Read a transcript from a file path or from lines; :class:`TranscriptError` if unfit.

    Every line is checked before it is used: at most ``max_record_bytes`` long (pass the
    writer's, if it had a larger one), nested at most ``MAX_NESTING`` deep, JSON, and shaped
    as its record type says (strict types, finite numbers, no negative count); the whole at
    most ``max_total_bytes`` and :data:`MAX_RECORDS` records. The error names the line and
    the field.

    A crashed session's record is read as far as it goes: a last line cut mid-way (no
    newline after it, not JSON) is left out, and a transcript with no ``finish`` record is
    read whole; both are said in :attr:`Transcript.notes`. Each record's ``prev`` (the hash
    chain) must be the hash of the line before it: a mismatch is a :class:`TranscriptError`
    naming the line that was changed. A transcript written without the chain is read, with
    a note that its integrity cannot be checked.
    """
    if isinstance(source, str | Path):
        try:
            data = read_regular(source, max_total_bytes).data
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            shown = f"{excerpt(source, 200)}: {excerpt(reason, 200, quote=False)}"
            raise TranscriptError(f"cannot read transcript {shown}") from None
        if len(data) > max_total_bytes:
            raise TranscriptError(f"transcript is larger than {max_total_bytes} bytes")
        lines = text.split("\n")
    else:
        lines = _bounded(source, max_total_bytes)
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    chained: bool | None = None
    previous = ""
    for number, text_line in enumerate(lines, 1):
        line = text_line.removesuffix("\n")
        if not line.strip():
            continue
        if len(records) >= MAX_RECORDS:
            raise TranscriptError(f"transcript has more than {MAX_RECORDS} records", line=number)
        if (
            number - 1 == last
            and number == len(lines)
            and cut_mid_line(line, max_record_bytes=max_record_bytes)
        ):
            notes.append(CUT_NOTE)
            break
        record = decode_line(line, number, max_record_bytes=max_record_bytes)
        if not records:
            _check_header(record, number)
            chained = "prev" in record
        elif record["type"] == "session":
            raise TranscriptError(
                f"transcript line {number}: a second session record", line=number, path="type"
            )
        parse(record, f"line {number}", number)
        if chained:
            _check_chain(record, number, line_hash(previous) if records else CHAIN_START)
        elif "prev" in record:
            raise _broken(number, "holds a hash chain its header does not start")
        records.append(record)
        previous = line
    if not records:
        raise TranscriptError("a transcript starts with its session record; this one is empty")
    if not any(r["type"] == "finish" for r in records[1:]):
        notes.append(NO_FINISH_NOTE)
    if not chained:
        notes.append(UNCHAINED_NOTE)
    return Transcript(header=records[0], records=tuple(records[1:]), notes=tuple(notes))


def _bounded(source: Iterable[str], max_total_bytes: int) -> list[str]:
    """The lines of ``source``, at most ``max_total_bytes`` of them in all."""
    lines: list[str] = []
    total = 0
    for line in source:
        total += len(line) + (0 if line.endswith("\n") else 1)
        if total > max_total_bytes + 1:
            raise TranscriptError(f"transcript is larger than {max_total_bytes} bytes")
        lines.append(line)
    return lines


def _broken(number: int, what: str) -> TranscriptError:
    return TranscriptError(
        f"transcript line {number}: the hash chain is broken: {what}", line=number, path="prev"
    )


def _check_chain(record: Mapping[str, Any], number: int, expected: str) -> None:
    """The record's ``prev`` is ``expected``, the hash of the line before it."""
    prev = record.get("prev")
    if prev == expected:
        return
    if prev is None:
        raise _broken(number, "this record has no prev (it was inserted or edited)")
    if number == 1:
        raise _broken(number, "the header's prev is not the chain's start")
    changed = number - 1
    raise TranscriptError(
        f"transcript line {changed} was changed after it was written (or a line before "
        f"line {number} was removed or inserted): line {number} holds another hash of it",
        line=changed,
        path="prev",
    )


def _check_header(record: Mapping[str, Any], number: int) -> None:
    """The first record is this library's session record, of the version this library reads."""
    if record["type"] != "session":
        raise TranscriptError(
            f"transcript line {number}: a transcript starts with its session record",
            line=number,
            path="type",
        )
    if record.get("schema") != SCHEMA:
        raise TranscriptError(
            f"transcript line {number}: not a transcript of this library "
            f"(schema {SCHEMA!r} expected)",
            line=number,
            path="schema",
        )
    version = record.get("v")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise TranscriptError(
            f"transcript line {number}: schema version {excerpt(version)}; "
            f"this library reads {SCHEMA_VERSION}",
            line=number,
            path="v",
        )


# The replay and the reports live in their own modules; they are public through this one.
