"""The ``chat`` span of one model request: how it ends, by a reply or a failure.

Shared by the session sink (each request of a tool loop) and :class:`RequestTelemetry` (one
request sent on its own, as ``grid-agent probe`` does). The reply's own model renames the
span ``chat {model}`` (the request names none); every attempt that a retry followed is a
``grid_agent.retry`` event at its time and is counted; a failed request's span carries its
final HTTP status, ``error.type`` and status ERROR.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.metrics import Counter, Histogram
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from metacrate_grid_agent import (
    AttemptRecord,
    Completion,
    Message,
    SystemMessage,
    ToolDefinition,
)
from metacrate_grid_agent.errors import GridAgentError
from metacrate_grid_agent.otel import _content


class Instruments(Protocol):
    """What a chat span needs of :class:`~metacrate_grid_agent.otel.GenAITelemetry` (the
    type itself is not imported: it imports this module)."""

    common: Mapping[str, Any]
    record_content: bool
    max_content_bytes: int
    duration: Histogram
    tokens: Histogram
    retries: Counter

    @property
    def tracer(self) -> trace.Tracer | None: ...

    @property
    def metering(self) -> bool: ...

    def label(self, text: str) -> str: ...

    def cutter(self) -> Callable[[str, int], str]: ...


__all__ = ["RequestTelemetry", "end_chat", "end_failed_chat", "input_attributes"]

logger = logging.getLogger("metacrate_grid_agent.otel")

#: What :class:`RequestTelemetry` logs when it fails; the request goes on.
FAILED = "request telemetry failed; its span may be incomplete"


@contextlib.contextmanager
def _never_raises() -> Iterator[None]:
    try:
        yield
    except Exception:  # telemetry must never disturb the request
        logger.warning(FAILED, exc_info=True)


def input_attributes(
    t: Instruments, messages: Sequence[Message], tools: Sequence[ToolDefinition]
) -> dict[str, str]:
    """What a request sends, as the conventions' JSON attributes, each bounded (content on)."""
    cut, limit = t.cutter(), t.max_content_bytes
    out = {"gen_ai.input.messages": _content.input_messages(messages, cut, t.label, limit)}
    if any(isinstance(m, SystemMessage) for m in messages):
        out["gen_ai.system_instructions"] = _content.system_instructions(messages, cut, limit)
    if tools:
        out["gen_ai.tool.definitions"] = _content.tool_definitions(tools, cut, t.label, limit)
    return out


def end_chat(t: Instruments, span: Span | None, completion: Completion, started_ns: int) -> None:
    """End a request's span with its reply, and record its measurements."""
    finish = None if completion.finish_reason is None else t.label(completion.finish_reason)
    usage = completion.usage
    if span is not None:
        span.set_attribute("grid_agent.request.attempts", completion.attempts)
        if completion.response_id is not None:
            span.set_attribute("gen_ai.response.id", t.label(completion.response_id))
        if completion.response_model is not None:
            model = t.label(completion.response_model)
            span.set_attribute("gen_ai.response.model", model)
            span.update_name(f"chat {model}")  # the request names no model
        if finish is not None:
            span.set_attribute("gen_ai.response.finish_reasons", (finish,))
        if usage is not None and usage.prompt_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
        if usage is not None and usage.completion_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        _retry_events(span, completion.attempt_records, started_ns)
        if t.record_content:
            output = _content.output_messages(completion, t.cutter(), t.label, t.max_content_bytes)
            span.set_attribute("gen_ai.output.messages", output)
        span.end()
    if t.metering:
        common = {**t.common, "gen_ai.operation.name": "chat"}
        t.duration.record(completion.latency_s, common)
        if usage is not None and usage.prompt_tokens is not None:
            t.tokens.record(usage.prompt_tokens, {**common, "gen_ai.token.type": "input"})
        if usage is not None and usage.completion_tokens is not None:
            t.tokens.record(usage.completion_tokens, {**common, "gen_ai.token.type": "output"})
        _count_retries(t, completion.attempt_records)


def end_failed_chat(
    t: Instruments,
    span: Span | None,
    error: GridAgentError | None,
    *,
    error_type: str,
    reason: str,
    started_ns: int,
) -> None:
    """End a request's span that got no reply (``error``, or cut when None)."""
    if error is not None and error.request_id is not None:
        elapsed_s = error.elapsed_s
    else:  # cut before an error could say how long it took
        elapsed_s = (time.time_ns() - started_ns) / 1e9
    records: Sequence[AttemptRecord] = () if error is None else error.attempt_records
    if span is not None:
        if error is not None:
            span.set_attribute("grid_agent.request.attempts", error.attempts)
            status = getattr(error, "status", None)
            if isinstance(status, int):
                span.set_attribute("http.response.status_code", status)
        _retry_events(span, records, started_ns)
        span.set_attribute("error.type", error_type)
        span.set_attribute("grid_agent.end_reason", t.label(reason))
        span.set_status(Status(StatusCode.ERROR, error_type))
        span.end()
    if t.metering:
        measured = {**t.common, "gen_ai.operation.name": "chat", "error.type": error_type}
        t.duration.record(max(0.0, elapsed_s), measured)
        _count_retries(t, records)


def _retry_events(span: Span, records: Sequence[AttemptRecord], started_ns: int) -> None:
    """One ``grid_agent.retry`` event per attempt that a retry followed, at its time."""
    offset_s = 0.0
    for record in records:
        offset_s += record.latency_s
        if record.delay_s is None:
            continue
        attributes: dict[str, Any] = {
            "grid_agent.retry.attempt": record.attempt,
            "grid_agent.retry.delay_s": record.delay_s,
            "grid_agent.retry.delay_source": record.delay_source or "",
        }
        if record.error_kind is not None:
            attributes["error.type"] = record.error_kind
        if record.status is not None:
            attributes["http.response.status_code"] = record.status
        span.add_event("grid_agent.retry", attributes, timestamp=started_ns + int(offset_s * 1e9))
        offset_s += record.delay_s


def _count_retries(t: Instruments, records: Sequence[AttemptRecord]) -> None:
    for record in records:
        if record.delay_s is not None:
            source = record.delay_source or ""
            t.retries.add(1, {**t.common, "grid_agent.retry.delay_source": source})


class RequestTelemetry:
    """The ``chat`` span of one request sent outside a tool loop; see
    :meth:`GenAITelemetry.request`. The span is current inside the ``with`` block; say how
    the request ended with :meth:`reply` or :meth:`failed` before leaving it (a block left
    without either, by an exception or a cancellation, ends the span as cut). Never raises
    into the caller's request."""

    _t: Instruments
    _messages: Sequence[Message]
    _tools: Sequence[ToolDefinition]
    _request_id: str | None
    _span: Span | None
    _started_ns: int
    _current: Any
    _ended: bool

    def __init__(self) -> None:
        """Not built directly: :meth:`GenAITelemetry.request` makes one."""
        raise TypeError("a RequestTelemetry is made by GenAITelemetry.request(...)")

    @classmethod
    def _begin(
        cls,
        telemetry: Instruments,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        request_id: str | None,
    ) -> RequestTelemetry:
        self = cls.__new__(cls)
        self._t = telemetry
        self._messages = messages
        self._tools = tools
        self._request_id = request_id
        self._span = None
        self._started_ns = 0
        self._current = None
        self._ended = False
        return self

    def __enter__(self) -> RequestTelemetry:
        t = self._t
        self._started_ns = time.time_ns()
        with _never_raises():
            self._open(t)
        return self

    def _open(self, t: Instruments) -> None:
        if t.tracer is not None:
            attributes: dict[str, Any] = {
                **t.common,
                "gen_ai.operation.name": "chat",
                "grid_agent.request.id": t.label(self._request_id or ""),
            }
            if t.record_content:
                attributes.update(input_attributes(t, self._messages, self._tools))
            self._span = t.tracer.start_span("chat", kind=SpanKind.CLIENT, attributes=attributes)
            self._current = trace.use_span(
                self._span, end_on_exit=False, record_exception=False, set_status_on_exception=False
            )
            self._current.__enter__()

    def reply(self, completion: Completion) -> None:
        """The request's reply: ends the span with it (once)."""
        if not self._ended:
            self._ended = True
            with _never_raises():
                end_chat(self._t, self._span, completion, self._started_ns)

    def failed(self, error: GridAgentError) -> None:
        """The request's error: ends the span as failed, with the error's kind (once)."""
        if not self._ended:
            self._ended = True
            with _never_raises():
                end_failed_chat(
                    self._t,
                    self._span,
                    error,
                    error_type=error.kind,
                    reason=error.kind,
                    started_ns=self._started_ns,
                )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with _never_raises():
            if self._current is not None:
                self._current.__exit__(None, None, None)
        if not self._ended:
            self._ended = True
            reason = "cancelled" if exc is None else type(exc).__name__
            with _never_raises():
                end_failed_chat(
                    self._t,
                    self._span,
                    None,
                    error_type="cancelled",
                    reason=reason,
                    started_ns=self._started_ns,
                )
