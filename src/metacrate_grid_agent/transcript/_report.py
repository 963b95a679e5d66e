"""Readable timelines of a recorded session: plain text, and one self-contained HTML file.

Both are built from a :class:`~metacrate_grid_agent.transcript.Transcript` alone: turns,
requests with their latency, attempts, retries and tokens, each call with its status and
latency, compaction, and where the session ended and why. Every line of the text form, and
every text of the HTML form, passes the library's one escaping rule (``display_safe``):
controls, format characters (bidi, zero-width), separators and other invisible characters
are shown as visible escapes, in the page as on the terminal, so nothing from a transcript
can act on a terminal or reorder text. The page is then HTML-escaped, carries its style
inline, loads nothing and runs no script (its Content-Security-Policy forbids both). Public
through :mod:`metacrate_grid_agent.transcript`.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from metacrate_grid_agent._core._redact import display_safe
from metacrate_grid_agent.transcript._load import NO_FINISH_NOTE, Transcript, load
from metacrate_grid_agent.transcript._schema import (
    Approval,
    Attempt,
    Compaction,
    Event,
    Finish,
    Reply,
    Request,
    RequestFailed,
    Session,
    ToolCall,
    ToolResult,
    Totals,
    Usage,
    kind_of,
    parse_all,
)

__all__ = ["report", "report_html"]

#: Longest text (reply, argument, observation, summary) shown in one timeline entry.
MAX_SHOWN_CHARS: Final = 300


def _short(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    text = " ".join(str(value).split())
    return display_safe(text if len(text) <= limit else text[: limit - 1] + "…")


def _ms(seconds: float) -> str:
    return f"{round(seconds * 1000)} ms"


def _tokens(usage: Usage | Totals | None) -> str:
    if usage is None:
        return "tokens not reported"
    parts = (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
    return "tokens " + "/".join("?" if n is None else str(n) for n in parts)


def _retries(record: Reply) -> list[str]:
    shown = []
    for attempt in record.attempt_records:
        if attempt.outcome == "ok":
            continue
        what = f"attempt {attempt.attempt} failed: {attempt.error_kind}"
        if attempt.status is not None:
            what += f" (HTTP {attempt.status})"
        if attempt.delay_s is not None:
            what += f", retried after {attempt.delay_s:.2f} s ({attempt.delay_source})"
        shown.append(_short(what))
    return shown


def _entries(records: Sequence[Event]) -> list[tuple[str, str, str, str]]:
    """(time, turn, kind, text) for every record, in order."""
    rows = []
    for record in records:
        kind = kind_of(record)
        if record.redacted:
            text = "record withheld by the writer's redaction"
        elif isinstance(record, Request):
            text = f"request {_short(record.request_id)}"
        elif isinstance(record, Reply):
            calls = record.tool_calls
            what = f"{len(calls)} tool call(s)" if calls else "final text"
            text = (
                f"reply: {'calls not kept' if record.oversized else what}, "
                f"{_ms(record.latency_s)}, {record.attempts} attempt(s), "
                f"{_tokens(record.usage)}, finish {_short(record.finish_reason)}"
            )
            for retry in _retries(record):
                text += f"; {retry}"
            if record.text:
                text += f"; text: {_short(record.text)}"
        elif isinstance(record, ToolCall):
            text = (
                f"-> {_short(record.name, 64)} {_short(record.arguments)} "
                f"({_short(record.effect, 64)}, id {_short(record.id, 64)})"
            )
        elif isinstance(record, ToolResult):
            text = (
                f"<- {_short(record.name, 64)} {_short(record.status, 64)} "
                f"{_ms(record.latency_s)}: {_short(record.observation)}"
            )
        elif isinstance(record, Compaction):
            text = "history compacted to fit its bounds"
        elif isinstance(record, Finish):
            text = _ending(record)
        elif isinstance(record, Approval):
            text = _verdict(record)
        elif isinstance(record, RequestFailed):
            text = _request_failed(record)
        else:
            text = "approval asked"
        if record.oversized:
            text += "; over the record bound: only its numbers were kept"
        rows.append((f"{record.t:.3f} s", str(record.turn), kind, text))
    return rows


def _verdict(record: Approval) -> str:
    """One approval as a verdict line: call, tool, verdict, reason, wait."""
    if record.verdict is None:
        return f"approval asked (turn {record.turn}; no verdict recorded)"
    text = f"approval {_short(record.id, 64)} ({_short(record.name, 64)}): "
    text += _short(record.verdict, 64)
    if record.reason:
        text += f" ({_short(record.reason)})"
    if record.wait_s is not None:
        text += f"; waited {_ms(record.wait_s)}"
    return text


def _attempt_line(attempt: Attempt) -> str:
    what = f"attempt {attempt.attempt}: {_short(attempt.error_kind or attempt.outcome, 64)}"
    if attempt.status is not None:
        what += f" (HTTP {attempt.status})"
    return what + f", {_ms(attempt.latency_s)}"


def _request_failed(record: RequestFailed) -> str:
    """A request that never completed, with every attempt it made."""
    error = record.error
    if error is None:
        how = f"cut ({_short(record.cancel_reason or 'from outside', 64)})"
    else:
        how = f"failed: {_short(error.kind, 64)}"
    text = f"request {_short(record.request_id or '?', 64)} {how}"
    text += f", {len(record.attempt_records)} attempt(s)"
    for attempt in record.attempt_records:
        text += f"; {_attempt_line(attempt)}"
    return text


def _ending(record: Finish) -> str:
    text = f"session ended: {_short(record.outcome, 64)}"
    for name, value in (
        ("bound", record.bound),
        ("cancel reason", record.cancel_reason),
        ("finish reason", record.finish_reason),
    ):
        if value:
            text += f" ({name}: {_short(value, 64)})"
    if record.error is not None:
        text += f"; error {_short(record.error.kind, 64)}: {_short(record.error.message)}"
    text += (
        f"; {record.turns} turn(s), {record.calls} call(s), "
        f"{record.attempts} attempt(s), {_tokens(record.usage)}, "
        f"{_ms(record.latency_s)}"
    )
    if record.final_text:
        text += f"; summary: {_short(record.final_text)}"
    if record.records_dropped:
        text += f"; {record.records_dropped} record(s) dropped at the transcript's bound"
    return text


def _heading(header: Session, records: Sequence[Event]) -> list[str]:
    tools = ", ".join(_short(t.name, 64) for t in header.tools or ()) or "-"
    lines = [
        (
            f"session {_short(header.session_id or '?', 64)} "
            f"(generation {header.generation}), library {_short(header.library or '?', 64)}"
        ),
        f"endpoint: {_short(header.endpoint or '-')}",
        f"tools: {tools}",
    ]
    if header.goal:
        lines.append(f"goal: {_short(header.goal)}")
    return lines


def _notes(transcript: Transcript, records: Sequence[Event]) -> list[str]:
    """What ``load`` noted, one line each (a transcript built in code: its missing finish)."""
    notes = list(transcript.notes)
    if not any(isinstance(r, Finish) for r in records) and NO_FINISH_NOTE not in notes:
        notes.append(NO_FINISH_NOTE)
    return [f"note: {_short(note)}" for note in notes]


def _parsed(
    source: Transcript | str | Path | Iterable[str],
) -> tuple[Session, tuple[Event, ...], list[str]]:
    """The transcript's records, checked (``load`` checks a file; this checks one built in
    code), and its notes."""
    transcript = source if isinstance(source, Transcript) else load(source)
    header, records = parse_all(transcript.header, transcript.records)
    return header, records, _notes(transcript, records)


def report(source: Transcript | str | Path | Iterable[str]) -> list[str]:
    """The session's timeline as text lines (terminal-safe)."""
    header, records, notes = _parsed(source)
    lines = [*_heading(header, records), *notes, ""]
    for when, turn, kind, text in _entries(records):
        label = f"turn {turn}" if turn else ""
        indent = "  " if kind in ("tool_call", "tool_result") else ""
        lines.append(f"{when:>10}  {label:<8} {indent}{text}")
    return [display_safe(line) for line in lines]


_STYLE: Final = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.3em; } table { border-collapse: collapse; width: 100%; }
td, th { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left;
         vertical-align: top; } th { background: #f4f4f4; }
td.t { white-space: nowrap; font-variant-numeric: tabular-nums; color: #666; }
tr.tool_result td, tr.tool_call td { padding-left: 2em; }
tr.finish td { font-weight: bold; } tr.reply td { background: #fafcff; }
.rejected, .failed, .ambiguous, .cancelled { color: #a40000; }
"""


def report_html(source: Transcript | str | Path | Iterable[str]) -> str:
    """The session's timeline as one self-contained HTML page (inline style, no script)."""
    header, records, notes = _parsed(source)

    def esc(text: str) -> str:
        return html.escape(display_safe(text))

    heading = [*_heading(header, records), *notes]
    rows = []
    for when, turn, kind, text in _entries(records):
        status = ""
        if kind == "tool_result":
            status = next((s for s in ("rejected", "failed", "ambiguous", "cancelled")
                           if f" {s} " in text), "")  # fmt: skip
        rows.append(
            f'<tr class="{esc(kind)}"><td class="t">{esc(when)}</td><td>{esc(turn)}</td>'
            f'<td>{esc(kind)}</td><td class="{status}">{esc(text)}</td></tr>'
        )
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            (
                '<meta http-equiv="Content-Security-Policy" '
                "content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            ),
            f"<title>{esc(heading[0])}</title>",
            f"<style>{_STYLE}</style></head><body>",
            f"<h1>{esc(heading[0])}</h1>",
            *(f"<p>{esc(line)}</p>" for line in heading[1:]),
            (
                "<table><thead><tr><th>time</th><th>turn</th><th>event</th><th>what</th></tr>"
                "</thead><tbody>"
            ),
            *rows,
            "</tbody></table></body></html>",
            "",
        ]
    )
