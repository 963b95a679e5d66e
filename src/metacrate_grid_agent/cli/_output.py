"""What the ``grid-agent`` command prints: redaction, the console, and every report format.

Everything the CLI writes (reports, JSON, progress, log records, transcript lines) passes
through a :class:`Redactor` first. The library never puts the key in a message; the CLI does
not rely on that and scrubs every registered secret again (defence in depth).

Nothing reaches the terminal unescaped: the :class:`Console` (and the log formatter) passes
every line it writes through :func:`printable`, the library's one escaping rule, keeping
only the line breaks between the lines it is given, so no field from a model, an endpoint, a
transcript or a file can move the cursor, start a terminal sequence, forge a line, or
reorder or hide text. The report builders escape each field where they build it too, so a
multi-line text becomes several lines on purpose (indented under its label), never by
accident. JSON output is ASCII-only, so it is safe as it is.

Only the public API of the package is used, like any other application.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final, NoReturn

from metacrate_grid_agent import (
    CallRecord,
    Completion,
    GridAgentError,
    LoopEvent,
    LoopResult,
    Secret,
    Usage,
)
from metacrate_grid_agent.cli._sandbox import SandboxWorld
from metacrate_grid_agent.config import REDACTED, Setting
from metacrate_grid_agent.errors import HTTPStatusError
from metacrate_grid_agent.safety import SecretRedactor, display_safe

__all__ = [
    "REDACTED",
    "Console",
    "ProbeSummary",
    "Redactor",
    "SessionStats",
    "bounded",
    "error_json",
    "mcp_server_lines",
    "printable",
    "probe_json",
    "probe_report",
    "progress_lines",
    "result_json",
    "result_report",
    "run_report",
    "safe_line",
    "server_lines",
    "setting_lines",
    "text_lines",
    "toml_value",
    "world_json",
]

#: Secrets shorter than this are not scrubbed: replacing one or two characters everywhere
#: would garble every line (and such a "key" protects nothing).
MIN_SECRET_CHARS: Final = 4
#: Longest error message printed (probe JSON promises at most this).
MAX_MESSAGE_CHARS: Final = 500
#: Longest tool-call arguments shown in progress lines.
MAX_ARGUMENT_CHARS: Final = 200
#: Longest observation shown in progress lines and the calls table.
MAX_OBSERVATION_CHARS: Final = 240
#: Longest text shown in the probe's human report and the run summary.
MAX_TEXT_CHARS: Final = 4000
#: Longest tool name shown.
MAX_NAME_CHARS: Final = 64
#: Longest call id or request id shown in a line.
MAX_ID_CHARS: Final = 80
#: Indent of a traceback's lines (in a log record or a crash report): none of them can pass
#: for a line of its own.
DETAIL_INDENT: Final = "  "


# --- redaction and terminal safety ------------------------------------------------------------


class Redactor:
    """Scrubs every registered secret, in every form an echo of it takes, from text and data.

    Each secret is held by a :class:`~metacrate_grid_agent.safety.SecretRedactor`, the
    library's own rule: the key, any slice of it of 12 characters or more, in escaped,
    percent-encoded, HTML and blank-split forms. A beginning of a secret that an earlier bound
    cut (then "…" or the end of the text) is replaced too.
    """

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: list[SecretRedactor] = []

    def __repr__(self) -> str:
        return f"Redactor({len(self._keys)} secrets)"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Redactor holds credentials; it cannot be pickled")

    def add(self, secret: str | None) -> None:
        """Register a secret to scrub (ignored when empty or too short to be one)."""
        if not secret or len(secret) < MIN_SECRET_CHARS:
            return
        self._keys.append(SecretRedactor(secret))

    def hide(self, secrets: Iterable[str | Secret | None]) -> None:
        """Register each secret of ``secrets`` once (a :class:`Secret` revealed here only)."""
        revealed = (s.reveal() if isinstance(s, Secret) else s for s in secrets)
        for secret in dict.fromkeys(revealed):
            self.add(secret)

    def scrub(self, text: str) -> str:
        """``text`` with every secret replaced by :data:`REDACTED`."""
        for key in self._keys:
            text = key.redact(text)
        return text

    def scrub_data(self, data: Any) -> Any:
        """A copy of JSON-like ``data`` with every string (keys included) scrubbed."""
        if isinstance(data, str):
            return self.scrub(data)
        if isinstance(data, dict):
            return {self.scrub_data(k): self.scrub_data(v) for k, v in data.items()}
        if isinstance(data, list | tuple):
            return [self.scrub_data(v) for v in data]
        return data


#: ``text`` with every character that could act on a terminal, or reorder or hide text,
#: shown as a visible escape (tab and line breaks included): the library's one rule.
printable: Final = display_safe


def safe_line(scrub: Callable[[str], str], line: str) -> str:
    """One line as the command writes it: scrubbed, escaped, and scrubbed again when escaping
    changed it (a key holding a literal ``\\x1b`` would be spelled out by escaping an ESC)."""
    scrubbed = scrub(line)
    shown = printable(scrubbed)
    return shown if shown == scrubbed else scrub(shown)


def text_lines(label: str, text: str, limit: int) -> list[str]:
    """A multi-line text under its label: the first line after ``label``, each further line
    indented to it; each line escaped, the whole bounded to ``limit`` characters. A line
    break is LF or CR LF; any other control (a lone CR included) is shown escaped."""
    cut = bounded(text, limit).replace("\r\n", "\n")
    first, *rest = [printable(line) for line in cut.split("\n")]
    indent = " " * len(label)
    return [label + first, *(indent + line for line in rest)]


def bounded(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in "…" when cut."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def bounded_tail(text: str, limit: int) -> str:
    """``text`` cut to its last ``limit`` characters, starting with "…" when cut (a request
    id differs from the turn before only at its end)."""
    return text if len(text) <= limit else "…" + text[len(text) - max(0, limit - 1) :]


def _one_line(text: str, limit: int) -> str:
    return bounded(printable(" ".join(text.split())), limit)


class Console:
    """stdout and stderr, each line scrubbed and escaped; JSON goes out as one ASCII line.

    Each line given is written as exactly one line: whatever it holds (a line break, a
    carriage return, an escape sequence) is shown escaped.
    """

    def __init__(
        self, redactor: Redactor, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None
    ) -> None:
        self.redactor = redactor
        self._stdout = stdout
        self._stderr = stderr
        #: Called before every write (the heartbeat clears its status line there).
        self.before_write: Callable[[], None] | None = None

    def out(self, *lines: str) -> None:
        """Write lines to stdout."""
        self._write(self._stdout or sys.stdout, lines)

    def err(self, *lines: str) -> None:
        """Write lines to stderr."""
        self._write(self._stderr or sys.stderr, lines)

    def json(self, data: Any) -> None:
        """Write ``data`` to stdout as exactly one JSON line."""
        self.out(json.dumps(self.redactor.scrub_data(data), ensure_ascii=True))

    def _write(self, stream: IO[str], lines: Iterable[str]) -> None:
        if self.before_write is not None:
            self.before_write()
        text = "".join(safe_line(self.redactor.scrub, line) + "\n" for line in lines)
        stream.write(text)
        stream.flush()


class RedactingFormatter(logging.Formatter):
    """A log formatter whose every record is scrubbed and made terminal-safe.

    The record's line (time, level, logger, message) is one escaped line, whatever the
    message holds; a traceback or stack follows with each of its lines escaped and indented
    by :data:`DETAIL_INDENT`, so no exception message can forge a line of its own.
    """

    def __init__(self, redactor: Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        """The record's escaped line, then its escaped, indented traceback lines."""
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        lines = [safe_line(self._redactor.scrub, self.formatMessage(record))]
        details = []
        if record.exc_info:
            details.append(self.formatException(record.exc_info))
        elif record.exc_text:
            details.append(record.exc_text)
        if record.stack_info:
            details.append(self.formatStack(record.stack_info))
        for detail in details:  # scrubbed whole first: a key split across lines is found
            lines += [
                DETAIL_INDENT + safe_line(self._redactor.scrub, line)
                for line in self._redactor.scrub(detail).split("\n")
            ]
        return "\n".join(lines)


# --- errors -----------------------------------------------------------------------------------


def _ms(seconds: float) -> int:
    return round(seconds * 1000.0)


def _status_of(error: GridAgentError) -> int | None:
    return error.status if isinstance(error, HTTPStatusError) else None


#: What the library appends to a retryable status error's message when it is raised.
_RETRYABLE_SUFFIX: Final = " (retryable)"


def final_message(error: GridAgentError) -> str:
    """The message of an error the command reports: every retry is spent by then, so a
    "(retryable)" note would mislead and is dropped."""
    return error.message.removesuffix(_RETRYABLE_SUFFIX)


def error_json(
    kind: str,
    message: str,
    *,
    retryable: bool = False,
    status: int | None = None,
    attempts: int = 0,
    latency_ms: int = 0,
    request_id: str | None = None,
    error_type: str | None = None,
    error_code: str | None = None,
) -> dict[str, Any]:
    """The probe's failure object (also used for configuration and usage errors).

    ``error_type`` and ``error_code`` are the ``type`` and ``code`` of the endpoint's JSON
    error body, when it had them.
    """
    return {
        "outcome": "error",
        "kind": kind,
        "retryable": retryable,
        "status": status,
        "error_type": error_type,
        "error_code": error_code,
        "attempts": attempts,
        "latency_ms": latency_ms,
        "request_id": request_id,
        "message": bounded(message, MAX_MESSAGE_CHARS),
    }


# --- probe ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeSummary:
    """What one probe did and got back."""

    endpoint: str
    asked_tools: bool
    sent_image: bool
    request_id: str
    completion: Completion | None = None
    error: GridAgentError | None = None


def _usage_json(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


#: Statuses that say nothing about the request's content (auth, route, rate, overload):
#: an image sent with such a request is not known to be refused.
_NOT_ABOUT_CONTENT: Final = frozenset({401, 402, 403, 404, 405, 407, 408, 429, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class Support:
    """What one probe showed about a capability: a short token and its explanation."""

    token: str  # yes, not_shown, not_asked, accepted, refused, unknown
    text: str


def probe_supports(summary: ProbeSummary) -> dict[str, Support]:
    """What the reply showed about text, tool calls and images, worded with care.

    One reply without a tool call does not prove tools unsupported ("not shown"), and a
    request with an image refused by the server says so with the status it answered.
    """
    error, completion = summary.error, summary.completion
    if error is not None or completion is None:
        unknown = Support("unknown", "unknown (the request failed)")
        images = Support("not_asked", "not asked") if not summary.sent_image else unknown
        status = _status_of(error) if error is not None else None
        if (
            summary.sent_image
            and error is not None
            and status is not None
            and status >= 400
            and status not in _NOT_ABOUT_CONTENT
        ):
            detail = _one_line(final_message(error), 160)
            images = Support("refused", f"refused (HTTP {status}: {detail})")
        tools = unknown if summary.asked_tools else Support("not_asked", "not asked")
        return {"text": unknown, "tool_calls": tools, "images": images}
    text = (
        Support("yes", "yes")
        if completion.text
        else Support("not_shown", "not shown (no text in this reply)")
    )
    if not summary.asked_tools:
        tools = Support("not_asked", "not asked")
    elif completion.tool_calls:
        tools = Support("yes", "yes")
    else:
        tools = Support(
            "not_shown",
            "not shown (tools were offered and this reply called none; one reply does not "
            "prove they are unsupported)",
        )
    images = (
        Support("accepted", "accepted") if summary.sent_image else Support("not_asked", "not asked")
    )
    return {"text": text, "tool_calls": tools, "images": images}


def probe_json(summary: ProbeSummary) -> dict[str, Any]:
    """The probe's one JSON object (success or failure), with what it showed is supported."""
    error, completion = summary.error, summary.completion
    supports = {name: found.token for name, found in probe_supports(summary).items()}
    if error is not None or completion is None:
        assert error is not None  # noqa: S101 - a summary has a completion or an error
        http = error if isinstance(error, HTTPStatusError) else None
        return {
            **error_json(
                error.kind,
                final_message(error),
                retryable=error.retryable,
                status=_status_of(error),
                attempts=error.attempts,
                latency_ms=_ms(error.elapsed_s),
                request_id=error.request_id or summary.request_id,
                error_type=None if http is None else http.error_type,
                error_code=None if http is None else http.error_code,
            ),
            "supports": supports,
        }
    return {
        "outcome": "ok",
        "text": completion.text,
        "tool_calls": [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in completion.tool_calls
        ],
        "finish_reason": completion.finish_reason,
        "usage": _usage_json(completion.usage),
        "attempts": completion.attempts,
        "latency_ms": _ms(completion.latency_s),
        "request_id": completion.request_id,
        "supports": supports,
    }


def _usage_text(usage: Usage | None) -> str:
    if usage is None:
        return "not reported"
    return (
        f"prompt {usage.prompt_tokens}, completion {usage.completion_tokens}, "
        f"total {usage.total_tokens}"
    )


def probe_report(summary: ProbeSummary) -> list[str]:
    """The probe's human-readable report."""
    error, completion = summary.error, summary.completion
    lines = [f"grid-agent probe: {printable(summary.endpoint)}"]
    if error is not None or completion is None:
        assert error is not None  # noqa: S101 - a summary has a completion or an error
        status = _status_of(error)
        detail = [error.kind]
        if status is not None:
            detail.append(f"HTTP {status}")
        detail.append("retries spent" if error.retryable else "not retryable")
        if isinstance(error, HTTPStatusError):  # what the body said, and only that
            detail += [
                f"{name} {_one_line(value, 60)}"
                for name, value in (("type", error.error_type), ("code", error.error_code))
                if value
            ]
        lines += [
            f"status:      error ({', '.join(detail)})",
            f"message:     {_one_line(final_message(error), MAX_MESSAGE_CHARS)}",
            f"request id:  {_one_line(error.request_id or summary.request_id, MAX_ID_CHARS)}",
            f"latency:     {_ms(error.elapsed_s)} ms",
            f"attempts:    {error.attempts}",
        ]
        return lines + _support_lines(summary)
    lines += [
        "status:      ok",
        f"request id:  {_one_line(completion.request_id, MAX_ID_CHARS)}",
        f"latency:     {_ms(completion.latency_s)} ms",
        f"attempts:    {completion.attempts}",
        f"usage:       {_usage_text(completion.usage)}",
        f"finish:      {printable(completion.finish_reason or 'not reported')}",
    ]
    if completion.text is None:
        lines.append("text:        (none)")
    else:
        lines += text_lines("text:        ", completion.text, MAX_TEXT_CHARS)
    if not completion.tool_calls:
        lines.append("tool calls:  (none)")
    for call in completion.tool_calls:
        lines.append(
            f"tool call:   {_one_line(call.name, MAX_NAME_CHARS)} "
            f"{_one_line(call.arguments, MAX_ARGUMENT_CHARS)} "
            f"(id {_one_line(call.id, MAX_ID_CHARS)})"
        )
    return lines + _support_lines(summary)


def _support_lines(summary: ProbeSummary) -> list[str]:
    found = probe_supports(summary)
    return [
        "supports:",
        f"  text:        {found['text'].text}",
        f"  tool calls:  {found['tool_calls'].text}",
        f"  images:      {found['images'].text}",
    ]


# --- run: progress and statistics ------------------------------------------------------------


@dataclass(slots=True)
class TurnStats:
    """One model request of a session, as seen through the events."""

    turn: int
    request_id: str
    calls: int = 0
    usage: Usage | None = None
    latency_s: float | None = None
    attempts: int | None = None


@dataclass(slots=True)
class SessionStats:
    """Per-turn figures gathered from the session's events, for the final table."""

    turns: list[TurnStats] = field(default_factory=list)

    def observe(self, event: LoopEvent) -> None:
        """Take in one event."""
        if event.kind == "request" and event.request_id is not None:
            self.turns.append(TurnStats(event.turn, event.request_id))
        elif event.kind == "reply" and event.completion is not None and self.turns:
            row = self.turns[-1]
            row.usage = event.completion.usage
            row.latency_s = event.completion.latency_s
            row.attempts = event.completion.attempts
        elif event.kind == "tool_result" and self.turns:
            self.turns[-1].calls += 1


def _call_line(turn: int, record: CallRecord) -> str:
    status = record.status.upper() if record.status == "rejected" else record.status
    return (
        f"[turn {turn}]   <- {_one_line(record.name, MAX_NAME_CHARS)} {status}: "
        f"{_one_line(record.observation, MAX_OBSERVATION_CHARS)}"
    )


def progress_lines(event: LoopEvent) -> list[str]:
    """Progress lines (for stderr) describing one event."""
    turn = event.turn
    if event.kind == "request":
        return [f"[turn {turn}] request {_one_line(str(event.request_id), MAX_ID_CHARS)}"]
    if event.kind == "reply" and event.completion is not None:
        completion = event.completion
        lines = []
        for record in completion.attempt_records:
            if record.outcome != "ok":
                status = f" (HTTP {record.status})" if record.status is not None else ""
                wait = (
                    f", retried after {record.delay_s:.2f} s" if record.delay_s is not None else ""
                )
                lines.append(
                    f"[turn {turn}]   attempt {record.attempt} failed: "
                    f"{printable(str(record.error_kind))}"
                    f"{status}{wait}"
                )
        what = (
            f"{len(completion.tool_calls)} tool call(s)" if completion.tool_calls else "final text"
        )
        lines.append(
            f"[turn {turn}] reply {_one_line(completion.request_id, MAX_ID_CHARS)}: {what}, "
            f"{_ms(completion.latency_s)} ms, {completion.attempts} attempt(s), "
            f"usage {_usage_text(completion.usage)}"
        )
        return lines
    if event.kind == "tool_call" and event.call is not None:
        call = event.call
        arguments = json.dumps(dict(call.arguments), ensure_ascii=False, sort_keys=True)
        name = _one_line(call.name, MAX_NAME_CHARS)
        shown = _one_line(arguments, MAX_ARGUMENT_CHARS)
        call_id = _one_line(call.id, MAX_ID_CHARS)
        return [f"[turn {turn}]   -> {name} {shown} ({call.effect.value}, id {call_id})"]
    if event.kind == "tool_result" and event.record is not None:
        return [_call_line(turn, event.record)]
    if event.kind == "compaction":
        return [f"[turn {turn}] history compacted to fit its bounds"]
    if event.kind == "finish" and event.result is not None:
        result = event.result
        lines = []
        if result.error is not None:
            lines.append(
                f"[turn {turn}] request failed after {result.error.attempts} attempt(s): "
                f"{printable(result.error.kind)}: "
                f"{_one_line(final_message(result.error), MAX_MESSAGE_CHARS)}"
            )
        lines.append(f"[turn {turn}] session finished: {result.outcome.value}")
        return lines
    return []


def _call_json(record: CallRecord) -> dict[str, Any]:
    return {
        "turn": record.turn,
        "id": record.call_id,
        "name": record.name,
        "status": record.status,
        "arguments": record.arguments,
        "reissued_from": record.reissued_from,
        "observation": record.observation,
    }


def result_json(result: LoopResult, **extra: Any) -> dict[str, Any]:
    """The session result as plain JSON data; ``extra`` members come first."""
    error = result.error
    usage = result.usage
    return {
        **extra,
        "outcome": result.outcome.value,
        "bound": result.bound,
        "cancel_reason": result.cancel_reason,
        "finish_reason": result.finish_reason,
        "final_text": result.final_text,
        "turns": result.turns,
        "calls": [_call_json(record) for record in result.calls],
        "usage": usage.as_dict(),
        "attempts": result.attempts,
        "latency_ms": _ms(result.latency_s),
        "compactions": result.compactions,
        "ambiguous_call": None if result.ambiguous_call is None else result.ambiguous_call.call_id,
        "error": None
        if error is None
        else {"kind": error.kind, "message": bounded(final_message(error), MAX_MESSAGE_CHARS)},
        "session_id": result.session_id,
        "generation": result.generation,
    }


def _tokens(usage: Usage | None) -> str:
    if usage is None:
        return "-"
    return "/".join("?" if n is None else str(n) for n in (
        usage.prompt_tokens, usage.completion_tokens, usage.total_tokens))  # fmt: skip


def result_report(result: LoopResult, stats: SessionStats) -> list[str]:
    """The human-readable end of a session: outcome, summary, turns table, calls."""
    lines = [f"outcome:   {result.outcome.value}"]
    if result.bound is not None:
        lines.append(f"bound:     {printable(result.bound)}")
    if result.cancel_reason is not None:
        lines.append(f"cancelled: {_one_line(result.cancel_reason, MAX_MESSAGE_CHARS)}")
    if result.error is not None:
        lines.append(
            f"error:     {printable(result.error.kind)}: "
            f"{_one_line(final_message(result.error), MAX_MESSAGE_CHARS)}"
        )
    if result.final_text is not None:
        lines += text_lines("summary:   ", result.final_text, MAX_TEXT_CHARS)
    header = (
        f"{'turn':>5}  {'request':<24} {'calls':>5}  {'tokens p/c/t':<16} "
        f"{'latency':>9}  {'attempts':>8}"
    )
    lines += ["", header]
    for row in stats.turns:
        latency = "-" if row.latency_s is None else f"{_ms(row.latency_s)} ms"
        attempts = "-" if row.attempts is None else str(row.attempts)
        lines.append(
            f"{row.turn:>5}  {bounded_tail(printable(row.request_id), 24):<24} {row.calls:>5}  "
            f"{_tokens(row.usage):<16} {latency:>9}  {attempts:>8}"
        )
    usage = result.usage
    totals = f"{usage.prompt_tokens}/{usage.completion_tokens}/{usage.total_tokens}"
    # The column's own sum (as shown, row by row): the session's wall time, which also
    # holds the tool calls and the approvals, has a line of its own.
    column = sum(_ms(row.latency_s) for row in stats.turns if row.latency_s is not None)
    lines.append(
        f"{'total':>5}  {f'{result.turns} turn(s)':<24} {len(result.calls):>5}  {totals:<16} "
        f"{f'{column} ms':>9}  {result.attempts:>8}"
    )
    lines.append(f"wall time: {_ms(result.latency_s)} ms (the whole session)")
    if result.calls:
        lines += ["", "calls:"]
        for record in result.calls:
            lines.append(
                f"  turn {record.turn}  {_one_line(record.name, MAX_NAME_CHARS):<12} "
                f"{record.status:<9} {_one_line(record.observation, MAX_OBSERVATION_CHARS)}"
            )
    return lines


def server_lines(calls: dict[str, dict[str, int]]) -> list[str]:
    """The calls of a session by MCP server, each server's tools with their counts."""
    lines = ["calls by MCP server:"]
    for server, tools in calls.items():
        total = sum(tools.values())
        each = ", ".join(f"{_one_line(name, MAX_NAME_CHARS)} {n}" for name, n in tools.items())
        lines.append(f"  {printable(server)}: {total} call(s)" + (f" ({each})" if each else ""))
    return lines


def world_json(world: SandboxWorld) -> dict[str, Any]:
    """The sandbox's final state: the avatar's cell, its inventory, the chat log."""
    return {
        "position": [world.x, world.y],
        "inventory": list(world.inventory),
        "chat": [{"speaker": line.speaker, "text": line.text} for line in world.chat],
    }


def run_report(
    result: LoopResult,
    stats: SessionStats,
    world: SandboxWorld,
    *,
    scripted: bool,
    script: str = "built-in demo script",
) -> list[str]:
    """The end of ``run``/``demo`` on stdout: model, result report, the sandbox's state."""
    lines = []
    if scripted:
        lines.append(f"model:     scripted ({printable(script)}, not a real language model)")
    lines += result_report(result, stats)
    chat = "; ".join(f"{c.speaker}: {c.text}" for c in world.chat[-3:]) or "(silent)"
    lines += [
        "",
        f"sandbox:   Scout at ({world.x}, {world.y}); chat: {bounded(printable(chat), 300)}",
    ]
    return lines


# --- check-config -----------------------------------------------------------------------------


#: What applies when an optional setting is not set, for check-config's comment line.
UNSET_MEANS: Final = {"ca_bundle": "the system's CA certificates"}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


_BARE_KEY: Final = re.compile(r"\A[A-Za-z0-9_-]+\Z")


def toml_value(value: Any) -> str:
    """``value`` (a string, number, true/false, list or table) written as TOML."""
    if isinstance(value, dict):
        pairs = ", ".join(
            f"{k if _BARE_KEY.match(k) else json.dumps(k)} = {toml_value(v)}"
            for k, v in value.items()
        )
        return f"{{ {pairs} }}" if pairs else "{}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def mcp_server_lines(name: str, shown: dict[str, Any]) -> list[str]:
    """One ``[mcp.servers.NAME]`` table as check-config prints it (secrets already hidden)."""
    return [f"[mcp.servers.{name}]", *(f"{k} = {toml_value(v)}" for k, v in shown.items())]


def setting_lines(values: dict[str, Any], settings: Sequence[Setting]) -> list[str]:
    """``key = value`` lines, each numeric one noting its default and hard ceiling; an unset
    setting (None, which TOML cannot spell) is a comment saying what applies instead."""
    by_name = {s.name: s for s in settings}
    lines = []
    for key, value in values.items():
        if value is None:
            lines.append(f"# {key}: not set ({UNSET_MEANS.get(key, 'the default')})")
            continue
        note = ""
        setting = by_name.get(key)
        if setting is not None:
            default = (
                "default" if value == setting.default else f"default {_number(setting.default)}"
            )
            note = f"  # {default}; ceiling {_number(setting.ceiling)} {setting.unit}"
        lines.append(f"{key} = {json.dumps(value)}{note}")
    return lines
