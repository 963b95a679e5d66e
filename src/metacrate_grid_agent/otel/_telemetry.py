"""The tracing and metrics sink: one ``LoopEvent`` in, spans, span events and measurements out.

Span tree of one session (names and attributes follow the OpenTelemetry GenAI conventions;
our own attributes carry the ``grid_agent.`` prefix)::

    invoke_agent <agent>            INTERNAL  gen_ai.conversation.id = session id,
    │                                          grid_agent.session.generation/.outcome/...
    ├── chat [<model>]              CLIENT    one per model request sent; usage, finish
    │                                          reasons, server.address/port, request id,
    │                                          attempts; each retry is a "grid_agent.retry"
    │                                          event (a failed request's too)
    ├── execute_tool <tool name>    INTERNAL  one per proposed call (rejected ones too),
    │                                          gen_ai.tool.name/.call.id, effect, status
    └── (event) grid_agent.compaction

Every span but the root carries ``gen_ai.conversation.id`` too. The driver enters the sink's
:meth:`SessionTelemetry.scope` around the run, each request sent and each executor call:
``invoke_agent``, ``chat`` and ``execute_tool`` are then the current span there, so a span
the application (or an HTTP client instrumentation) opens nests under them. Every span a
session opened is ended by its ``finish`` event, with the reason when the session was cut
mid-request or mid-call (``error.type`` and ``grid_agent.end_reason``). The sink never
raises into the loop: a failure of its own is logged once and ignored.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from metacrate_grid_agent import (
    CallRecord,
    Completion,
    LLMConfig,
    LoopEvent,
    LoopResult,
    Message,
    Secret,
    SessionGeneration,
    SystemMessage,
    ToolDefinition,
    ValidatedCall,
    __version__,
)
from metacrate_grid_agent._core._redact import ContentGuard, bounded_text
from metacrate_grid_agent._settings import parse_url
from metacrate_grid_agent.otel import _chat, _content, _variables

__all__ = ["GenAITelemetry", "SessionTelemetry"]

logger = logging.getLogger("metacrate_grid_agent.otel")

#: Instrumentation scope of the tracer and the meter.
SCOPE: Final = "metacrate_grid_agent"
#: The opentelemetry-semantic-conventions release every name and unit is checked against
#: (tests/otel/test_otel_reference.py; the guide names it too).
CONVENTIONS_VERSION: Final = "0.66b2"
#: Bucket boundaries the conventions advise for gen_ai.client.operation.duration (seconds).
DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
#: Bucket boundaries the conventions advise for gen_ai.client.token.usage.
TOKEN_BUCKETS: Final = tuple(4**n for n in range(14))
#: Default bound on one recorded content attribute, when content is recorded at all.
DEFAULT_MAX_CONTENT_BYTES: Final = 4096
#: Bound on endpoint-controlled identifiers and reasons (ids, finish reasons, tool names).
MAX_LABEL_BYTES: Final = 256

#: What the sink logs (once) when it fails; the session goes on.
FAILED: Final = "telemetry sink failed; its spans may be incomplete"

#: Where a call that did not succeed keeps its observation (not the tool's output).
OBSERVATION: Final = "grid_agent.tool.observation"

_CUT_OUTCOMES: Final = frozenset({"cancelled", "superseded"})
#: The scope entered when there is no span to make current.
_NO_SCOPE: Final = contextlib.nullcontext()
#: error.type of a tool call by status (ok has none).
_TOOL_ERROR: Final = {
    "failed": "tool_failed",
    "rejected": "tool_rejected",
    "ambiguous": "ambiguous_mutation",
    "cancelled": "cancelled",
}


def _current(span: Span | None) -> contextlib.AbstractContextManager[object]:
    """Make ``span`` the current span (in this task's context) while inside; never end it."""
    if span is None:
        return _NO_SCOPE
    return trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    )


def _server(url: str | None) -> dict[str, Any]:
    if url is None:
        return {}
    try:
        parts = parse_url(url)
    except ValueError:
        return {}
    host, port = parts.host, parts.port
    out: dict[str, Any] = {}
    if host:
        out["server.address"] = host
        if port is not None:
            out["server.port"] = port
    return out


class GenAITelemetry:
    """Instruments built once (per process, or per provider); :meth:`session` makes sinks.

    ``tracer_provider`` / ``meter_provider``: where spans and measurements go (either may be
    None to leave that half off). ``llm``: the client's configuration, for server.address,
    server.port and the key to redact. ``record_content``: opt in to replies, arguments,
    observations, input messages, system instructions and tool definitions as attributes
    (bounded and redacted); when None, ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
    decides (``true``: on; anything else or unset: off; with ``gen_ai_latest_experimental``
    in ``OTEL_SEMCONV_STABILITY_OPT_IN``, ``SPAN_ONLY`` or ``SPAN_AND_EVENT``: on).
    ``provider_name`` is reported as ``gen_ai.provider.name`` (default: ``llm``'s
    ``provider_name``, else ``openai``, the API the library speaks).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        llm: LLMConfig | None = None,
        secret: Secret | str | None = None,
        record_content: bool | None = None,
        max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
        provider_name: str | None = None,
        agent_name: str = "grid-agent",
    ) -> None:
        if max_content_bytes < 64:
            raise ValueError("max_content_bytes must be at least 64")
        self._tracer = (
            None if tracer_provider is None else tracer_provider.get_tracer(SCOPE, __version__)
        )
        self._guard = ContentGuard(secret if secret is not None or llm is None else llm.api_key)
        if record_content is None:
            record_content = _variables.capture_content(os.environ)
        self.record_content = record_content
        self.max_content_bytes = max_content_bytes
        self.agent_name = agent_name
        self.common: Mapping[str, Any] = {
            "gen_ai.provider.name": provider_name or (llm.provider_name if llm else "openai"),
            **_server(None if llm is None else llm.endpoint_url),
        }
        self._meter = (
            None if meter_provider is None else meter_provider.get_meter(SCOPE, __version__)
        )
        if self._meter is not None:
            meter = self._meter
            self.duration = meter.create_histogram(
                "gen_ai.client.operation.duration",
                unit="s",
                description="GenAI operation duration",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            )
            self.tokens = meter.create_histogram(
                "gen_ai.client.token.usage",
                unit="{token}",
                description="Number of input and output tokens used",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
            )
            self.outcomes = meter.create_counter(
                "grid_agent.session.outcomes", unit="{session}", description="Sessions ended"
            )
            self.retries = meter.create_counter(
                "grid_agent.request.retries", unit="{retry}", description="Request retries"
            )
            self.rejected = meter.create_counter(
                "grid_agent.tool.rejected_calls",
                unit="{call}",
                description="Proposed tool calls that failed validation",
            )
            self.ambiguous = meter.create_counter(
                "grid_agent.tool.ambiguous_mutations",
                unit="{call}",
                description="Mutating calls whose effect is unknown",
            )

    @classmethod
    def from_global(cls, **options: Any) -> GenAITelemetry:
        """Use the globally registered providers (read now, explicitly; nothing is set)."""
        return cls(
            tracer_provider=trace.get_tracer_provider(),
            meter_provider=metrics.get_meter_provider(),
            **options,
        )

    def session(
        self, generation: SessionGeneration | str, *, at_generation: int | None = None
    ) -> SessionTelemetry:
        """A sink for one run: pass it as ``on_event``. Use each sink for one run only."""
        if isinstance(generation, SessionGeneration):
            session_id, gen = generation.session_id, generation.current
        else:
            session_id, gen = generation, 0
        return SessionTelemetry(self, session_id, gen if at_generation is None else at_generation)

    def request(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        *,
        request_id: str | None = None,
    ) -> _chat.RequestTelemetry:
        """Trace one request sent outside a tool loop: a ``chat`` span, current inside::

        with telemetry.request(messages, tools, request_id=rid) as traced:
            try:
                traced.reply(await client.complete(messages, tools, request_id=rid))
            except GridAgentError as exc:
                traced.failed(exc)
        """
        return _chat.RequestTelemetry._begin(self, messages, tools, request_id)  # noqa: SLF001

    def label(self, text: str) -> str:
        """An endpoint-controlled identifier, redacted and bounded."""
        return self._guard.text(text, MAX_LABEL_BYTES)

    def content(self, text: str, limit: int | None = None) -> str:
        """Recorded content, redacted and bounded (to ``max_content_bytes`` by default)."""
        return self._guard.text(text, self.max_content_bytes if limit is None else limit)

    def cutter(self) -> Callable[[str, int], str]:
        """``cut(text, limit)``: content redacted once (then kept), cut to ``limit`` bytes.

        For the JSON attributes, whose parts are cut shorter and shorter until the whole
        fits: redaction (the costly step) is done once per text, always before the cut.
        """
        cache: dict[str, str] = {}

        def cut(text: str, limit: int) -> str:
            clean = cache.get(text)
            if clean is None:
                clean = cache[text] = self.content(text)
            return bounded_text(clean, limit)

        return cut

    @property
    def tracer(self) -> trace.Tracer | None:
        """The tracer, or None when tracing is off."""
        return self._tracer

    @property
    def metering(self) -> bool:
        """Whether metrics are recorded."""
        return self._meter is not None


class SessionTelemetry:
    """The sink of one run: keeps that run's open spans and ends them all at ``finish``.

    Pass the sink itself as ``on_event``: the loop then finds :meth:`scope` and makes the
    spans current. A wrapper that forwards events should expose the sink's ``scope`` as
    its own; without it spans are still made (a ``chat`` span opens on the ``request``
    event), but none is current and a request never sent still gets a span.
    """

    def __init__(self, telemetry: GenAITelemetry, session_id: str, generation: int) -> None:
        self._t = telemetry
        self._session_id = session_id
        self._generation = generation
        self._session: Span | None = None
        self._session_context: Any = None
        self._scoped = False
        self._pending: LoopEvent | None = None
        self._chat: Span | None = None
        self._chat_started_ns = 0
        self._awaiting_reply = False
        self._tools: dict[str, tuple[Span | None, ValidatedCall, int]] = {}
        self._running: Span | None = None
        self._tools_json: tuple[Sequence[ToolDefinition], str] | None = None
        self._described: Sequence[ToolDefinition] | None = None
        self._descriptions: dict[str, str] = {}
        self._input_tokens = False
        self._output_tokens = False
        self._started = time.monotonic()
        self._failed = False
        self.finished = False

    def __repr__(self) -> str:
        return f"SessionTelemetry({self._session_id!r}, generation={self._generation})"

    def __call__(self, event: LoopEvent) -> None:
        """Take in one event; never raises into the loop."""
        try:
            self._handle(event)
        except Exception:  # telemetry must never disturb the session
            if not self._failed:
                self._failed = True
                logger.warning(FAILED, exc_info=True)

    def scope(self, kind: str) -> contextlib.AbstractContextManager[object]:
        """What the loop enters around its steps (``"session"``), a request it sends
        (``"request"``) or an executor call (``"tool"``): that span made current in the
        run's own task context, so concurrent sessions never see each other's spans.
        Never raises."""
        try:
            if self.finished:
                return _NO_SCOPE
            if kind == "session":
                self._scoped = True
                self._open_session()
                return _current(self._session)
            if kind == "request":
                self._start_chat()
                return _current(self._chat)
            if kind == "tool":
                running, self._running = self._running, None
                return _current(running)
        except Exception:  # telemetry must never disturb the session
            if not self._failed:
                self._failed = True
                logger.warning(FAILED, exc_info=True)
        return _NO_SCOPE

    # --- dispatch -------------------------------------------------------------------------

    def _handle(self, event: LoopEvent) -> None:
        if self.finished:
            return
        self._open_session()
        if event.kind == "request":
            self._pending = event
            if event.tools is not self._described and self._t.tracer is not None:
                self._described = event.tools
                self._descriptions = {d.function.name: d.function.description for d in event.tools}
            if not self._scoped:  # no scope hook: the request is taken as sent
                self._start_chat()
        elif event.kind == "reply" and event.completion is not None:
            self._end_chat(event.completion)
        elif event.kind == "tool_call" and event.call is not None:
            self._start_tool(event.call, event.turn)
        elif event.kind == "tool_result" and event.record is not None:
            self._end_tool(event.record)
        elif event.kind == "compaction" and self._session is not None:
            self._session.add_event("grid_agent.compaction", {"grid_agent.turn": event.turn})
        elif event.kind == "finish" and event.result is not None:
            self._finish(event.result)

    def _span(self, name: str, kind: SpanKind, attributes: Mapping[str, Any]) -> Span | None:
        tracer = self._t.tracer
        if tracer is None:
            return None
        return tracer.start_span(
            name,
            context=self._session_context,
            kind=kind,
            attributes={
                **self._t.common,
                "gen_ai.conversation.id": self._session_id,
                **attributes,
            },
        )

    def _open_session(self) -> None:
        if self._session is not None or self._t.tracer is None:
            return
        self._session = self._t.tracer.start_span(
            f"invoke_agent {self._t.agent_name}",
            kind=SpanKind.INTERNAL,
            attributes={
                **self._t.common,
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self._t.agent_name,
                "gen_ai.conversation.id": self._session_id,
                "grid_agent.session.id": self._session_id,
                "grid_agent.session.generation": self._generation,
            },
        )
        self._session_context = trace.set_span_in_context(self._session)

    # --- model requests -------------------------------------------------------------------

    def _start_chat(self) -> None:
        """The pending request goes out: open its span."""
        event, self._pending = self._pending, None
        if event is None:
            return
        self._chat_started_ns = time.time_ns()
        self._awaiting_reply = True
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "grid_agent.request.id": event.request_id or "",
            "grid_agent.turn": event.turn,
        }
        if self._t.record_content and self._t.tracer is not None:
            attributes.update(self._input(event.messages, event.tools))
        self._chat = self._span("chat", SpanKind.CLIENT, attributes)

    def _input(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, str]:
        """What the request sends, as the conventions' JSON attributes, each bounded."""
        t = self._t
        cut, limit = t.cutter(), t.max_content_bytes
        out = {"gen_ai.input.messages": _content.input_messages(messages, cut, t.label, limit)}
        if any(isinstance(m, SystemMessage) for m in messages):
            out["gen_ai.system_instructions"] = _content.system_instructions(messages, cut, limit)
        if tools:
            cached = self._tools_json  # made once per tools sequence (the loop's is fixed)
            if cached is None or cached[0] is not tools:
                text = _content.tool_definitions(tools, cut, t.label, limit)
                cached = self._tools_json = (tools, text)
            out["gen_ai.tool.definitions"] = cached[1]
        return out

    def _end_chat(self, completion: Completion) -> None:
        span, self._chat = self._chat, None
        self._awaiting_reply = False
        usage = completion.usage
        if usage is not None:
            self._input_tokens |= usage.prompt_tokens is not None
            self._output_tokens |= usage.completion_tokens is not None
        _chat.end_chat(self._t, span, completion, self._chat_started_ns)

    # --- tool calls -----------------------------------------------------------------------

    def _start_tool(self, call: ValidatedCall, turn: int) -> None:
        t = self._t
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": t.label(call.id),
            "gen_ai.tool.type": "function",
            "grid_agent.tool.effect": call.effect.value,
            "grid_agent.turn": turn,
        }
        description = self._descriptions.get(call.name)
        if description:
            attributes["gen_ai.tool.description"] = t.content(description)
        if t.record_content:
            arguments = json.dumps(dict(call.arguments), ensure_ascii=False, sort_keys=True)
            attributes["gen_ai.tool.call.arguments"] = t.content(arguments)
        span = self._span(f"execute_tool {call.name}", SpanKind.INTERNAL, attributes)
        self._running = span
        if span is not None or t.metering:
            self._tools[call.id] = (span, call, time.monotonic_ns())

    def _end_tool(self, record: CallRecord, *, reason: str | None = None) -> None:
        t = self._t
        opened = self._tools.pop(record.call_id, None)
        span = None
        if opened is not None:
            span = opened[0]
        elif t.tracer is not None:  # rejected (or never started): a span of its own
            name = t.label(record.name)
            span = self._span(
                f"execute_tool {name}",
                SpanKind.INTERNAL,
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.call.id": t.label(record.call_id),
                    "gen_ai.tool.type": "function",
                    "grid_agent.turn": record.turn,
                },
            )
        error = _TOOL_ERROR.get(record.status)
        if span is not None:
            span.set_attribute("grid_agent.tool.status", record.status)
            if t.record_content:  # only a success is the tool's output
                result = "gen_ai.tool.call.result" if record.status == "ok" else OBSERVATION
                span.set_attribute(result, t.content(record.observation))
            if reason is not None:
                span.set_attribute("grid_agent.end_reason", t.label(reason))
            if error is not None:
                span.set_attribute("error.type", error)
                span.set_status(Status(StatusCode.ERROR, record.status))
            span.end()
        if t.metering:
            tool = {**t.common, "gen_ai.tool.name": t.label(record.name)}
            if record.status == "rejected":
                t.rejected.add(1, tool)
            elif record.status == "ambiguous":
                t.ambiguous.add(1, tool)
            if opened is not None:
                measured = {**tool, "gen_ai.operation.name": "execute_tool"}
                if error is not None:
                    measured["error.type"] = error
                t.duration.record((time.monotonic_ns() - opened[2]) / 1e9, measured)

    # --- the end --------------------------------------------------------------------------

    def _finish(self, result: LoopResult) -> None:
        self.finished = True
        t = self._t
        outcome = str(result.outcome.value)
        reason = result.cancel_reason or result.bound or outcome
        error_type: str | None = None
        if result.error is not None:
            error_type = result.error.kind
        elif outcome != "completed":
            error_type = "cancelled" if outcome in _CUT_OUTCOMES else outcome
        if self._awaiting_reply:  # the last request got no reply: it failed or was cut
            self._end_failed_chat(result, error_type or "cancelled", reason)
        records = {r.call_id: r for r in result.calls}
        for call_id in list(self._tools):
            record = records.get(call_id)
            if record is None:  # pragma: no cover - every started call has a record
                record = CallRecord(result.turns, call_id, self._tools[call_id][1].name,
                                    "cancelled", "", 0.0)  # fmt: skip
            self._end_tool(record, reason=reason)
        session = self._session
        if session is not None:
            usage = result.usage
            session.set_attribute("grid_agent.session.generation", result.generation)
            session.set_attribute("grid_agent.session.outcome", outcome)
            session.set_attribute("grid_agent.session.turns", result.turns)
            session.set_attribute("grid_agent.session.calls", len(result.calls))
            session.set_attribute("grid_agent.session.attempts", result.attempts)
            if self._input_tokens:  # unreported is left out, not claimed as 0
                session.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            if self._output_tokens:
                session.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
            if result.bound is not None:
                session.set_attribute("grid_agent.session.bound", result.bound)
            if result.cancel_reason is not None:
                session.set_attribute("grid_agent.session.cancel_reason", t.label(reason))
            if error_type is not None:
                session.set_attribute("error.type", error_type)
                session.set_attribute("grid_agent.end_reason", t.label(reason))
                session.set_status(Status(StatusCode.ERROR, outcome))
            session.end()
        if t.metering:
            t.outcomes.add(1, {**t.common, "grid_agent.session.outcome": outcome})
            measured = {**t.common, "gen_ai.operation.name": "invoke_agent"}
            if error_type is not None:
                measured["error.type"] = error_type
            t.duration.record(result.latency_s, measured)

    def _end_failed_chat(self, result: LoopResult, error_type: str, reason: str) -> None:
        span, self._chat = self._chat, None
        self._awaiting_reply = False
        _chat.end_failed_chat(
            self._t,
            span,
            result.error,
            error_type=error_type,
            reason=reason,
            started_ns=self._chat_started_ns,
        )
