"""Reading a session transcript back: :func:`load` (bounded, every record checked against
its schema) and :class:`Transcript`. Public through :mod:`metacrate_grid_agent.transcript`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metacrate_grid_agent._files import read_regular
from metacrate_grid_agent.errors import TranscriptError
from metacrate_grid_agent.transcript._schema import decode_line, excerpt, parse
from metacrate_grid_agent.transcript._writer import (
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_MAX_TOTAL_BYTES,
    MAX_RECORDS,
    SCHEMA,
    SCHEMA_VERSION,
)

__all__ = ["Transcript", "load"]


@dataclass(frozen=True, slots=True)
class Transcript:
    """A transcript read back: its header and every later record, in order.

    :func:`load` has checked every record's shape; :func:`report`, :func:`report_html` and
    :func:`replay` check a transcript built in code alike (:class:`TranscriptError`).
    """

    header: Mapping[str, Any]
    records: tuple[Mapping[str, Any], ...]

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
        lines: Iterable[str] = text.split("\n")
    else:
        lines = source
    records: list[dict[str, Any]] = []
    total = 0
    for number, line in enumerate(lines, 1):
        total += len(line) + 1
        if total > max_total_bytes + 1:
            raise TranscriptError(f"transcript is larger than {max_total_bytes} bytes")
        if not line.strip():
            continue
        if len(records) >= MAX_RECORDS:
            raise TranscriptError(f"transcript has more than {MAX_RECORDS} records", line=number)
        record = decode_line(line, number, max_record_bytes=max_record_bytes)
        if not records:
            _check_header(record, number)
        elif record["type"] == "session":
            raise TranscriptError(
                f"transcript line {number}: a second session record", line=number, path="type"
            )
        parse(record, f"line {number}", number)
        records.append(record)
    if not records:
        raise TranscriptError("a transcript starts with its session record; this one is empty")
    return Transcript(header=records[0], records=tuple(records[1:]))


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
