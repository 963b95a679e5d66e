"""Readable timelines of a recorded session: plain text, and one self-contained HTML file.

Both are built from a :class:`~metacrate_grid_agent.transcript.Transcript` alone: turns,
requests with their latency, attempts, retries and tokens, each call with its status and
latency, compaction, and where the session ended and why. Every line of the text form, and
every text of the HTML form, passes the library's one escaping rule (:mod:`._display`):
controls, format characters (bidi, zero-width), separators and other invisible characters
are shown as visible escapes, in the page as on the terminal, so nothing from a transcript
can act on a terminal or reorder text. The page is then HTML-escaped, carries its style
inline, loads nothing and runs no script (its Content-Security-Policy forbids both). Public
through :mod:`metacrate_grid_agent.transcript`.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from metacrate_grid_agent._display import display_safe

__all__ = ["report", "report_html"]

#: Longest text (reply, argument, observation, summary) shown in one timeline entry.
MAX_SHOWN_CHARS: Final = 300


def _short(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    text = " ".join(str(value).split())
    return display_safe(text if len(text) <= limit else text[: limit - 1] + "…")


def _ms(seconds: object) -> str:
    return f"{round(float(seconds) * 1000)} ms" if isinstance(seconds, int | float) else "-"


def _tokens(usage: object) -> str:
    if not isinstance(usage, Mapping):
        return "tokens not reported"
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
    return "tokens " + "/".join("?" if n is None else str(n) for n in parts)


def _retries(record: Mapping[str, Any]) -> list[str]:
    shown = []
    for attempt in record.get("attempt_records") or ():
        if attempt.get("outcome") == "ok":
            continue
        status = attempt.get("status")
        what = f"attempt {attempt.get('attempt')} failed: {attempt.get('error_kind')}"
        if status is not None:
            what += f" (HTTP {status})"
        if attempt.get("delay_s") is not None:
            what += (
                f", retried after {float(attempt['delay_s']):.2f} s ({attempt.get('delay_source')})"
            )
        shown.append(_short(what))
    return shown


def _entries(transcript: Transcript) -> list[tuple[str, str, str, str]]:
    """(time, turn, kind, text) for every record, in order."""
    rows = []
    for record in transcript.records:
        kind = str(record.get("type"))
        when = f"{float(record.get('t', 0.0)):.3f} s"
        turn = str(record.get("turn", ""))
        if kind == "request":
            text = f"request {_short(record.get('request_id'))}"
        elif kind == "reply":
            calls = record.get("tool_calls") or []
            what = f"{len(calls)} tool call(s)" if calls else "final text"
            text = (
                f"reply: {what}, {_ms(record.get('latency_s'))}, "
                f"{record.get('attempts')} attempt(s), {_tokens(record.get('usage'))}, "
                f"finish {_short(record.get('finish_reason'))}"
            )
            for retry in _retries(record):
                text += f"; {retry}"
            if record.get("text"):
                text += f"; text: {_short(record['text'])}"
        elif kind == "tool_call":
            text = (
                f"-> {_short(record.get('name'), 64)} {_short(record.get('arguments'))} "
                f"({record.get('effect')}, id {_short(record.get('id'), 64)})"
            )
        elif kind == "tool_result":
            text = (
                f"<- {_short(record.get('name'), 64)} {record.get('status')} "
                f"{_ms(record.get('latency_s'))}: {_short(record.get('observation'))}"
            )
        elif kind == "compaction":
            text = "history compacted to fit its bounds"
        elif kind == "finish":
            text = _ending(record)
        else:
            text = _short({k: v for k, v in record.items() if k not in ("type", "seq", "t")})
        rows.append((when, turn, kind, text))
    return rows


def _ending(record: Mapping[str, Any]) -> str:
    text = f"session ended: {record.get('outcome')}"
    for name in ("bound", "cancel_reason", "finish_reason"):
        if record.get(name):
            text += f" ({name.replace('_', ' ')}: {_short(record[name], 64)})"
    error = record.get("error")
    if isinstance(error, Mapping):
        text += f"; error {error.get('kind')}: {_short(error.get('message'))}"
    text += (
        f"; {record.get('turns')} turn(s), {record.get('calls')} call(s), "
        f"{record.get('attempts')} attempt(s), {_tokens(record.get('usage'))}, "
        f"{_ms(record.get('latency_s'))}"
    )
    if record.get("final_text"):
        text += f"; summary: {_short(record['final_text'])}"
    if record.get("records_dropped"):
        text += f"; {record['records_dropped']} record(s) dropped at the transcript's bound"
    return text


def _heading(transcript: Transcript) -> list[str]:
    header = transcript.header
    tools = ", ".join(_short(t.get("name"), 64) for t in header.get("tools") or ()) or "-"
    lines = [
        (
            f"session {_short(header.get('session_id', '?'), 64)} "
            f"(generation {header.get('generation', '?')}), library {header.get('library', '?')}"
        ),
        f"endpoint: {_short(header.get('endpoint') or '-')}",
        f"tools: {tools}",
    ]
    if header.get("goal"):
        lines.append(f"goal: {_short(header['goal'])}")
    if transcript.finish is None:
        lines.append("the transcript has no finish record: the session did not end in it")
    return lines


def _as_transcript(source: Transcript | str | Path | Iterable[str]) -> Transcript:
    return source if isinstance(source, Transcript) else load(source)


def report(source: Transcript | str | Path | Iterable[str]) -> list[str]:
    """The session's timeline as text lines (terminal-safe)."""
    transcript = _as_transcript(source)
    lines = [*_heading(transcript), ""]
    for when, turn, kind, text in _entries(transcript):
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
    transcript = _as_transcript(source)

    def esc(text: str) -> str:
        return html.escape(display_safe(text))

    heading = _heading(transcript)
    rows = []
    for when, turn, kind, text in _entries(transcript):
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


# Last: `transcript` re-exports this module at its end, so whichever of the two loads first,
# the other finds every name it needs (names used above only inside functions).
from metacrate_grid_agent.transcript import Transcript, load  # noqa: E402
