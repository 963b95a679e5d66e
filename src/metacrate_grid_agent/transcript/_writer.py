"""Writing a session transcript: :class:`TranscriptWriter`, the ``on_event`` sink, and the
format's constants (schema name, version, bounds). Public through
:mod:`metacrate_grid_agent.transcript`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import msgspec

from metacrate_grid_agent import (
    LLMConfig,
    LoopEvent,
    LoopResult,
    Message,
    Secret,
    Tool,
    ToolLoopConfig,
    __version__,
)
from metacrate_grid_agent._core._redact import ContentGuard
from metacrate_grid_agent._core._retry import AttemptRecord
from metacrate_grid_agent.config import shown_url
from metacrate_grid_agent.errors import GridAgentError, HTTPStatusError

__all__ = [
    "CHAIN_START",
    "DEFAULT_MAX_FIELD_BYTES",
    "DEFAULT_MAX_RECORD_BYTES",
    "DEFAULT_MAX_TOTAL_BYTES",
    "MAX_ERROR_BYTES",
    "MAX_LIST_ITEMS",
    "MAX_RECORDS",
    "REPLY_SETTINGS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "TextStream",
    "TranscriptWriter",
    "line_hash",
]

logger = logging.getLogger("metacrate_grid_agent.transcript")

#: The ``schema`` member of every transcript's header.
SCHEMA: Final = "metacrate-grid-agent.transcript"
#: The ``v`` member of the header: raised on any change a reader must know about.
SCHEMA_VERSION: Final = 1
#: Default bound on one text field (a reply, an argument string, an observation).
DEFAULT_MAX_FIELD_BYTES: Final = 16 * 1024
#: Default bound on one record (one line).
DEFAULT_MAX_RECORD_BYTES: Final = 256 * 1024
#: Default bound on the whole transcript.
DEFAULT_MAX_TOTAL_BYTES: Final = 16 * 1024 * 1024
#: Most attempt records or tool calls kept in one record (the client's own caps are lower).
MAX_LIST_ITEMS: Final = 64
#: Longest error message kept.
MAX_ERROR_BYTES: Final = 1024
#: The client settings that decide how a reply is read, kept in the header for replay.
REPLY_SETTINGS: Final = (
    "mint_missing_call_ids", "max_prompt_bytes", "max_response_bytes", "max_text_bytes",
    "max_tool_calls", "max_argument_bytes", "max_id_length", "max_name_length",
)  # fmt: skip
#: Most records :func:`load` accepts.
MAX_RECORDS: Final = 100_000
#: The header's ``prev``: no line comes before it. Every later record's ``prev`` is the
#: SHA-256 (hex) of the previous line's bytes, so an edited, removed or inserted line
#: breaks the chain at the next record (no key: a whole file rewritten is not detected).
CHAIN_START: Final = "0" * 64


def line_hash(line: str) -> str:
    """The ``prev`` a record holds of ``line``, the line before it (no newline)."""
    return hashlib.sha256(line.encode("utf-8")).hexdigest()


def _usage(usage: Any) -> dict[str, int | None] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _seconds(value: float) -> float:
    return round(value, 6)


class TextStream(Protocol):
    """What a :class:`TranscriptWriter` writes to: any object with ``write(text)`` and
    ``flush()``, such as a file opened in text mode or an :class:`io.StringIO`."""

    def write(self, text: str, /) -> int:
        """Write ``text``; the number of characters written."""
        ...

    def flush(self) -> None:
        """Push what was written to its destination."""
        ...


def _utc(seconds: float) -> str:
    """A wall-clock time as ISO 8601 in UTC, to the millisecond (``...T12:00:00.000Z``)."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TranscriptWriter:
    """An event sink writing the session as JSON Lines to ``stream``; see the module doc.

    ``secret`` is the key to redact (pass ``llm_config.api_key``); credential-shaped text is
    redacted whatever it is. ``clock`` gives the seconds of ``t`` (monotonic by default);
    ``wall_clock`` the header's ``started_at`` (seconds since the epoch, ``time.time``).
    """

    def __init__(
        self,
        stream: TextStream,
        *,
        secret: Secret | str | None = None,
        max_field_bytes: int = DEFAULT_MAX_FIELD_BYTES,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not 64 <= max_field_bytes <= max_record_bytes // 4:
            raise ValueError("max_field_bytes must be at least 64 and a quarter of a record")
        if max_total_bytes < 4 * max_record_bytes:
            raise ValueError("max_total_bytes must hold at least four records")
        self._stream: TextStream | None = stream
        self._guard = ContentGuard(secret)
        self._field = max_field_bytes
        self._record = max_record_bytes
        self._total = max_total_bytes
        self._clock = clock
        self._wall_clock = wall_clock
        self._started: float | None = None
        self._seq = 0
        self._prev = CHAIN_START
        self._written = 0
        self._reported: set[str] = set()
        self.records_dropped = 0
        self.error: str | None = None

    def __repr__(self) -> str:
        return f"TranscriptWriter(records={self._seq}, dropped={self.records_dropped})"

    # --- the header -----------------------------------------------------------------------

    def begin(
        self,
        *,
        session_id: str,
        generation: int,
        goal: str | Sequence[Message],
        tools: Sequence[Tool],
        config: ToolLoopConfig,
        system_prompt: str | None = None,
        endpoint_url: str | None = None,
        llm: LLMConfig | None = None,
        labels: Mapping[str, str] | None = None,
        servers: Mapping[str, str] | None = None,
    ) -> None:
        """Write the header: what a replay needs to run the session again, and when the
        session started (``started_at``, UTC).

        ``llm``: the client's configuration; its endpoint (as :func:`shown_url
        <metacrate_grid_agent.config.shown_url>` shows it: no user-info, no credential in the
        query) and the settings that decide how a reply is read are kept, never the key.
        ``servers``: the MCP server each tool's calls go to, by tool name (kept as each
        tool's ``server``, which the report names).
        """
        if llm is not None and endpoint_url is None:
            endpoint_url = llm.endpoint_url
        record: dict[str, Any] = {
            "type": "session",
            "schema": SCHEMA,
            "v": SCHEMA_VERSION,
            "library": __version__,
            "session_id": session_id,
            "generation": generation,
            "started_at": _utc(self._wall_clock()),
            "endpoint": None if endpoint_url is None else shown_url(endpoint_url),
            "config": config.to_dict(),
            "llm": None
            if llm is None
            else {k: v for k, v in llm.to_redacted_dict().items() if k in REPLY_SETTINGS},
            "tools": [
                {
                    "name": t.name,
                    "description": t.description,
                    "parameters": msgspec.to_builtins(dict(t.parameters)),
                    "effect": t.effect.value,
                    "timeout_s": t.timeout_s,
                    "server": None
                    if servers is None or t.name not in servers
                    else self._text(servers[t.name], 256),
                }
                for t in tools
            ],
            "system_prompt": None if system_prompt is None else self._text(system_prompt),
            "labels": {self._text(k, 64): self._text(v, 256) for k, v in (labels or {}).items()},
        }
        if isinstance(goal, str):
            record["goal"] = self._text(goal)
        else:
            record["initial_messages"] = [
                self._scrub_data(msgspec.to_builtins(m)) for m in goal[:MAX_LIST_ITEMS]
            ]
        self._write(record)

    # --- events ---------------------------------------------------------------------------

    def __call__(self, event: LoopEvent) -> None:
        """Write one record for ``event``; never raises into the loop (see ``error``)."""
        try:
            self._event(event)
        except Exception as exc:  # noqa: BLE001 - a transcript must never disturb the session
            self.error = f"{type(exc).__name__} while recording a {event.kind} event"
            self._stream = None
            logger.warning("transcript stopped: %s", self.error)

    def _event(self, event: LoopEvent) -> None:
        record: dict[str, Any] = {"type": event.kind, "turn": event.turn}
        if event.kind == "request":
            record["request_id"] = event.request_id
        elif event.kind == "reply" and event.completion is not None:
            record.update(self._reply(event))
        elif event.kind == "approval" and event.call is not None:
            record.update(
                id=self._text(event.call.id, 256),
                name=event.call.name,
                verdict=event.verdict,
                reason=None if event.reason is None else self._text(event.reason, 1024),
                wait_s=None if event.wait_s is None else _seconds(event.wait_s),
                timed_out=event.verdict == "timeout",
            )
        elif event.kind == "request_failed":
            record.update(
                request_id=event.request_id,
                error=None if event.error is None else self._error(event.error),
                cancel_reason=None if event.reason is None else self._text(event.reason, 256),
                attempt_records=self._attempts(event.attempt_records),
            )
        elif event.kind == "tool_call" and event.call is not None:
            call = event.call
            arguments = json.dumps(dict(call.arguments), ensure_ascii=False, sort_keys=True)
            record.update(
                id=self._text(call.id, 256),
                name=call.name,
                arguments=self._text(arguments),
                effect=call.effect.value,
            )
        elif event.kind == "tool_result" and event.record is not None:
            call_record = event.record
            record.update(
                id=self._text(call_record.call_id, 256),
                name=self._text(call_record.name, 256),
                status=call_record.status,
                observation=self._text(call_record.observation),
                latency_s=_seconds(call_record.latency_s),
            )
            record["arguments"] = self._text(call_record.arguments)
        elif event.kind == "finish" and event.result is not None:
            record.update(self._finish(event.result))
        self._write(record)

    def _reply(self, event: LoopEvent) -> dict[str, Any]:
        completion = event.completion
        assert completion is not None  # noqa: S101 - checked by the caller
        calls = []
        for call in completion.tool_calls[:MAX_LIST_ITEMS]:
            arguments = self._text(call.arguments)
            calls.append(
                {
                    "id": self._text(call.id, 256),
                    "name": self._text(call.name, 256),
                    "arguments": arguments,
                    **({"arguments_cut": True} if arguments != call.arguments else {}),
                }
            )
        return {
            "request_id": completion.request_id,
            "text": None if completion.text is None else self._text(completion.text),
            "tool_calls": calls,
            "usage": _usage(completion.usage),
            "finish_reason": None
            if completion.finish_reason is None
            else self._text(completion.finish_reason, 64),
            "attempts": completion.attempts,
            "latency_s": _seconds(completion.latency_s),
            "attempt_records": self._attempts(completion.attempt_records),
        }

    def _attempts(self, records: Sequence[AttemptRecord]) -> list[dict[str, Any]]:
        return [
            {
                "attempt": r.attempt,
                "outcome": r.outcome,
                "status": r.status,
                "error_kind": r.error_kind,
                "latency_s": _seconds(r.latency_s),
                "delay_s": None if r.delay_s is None else _seconds(r.delay_s),
                "delay_source": r.delay_source,
            }
            for r in records[:MAX_LIST_ITEMS]
        ]

    def _error(self, error: GridAgentError) -> dict[str, Any]:
        return {
            "kind": error.kind,
            "message": self._text(error.message, MAX_ERROR_BYTES),
            "status": error.status if isinstance(error, HTTPStatusError) else None,
            "request_id": error.request_id,
            "attempts": error.attempts,
        }

    def _finish(self, result: LoopResult) -> dict[str, Any]:
        error = result.error
        usage = result.usage
        finish_reason = result.finish_reason
        return {
            "session_id": result.session_id,
            "generation": result.generation,
            "outcome": str(result.outcome.value),
            "bound": result.bound,
            "cancel_reason": None
            if result.cancel_reason is None
            else self._text(result.cancel_reason, 256),
            "error": None if error is None else self._error(error),
            "turns": result.turns,
            "calls": len(result.calls),
            "usage": usage.as_dict(),
            "attempts": result.attempts,
            "latency_s": _seconds(result.latency_s),
            "compactions": result.compactions,
            "final_text": None if result.final_text is None else self._text(result.final_text),
            "finish_reason": self._text(finish_reason, 64)
            if isinstance(finish_reason, str)
            else None,
            "ambiguous_call": None
            if result.ambiguous_call is None
            else self._text(result.ambiguous_call.call_id, 256),
            "unreported_calls": [
                {
                    "id": self._text(c.call_id, 256),
                    "name": self._text(c.name, 256),
                    "status": c.status,
                    "observation": self._text(c.observation),
                }
                for c in result.calls[-MAX_LIST_ITEMS:]
                if c.call_id not in self._reported
            ],
            "records_dropped": self.records_dropped,
        }

    # --- writing --------------------------------------------------------------------------

    def _text(self, text: str, limit: int | None = None) -> str:
        return self._guard.text(text, self._field if limit is None else limit)

    def _scrub_data(self, data: Any) -> Any:
        if isinstance(data, str):
            return self._text(data)
        if isinstance(data, dict):
            return {str(k): self._scrub_data(v) for k, v in list(data.items())[:MAX_LIST_ITEMS]}
        if isinstance(data, list | tuple):
            return [self._scrub_data(v) for v in data[:MAX_LIST_ITEMS]]
        return data

    def _unshown(self, data: Any) -> Any:
        """``data`` with every string (member names too) that shows the key redacted.

        The last check of every record, on its texts as they are (the JSON line escapes a
        backslash or a quote, so a key holding one is not found there): a text that did not
        pass :meth:`_text` (a caller's session id, say) loses that field, never the record.
        """
        if isinstance(data, str):
            return self._text(data) if self._guard.contains_secret(data) else data
        if isinstance(data, dict):
            return {self._unshown(k): self._unshown(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self._unshown(v) for v in data]
        return data

    def _write(self, record: dict[str, Any]) -> None:
        if self._stream is None:
            return
        now = self._clock()
        if self._started is None:
            self._started = now
            if record["type"] != "session":  # no header was written: a minimal one
                self._write({"type": "session", "schema": SCHEMA, "v": SCHEMA_VERSION,
                             "library": __version__})  # fmt: skip
                if self._stream is None:  # the header's write failed
                    return
        if record["type"] == "tool_result":
            self._reported.add(record["id"])
        record = {"type": record["type"], "seq": self._seq, "t": _seconds(now - self._started),
                  "prev": self._prev, **self._unshown(record)}  # fmt: skip
        line = json.dumps(record, ensure_ascii=True)
        if len(line) + 1 > self._record:
            kept = {k: v for k, v in record.items() if not isinstance(v, dict | list | str)}
            line = json.dumps(
                {**kept, "type": record["type"], "prev": self._prev, "oversized": True}
            )
        if self._guard.contains_secret(line):  # pragma: no cover - no string shows the key
            line = json.dumps({"type": record["type"], "seq": self._seq, "prev": self._prev,
                               "redacted": True})  # fmt: skip
        reserve = 0 if record["type"] == "finish" else self._record
        if self._written + len(line) + 1 > self._total - reserve:
            self.records_dropped += 1
            return
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
        except (OSError, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self._stream = None
            logger.warning("transcript stopped: %s", self.error)
            return
        self._written += len(line) + 1
        self._seq += 1
        self._prev = line_hash(line)
