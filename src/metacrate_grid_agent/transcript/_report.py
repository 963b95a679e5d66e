"""Readable timelines of a recorded session: plain text, and one self-contained HTML file.

Both are built from a :class:`~metacrate_grid_agent.transcript.Transcript` alone: when the
session started (UTC), turns, requests with their latency, attempts, retries and tokens
("not reported" when no reply reported usage), each call with its server, status and
latency (an approved mutating call marked: it changed the world with the operator's
consent), compaction, and where the session ended and why. Every line of the text form, and
every text of the HTML form, passes the library's one escaping rule (``display_safe``):
controls, format characters (bidi, zero-width), separators and other invisible characters
are shown as visible escapes, in the page as on the terminal, so nothing from a transcript
can act on a terminal or reorder text. The page is then HTML-escaped, carries its style
inline, loads nothing and runs no script (its Content-Security-Policy forbids both). Public
through :mod:`metacrate_grid_agent.transcript`.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

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

__all__ = ["report", "report_data", "report_html"]

#: Longest text (reply, argument, observation, summary) shown in one timeline entry.
MAX_SHOWN_CHARS: Final = 300


def _short(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    text = " ".join(str(value).split())
    return display_safe(text if len(text) <= limit else text[: limit - 1] + "…")


def _ms(seconds: float) -> str:
    return f"{round(seconds * 1000)} ms"


def _unreported(usage: Usage | Totals | None) -> bool:
    """Whether the numbers say nothing: no usage, or none of the replies reported any."""
    if usage is None:
        return True
    return isinstance(usage, Totals) and usage.requests_without_usage >= usage.requests


def _tokens(usage: Usage | Totals | None) -> str:
    if _unreported(usage):
        return "tokens not reported"
    assert usage is not None  # noqa: S101 - _unreported says so
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


@dataclass(frozen=True, slots=True)
class _Entry:
    """One timeline row: its text (one line, shortened), tone and the whole long texts."""

    t: float
    turn: int
    kind: str
    text: str
    tone: str = ""
    folds: tuple[tuple[str, str], ...] = ()
    fields: Mapping[str, object] = dataclasses.field(default_factory=dict)


#: What a ``report --json`` timeline entry says beside its text (None where it does not apply).
FIELDS: Final = ("call_id", "tool", "server", "effect", "verdict", "status", "latency_s")
#: The marker of an approved mutating call in the text report.
APPROVED_MARK: Final = "** approved mutating call **"


@dataclass(frozen=True, slots=True)
class _Calls:
    """What the rows of one call share, from the whole transcript: each tool's server, each
    call's effect and approval verdict."""

    servers: Mapping[str, str]
    effects: Mapping[str, str]
    verdicts: Mapping[str, str]

    @classmethod
    def of(cls, header: Session, records: Sequence[Event]) -> _Calls:
        servers = {
            k.removeprefix("server:"): v
            for k, v in (header.labels or {}).items()
            if k.startswith("server:")
        }
        servers.update({t.name: t.server for t in header.tools or () if t.server})
        effects = {t.name: str(t.effect.value) for t in header.tools or ()}
        return cls(
            servers,
            {
                **{r.id: effects.get(r.name, "") for r in records if isinstance(r, Approval)},
                **{r.id: r.effect for r in records if isinstance(r, ToolCall)},
            },
            {r.id: r.verdict for r in records if isinstance(r, Approval) and r.verdict},
        )

    def approved_mutation(self, call_id: str) -> bool:
        """Whether the call was a mutating one the operator approved."""
        return self.verdicts.get(call_id) == "approved" and self.effects.get(call_id) == "mutating"

    def fields(self, call_id: str, name: str, **more: object) -> dict[str, object]:
        """A call's row fields: its id, tool, server, effect and verdict (and ``more``)."""
        return {
            "call_id": call_id,
            "tool": name,
            "server": self.servers.get(name),
            "effect": self.effects.get(call_id) or None,
            "verdict": self.verdicts.get(call_id),
            **more,
        }

    def where(self, name: str) -> str:
        """``, server NAME`` for a tool of an MCP server, else nothing."""
        server = self.servers.get(name)
        return "" if server is None else f", server {_short(server, 64)}"


def _whole(label: str, text: str | None) -> tuple[tuple[str, str], ...]:
    """``text`` kept whole for folding, when the timeline shows it shortened."""
    if text is None or len(" ".join(text.split())) <= MAX_SHOWN_CHARS:
        return ()
    return ((label, text),)


#: The colour class of a call's status: a closed set, so a status from the file never
#: becomes markup (any unknown status is shown as a failure).
_STATUS_TONES: Final = {
    "rejected": "rejected",
    "failed": "failed",
    "denied": "denied",
    "cancelled": "cancelled",
    "not_run": "cancelled",
    "ambiguous": "ambiguous",
}
#: Every class a timeline row may carry; anything else is dropped when the row is drawn.
_ROW_CLASSES: Final = frozenset(
    {"completed", "failed", "rejected", "denied", "cancelled", "ambiguous", "approved"}
)
#: The record types a row may be of (the schema's tags).
_KINDS: Final = frozenset(
    {"request", "reply", "request_failed", "approval", "tool_call", "tool_result", "compaction",
     "finish"}
)  # fmt: skip


def _tone(outcome: str) -> str:
    """The colour class of a session outcome."""
    if outcome == "completed":
        return "completed"
    if outcome in ("cancelled", "superseded"):
        return "cancelled"
    if outcome == "ambiguous_mutation":
        return "ambiguous"
    return "failed" if outcome else ""


def _entry(record: Event, attempts: int, calls: _Calls) -> _Entry:
    """One record as a timeline row; ``attempts``: the session's, failed requests' included."""
    kind = kind_of(record)
    tone = ""
    folds: tuple[tuple[str, str], ...] = ()
    fields: dict[str, object] = {}
    if isinstance(record, Reply | Finish):
        fields["latency_s"] = record.latency_s
    if record.redacted:
        text = "record withheld by the writer's redaction"
    elif isinstance(record, Request):
        text = f"request {_short(record.request_id)}"
    elif isinstance(record, Reply):
        proposed = record.tool_calls
        what = f"{len(proposed)} tool call(s)" if proposed else "final text"
        text = (
            f"reply: {'calls not kept' if record.oversized else what}, "
            f"{_ms(record.latency_s)}, {record.attempts} attempt(s), "
            f"{_tokens(record.usage)}, finish {_short(record.finish_reason)}"
        )
        for retry in _retries(record):
            text += f"; {retry}"
        if record.text:
            text += f"; text: {_short(record.text)}"
            folds = _whole("reply text", record.text)
    elif isinstance(record, ToolCall):
        text = (
            f"-> {_short(record.name, 64)} {_short(record.arguments)} "
            f"({_short(record.effect, 64)}, id {_short(record.id, 64)}{calls.where(record.name)})"
        )
        folds = _whole("arguments", record.arguments)
        fields = calls.fields(record.id, record.name)
        if calls.approved_mutation(record.id):
            text, tone = f"{text} {APPROVED_MARK}", "approved"
    elif isinstance(record, ToolResult):
        tone = _STATUS_TONES.get(record.status, "failed") if record.status != "ok" else ""
        text = (
            f"<- {_short(record.name, 64)} {_short(record.status, 64)} "
            f"{_ms(record.latency_s)} (id {_short(record.id, 64)}{calls.where(record.name)}): "
            f"{_short(record.observation)}"
        )
        folds = _whole("observation", record.observation)
        if record.status != "ok" and record.arguments:
            text += f"; arguments {_short(record.arguments)}"
            folds += _whole("arguments", record.arguments)
        fields = calls.fields(
            record.id, record.name, status=record.status, latency_s=record.latency_s
        )
        if calls.approved_mutation(record.id):
            text += f" {APPROVED_MARK}"
            tone = tone or "approved"
    elif isinstance(record, Compaction):
        text = "history compacted to fit its bounds"
    elif isinstance(record, Finish):
        text = _ending(record, attempts)
        tone = _tone(record.outcome)
        folds = _whole("summary", record.final_text)
    elif isinstance(record, Approval):
        text = _verdict(record, calls.where(record.name))
        tone = "" if record.verdict in (None, "approved") else "denied"
        if record.verdict:
            fields = calls.fields(record.id, record.name)
            if calls.approved_mutation(record.id):
                tone = "approved"
    elif isinstance(record, RequestFailed):
        text = _request_failed(record)
        tone = "failed"
    else:  # pragma: no cover - every record type is handled above
        text = kind
    if record.oversized:
        text += "; over the record bound: only its numbers were kept"
    return _Entry(record.t, record.turn, kind, text, tone, folds, fields)


def _verdict(record: Approval, where: str) -> str:
    """One approval as a verdict line: call, tool (``where``: its server), verdict, reason,
    wait."""
    if record.verdict is None:
        return f"approval asked (turn {record.turn}; no verdict recorded)"
    text = f"approval {_short(record.id, 64)} ({_short(record.name, 64)}{where}): "
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


def _stop(record: Finish) -> str | None:
    """Why the session stopped: its bound, its cut, its error, or the model's finish."""
    if record.bound:
        return f"bound: {_short(record.bound, 64)}"
    if record.cancel_reason:
        return f"cancelled: {_short(record.cancel_reason, 64)}"
    if record.error is not None:
        return f"error: {_short(record.error.kind, 64)}"
    if record.outcome == "completed" and record.finish_reason:
        return f"finish reason: {_short(record.finish_reason, 64)}"
    return None


def _ending(record: Finish, attempts: int) -> str:
    text = f"session ended: {_short(record.outcome, 64)}"
    stop = _stop(record)
    if stop:
        text += f" ({stop})"
    if record.error is not None:
        text += f"; error {_short(record.error.kind, 64)}: {_short(record.error.message)}"
    text += (
        f"; {record.turns} turn(s), {record.calls} call(s), "
        f"{max(attempts, record.attempts)} attempt(s), {_tokens(record.usage)}, "
        f"{_ms(record.latency_s)}"
    )
    if record.final_text:
        text += f"; summary: {_short(record.final_text)}"
    if record.records_dropped:
        text += f"; {record.records_dropped} record(s) dropped at the transcript's bound"
    return text


def _counts(values: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def _summary(header: Session, records: Sequence[Event], calls: _Calls) -> dict[str, Any]:
    """The facts an operator looks for first, from the header and the records."""
    finish = next((r for r in reversed(records) if isinstance(r, Finish)), None)
    results = {r.id: r.status for r in records if isinstance(r, ToolResult)}
    for unreported in () if finish is None else finish.unreported_calls:
        results.setdefault(unreported.id, unreported.status)
    replies = [r for r in records if isinstance(r, Reply)]
    failed = [r for r in records if isinstance(r, RequestFailed)]
    attempts = [a for r in replies for a in r.attempt_records]
    attempts += [a for r in failed for a in r.attempt_records]
    usage = None if finish is None else finish.usage
    return {
        "started_at": header.started_at,
        "outcome": None if finish is None else (finish.outcome or None),
        "stop_reason": None if finish is None else _stop(finish),
        "turns": max((r.turn for r in records), default=0) if finish is None else finish.turns,
        "calls": _counts(results.values()),
        "approvals": _counts(
            r.verdict for r in records if isinstance(r, Approval) and r.verdict is not None
        ),
        "approved_mutating_calls": [
            {"call_id": r.id, "tool": r.name, "server": calls.servers.get(r.name)}
            for r in records
            if isinstance(r, ToolCall) and calls.approved_mutation(r.id)
        ],
        "tokens": None
        if usage is None or _unreported(usage)
        else {
            "prompt": usage.prompt_tokens,
            "completion": usage.completion_tokens,
            "total": usage.total_tokens,
        },
        "wall_time_s": (records[-1].t if records else 0.0) if finish is None else finish.latency_s,
        "attempts": sum(r.attempts for r in replies) + sum(len(r.attempt_records) for r in failed),
        "retries": sum(a.delay_s is not None for a in attempts),
    }


def _listed(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {_short(k, 64)}" for k, n in counts.items()) or "none"


def _glance(facts: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The summary as (label, value) rows, the same for the text and the page."""
    tokens = facts["tokens"]
    return [
        ("outcome", facts["outcome"] or "unknown (no finish record)"),
        ("stop reason", facts["stop_reason"] or "-"),
        ("turns", str(facts["turns"])),
        ("calls", _listed(facts["calls"])),
        ("approvals", _listed(facts["approvals"])),
        (
            "approved mutating calls",
            ", ".join(
                f"{c['tool']} (id {c['call_id']}"
                + ("" if c["server"] is None else f", server {c['server']}")
                + ")"
                for c in facts["approved_mutating_calls"]
            )
            or "none",
        ),
        (
            "tokens",
            "not reported"
            if tokens is None
            else f"{tokens['prompt']} prompt, {tokens['completion']} completion, "
            f"{tokens['total']} total",
        ),
        ("wall time", _ms(facts["wall_time_s"])),
        ("attempts", f"{facts['attempts']} ({facts['retries']} retries)"),
    ]


def _started(started_at: str | None) -> str:
    """The session's wall-clock start as the header shows it (UTC), or why it is missing."""
    if started_at is None:
        return "not recorded (an older transcript)"
    shown = _short(started_at, 64)
    return f"{shown.replace('T', ' ').removesuffix('Z')} UTC" if shown.endswith("Z") else shown


def _heading(header: Session) -> list[str]:
    tools = ", ".join(_short(t.name, 64) for t in header.tools or ()) or "-"
    lines = [
        (
            f"session {_short(header.session_id or '?', 64)} "
            f"(generation {header.generation}), library {_short(header.library or '?', 64)}"
        ),
        f"started: {_started(header.started_at)}",
        f"endpoint: {_short(header.endpoint or '-')}",
        f"tools: {tools}",
    ]
    if header.goal:
        lines.append(f"goal: {_short(header.goal)}")
    return lines


def _note_texts(transcript: Transcript, records: Sequence[Event]) -> list[str]:
    """What ``load`` noted (a transcript built in code: its missing finish)."""
    notes = list(transcript.notes)
    if not any(isinstance(r, Finish) for r in records) and NO_FINISH_NOTE not in notes:
        notes.append(NO_FINISH_NOTE)
    return [_short(note) for note in notes]


@dataclass(frozen=True, slots=True)
class _Parsed:
    header: Session
    records: tuple[Event, ...]
    notes: list[str]
    facts: dict[str, Any]
    entries: list[_Entry]


def _parsed(source: Transcript | str | Path | Iterable[str]) -> _Parsed:
    """The transcript's records, checked (``load`` checks a file; this checks one built in
    code), its notes, summary and timeline."""
    transcript = source if isinstance(source, Transcript) else load(source)
    header, records = parse_all(transcript.header, transcript.records)
    calls = _Calls.of(header, records)
    facts = _summary(header, records, calls)
    entries = [_entry(r, facts["attempts"], calls) for r in records]
    return _Parsed(header, records, _note_texts(transcript, records), facts, entries)


def report(source: Transcript | str | Path | Iterable[str]) -> list[str]:
    """The session's summary and timeline as text lines (terminal-safe)."""
    parsed = _parsed(source)
    rows = dict(_glance(parsed.facts))
    lines = [
        *_heading(parsed.header),
        *(f"note: {note}" for note in parsed.notes),
        f"outcome: {rows.pop('outcome')}"
        + ("" if rows["stop reason"] == "-" else f" ({rows['stop reason']})"),
    ]
    rows.pop("stop reason")
    lines.append("; ".join(f"{label}: {value}" for label, value in rows.items()))
    lines.append("")
    for entry in parsed.entries:
        label = f"turn {entry.turn}" if entry.turn else ""
        indent = "  " if entry.kind in ("tool_call", "tool_result") else ""
        lines.append(f"{entry.t:>8.3f} s  {label:<8} {indent}{entry.text}")
    return [display_safe(line) for line in lines]


def report_data(source: Transcript | str | Path | Iterable[str]) -> dict[str, Any]:
    """The same facts as :func:`report`, as JSON-ready data: ``summary`` (start, outcome,
    stop reason, turns, calls and approvals by outcome, the approved mutating calls, tokens,
    wall time, attempts, retries), ``notes`` and the ``timeline``: each entry's time, turn,
    type and text, and its :data:`FIELDS` (call id, tool, server, effect, verdict, status,
    latency; None where they do not apply), every text escaped."""
    parsed = _parsed(source)
    return {
        "summary": _safe(parsed.facts),
        "notes": parsed.notes,
        "timeline": [
            {
                "t": e.t,
                "turn": e.turn,
                "type": e.kind,
                **{name: _safe(e.fields.get(name)) for name in FIELDS},
                "text": display_safe(e.text),
            }
            for e in parsed.entries
        ],
    }


def _safe(value: Any) -> Any:
    """``value`` with every string in it passed through the escaping rule."""
    if isinstance(value, str):
        return display_safe(value)
    if isinstance(value, dict):
        return {display_safe(str(k)): _safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_safe(v) for v in value]
    return value


_STYLE: Final = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.3em; } table { border-collapse: collapse; width: 100%; }
table.timeline { table-layout: fixed; } col.t { width: 7em; } col.turn { width: 4em; }
col.kind { width: 8em; } table.glance { width: auto; margin-bottom: 1.5em; }
td, th { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left;
         vertical-align: top; overflow-wrap: anywhere; } th { background: #f4f4f4; }
td.t { white-space: nowrap; font-variant-numeric: tabular-nums; color: #666; }
td.tool { padding-left: 2em; } tr.finish td { font-weight: bold; }
tr.reply td { background: #fafcff; } details pre { white-space: pre-wrap; }
.completed { color: #1a6b2f; font-weight: bold; }
.failed, .rejected { color: #a40000; } .denied { color: #9a5b00; }
.cancelled { color: #5b3a8c; } .ambiguous { color: #fff; background: #a40000; }
tr.approved td { background: #fff3cd; font-weight: bold; }
tr.approved td.what { border-left: 4px solid #b36b00; }
"""


def _row_class(entry: _Entry) -> str:
    """A timeline row's classes: its record type (a schema tag) and its tone, each only
    from a closed set, so nothing read from the file reaches an attribute."""
    kind = entry.kind if entry.kind in _KINDS else "other"
    return f"{kind} {entry.tone}" if entry.tone in _ROW_CLASSES else kind


def report_html(source: Transcript | str | Path | Iterable[str]) -> str:
    """The session's summary and timeline as one self-contained HTML page (inline style,
    no script); long texts are folded in ``<details>``, whole."""
    parsed = _parsed(source)

    def esc(text: str) -> str:
        return html.escape(display_safe(text))

    heading = _heading(parsed.header)
    glance = []
    for label, value in _glance(parsed.facts):
        tone = _tone(parsed.facts["outcome"] or "") if label == "outcome" else ""
        cell = f'<td class="{tone}">' if tone else "<td>"
        glance.append(f"<tr><th>{esc(label)}</th>{cell}{esc(value)}</td></tr>")
    rows = []
    for entry in parsed.entries:
        classes = "what tool" if entry.kind in ("tool_call", "tool_result") else "what"
        folded = "".join(
            f"<details><summary>whole {esc(label)}</summary><pre>{esc(text)}</pre></details>"
            for label, text in entry.folds
        )
        rows.append(
            f'<tr class="{_row_class(entry)}"><td class="t">{entry.t:.3f} s</td>'
            f"<td>{entry.turn or ''}</td><td>{esc(entry.kind)}</td>"
            f'<td class="{classes}">{esc(entry.text)}{folded}</td></tr>'
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
            '<table class="glance">',
            *glance,
            "</table>",
            *(f"<p>{esc(line)}</p>" for line in heading[1:]),
            *(f'<p class="note">note: {esc(note)}</p>' for note in parsed.notes),
            (
                '<table class="timeline"><colgroup><col class="t"><col class="turn">'
                '<col class="kind"><col></colgroup>'
                "<thead><tr><th>time</th><th>turn</th><th>event</th><th>what</th></tr>"
                "</thead><tbody>"
            ),
            *rows,
            "</tbody></table></body></html>",
            "",
        ]
    )
