"""The command's traces and metrics, configured the standard way or not at all.

Under ``opentelemetry-instrument`` (which sets up global providers), or with the standard
variables (``OTEL_TRACES_EXPORTER=console|otlp``, ``OTEL_METRICS_EXPORTER``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``...), a session's spans and metrics
(``run``, ``demo``) and a probe's one ``chat`` span go where they say, through
:func:`metacrate_grid_agent.otel.configure_from_environment` and the library's own sink and
``GenAITelemetry.request``. Without them nothing of OpenTelemetry is imported: :func:`requested`
reads the variables with the library's rule (``export_requested``; a test keeps the two
alike), and only then is ``metacrate_grid_agent.otel`` imported, here and nowhere else in
the command. What was recorded is flushed before the command exits, within
``FLUSH_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from metacrate_grid_agent import (
    Completion,
    LLMConfig,
    Message,
    SessionGeneration,
    ToolDefinition,
)
from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._common import UsageError
from metacrate_grid_agent.cli._output import Console
from metacrate_grid_agent.errors import GridAgentError

if TYPE_CHECKING:
    from metacrate_grid_agent.otel import SessionTelemetry, TelemetryExport

__all__ = [
    "FLUSH_TIMEOUT_S",
    "CommandTracing",
    "Traced",
    "requested",
    "start_tracing",
    "untraced",
]

#: How long the command waits, at most, for its spans and metrics to be exported on exit.
FLUSH_TIMEOUT_S: Final = 5.0
#: Each signal's exporter variable and the OTLP endpoint variables that also ask for it.
_SIGNALS: Final = {
    "OTEL_TRACES_EXPORTER": ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    "OTEL_METRICS_EXPORTER": ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
}
#: The logger of OpenTelemetry's own packages (the SDK, the exporters).
OTEL_LOGGER: Final = "opentelemetry"
#: Most of OpenTelemetry's warnings shown in one command (a silent collector repeats them).
MAX_EXPORT_WARNINGS: Final = 5
#: Longest such warning shown.
MAX_WARNING_CHARS: Final = 300
#: What to install when the variables ask for an export the environment cannot make.
EXTRA_HINT: Final = (
    "tracing is configured (OTEL_* variables) but OpenTelemetry is not installed: "
    "install metacrate-grid-agent[otel-export]"
)


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the variables ask for an export: an exporter other than ``none``, or an OTLP
    endpoint for a signal whose exporter is unset; never with ``OTEL_SDK_DISABLED=true``."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    for variable, endpoints in _SIGNALS.items():
        value = env.get(variable, "").strip()
        if value:
            if any(n.strip().lower() not in ("", "none") for n in value.split(",")):
                return True
        elif any(env.get(endpoint, "").strip() for endpoint in endpoints):
            return True
    return False


class Traced(Protocol):
    """How a traced request ended: its reply or its error (what ``probe`` reports)."""

    def reply(self, completion: Completion) -> None:
        """The request's reply."""

    def failed(self, error: GridAgentError) -> None:
        """The request's error."""


class _Untraced:
    """A request with tracing off: nothing is recorded."""

    def reply(self, completion: Completion) -> None:
        """Nothing to record."""

    def failed(self, error: GridAgentError) -> None:
        """Nothing to record."""


def untraced() -> contextlib.AbstractContextManager[Traced]:
    """What ``probe`` enters around its request when tracing is off."""
    return contextlib.nullcontext(_Untraced())


class _ExportWarnings(logging.Handler):
    """OpenTelemetry's own warnings (a collector that does not answer) as the command's
    lines: scrubbed, escaped and bounded like every other line, at most
    :data:`MAX_EXPORT_WARNINGS` of them."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self._console = console
        self._left = MAX_EXPORT_WARNINGS

    def silence(self) -> None:
        """Show no more warnings (the command is done with tracing)."""
        self._left = 0

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record's message as one ``grid-agent: tracing:`` line."""
        if self._left <= 0:
            return
        self._left -= 1
        message = output.bounded(record.getMessage(), MAX_WARNING_CHARS)
        self._console.err(f"grid-agent: tracing: {output.printable(message)}")


class CommandTracing:
    """One command's export: a tracing sink per session, and the flush at the end."""

    def __init__(self, export: TelemetryExport, console: Console) -> None:
        self._export = export
        self._warnings = _ExportWarnings(console)
        logger = logging.getLogger(OTEL_LOGGER)
        for old in [h for h in logger.handlers if isinstance(h, _ExportWarnings)]:
            logger.removeHandler(old)
        logger.addHandler(self._warnings)
        logger.propagate = False

    def line(self) -> str:
        """The status line saying where spans and metrics go."""
        if self._export.source == "global" and not any(self._export.exporters.values()):
            return (
                "grid-agent: tracing: opentelemetry-instrument set up no providers "
                "(its messages above say why): nothing is traced"
            )
        shown = {
            signal: ", ".join(names) or "none" for signal, names in self._export.exporters.items()
        }
        return f"grid-agent: tracing: traces to {shown['traces']}, metrics to {shown['metrics']}"

    def sink(self, llm: LLMConfig, generation: SessionGeneration) -> SessionTelemetry:
        """The library's tracing sink for this session (given to the loop beside the
        command's own, so that the loop enters its scope)."""
        from metacrate_grid_agent.otel import GenAITelemetry  # noqa: PLC0415 - only when asked

        telemetry = GenAITelemetry(
            tracer_provider=self._export.tracer_provider,
            meter_provider=self._export.meter_provider,
            llm=llm,
        )
        return telemetry.session(generation)

    def request(
        self,
        llm: LLMConfig,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        request_id: str,
    ) -> contextlib.AbstractContextManager[Traced]:
        """The ``chat`` span of one request sent on its own (``probe``), current inside."""
        from metacrate_grid_agent.otel import GenAITelemetry  # noqa: PLC0415 - only when asked

        telemetry = GenAITelemetry(
            tracer_provider=self._export.tracer_provider,
            meter_provider=self._export.meter_provider,
            llm=llm,
        )
        return telemetry.request(messages, tools, request_id=request_id)

    def close(self, console: Console) -> None:
        """Export what was recorded, within :data:`FLUSH_TIMEOUT_S`; say so when it could not."""
        if not self._export.close(FLUSH_TIMEOUT_S):
            console.err(
                f"grid-agent: tracing: not everything was exported within {FLUSH_TIMEOUT_S:g} s"
            )
        self._warnings.silence()  # an export still retrying after the bound stays quiet


def start_tracing(console: Console) -> CommandTracing | None:
    """The command's tracing when the variables ask for it, else None (nothing imported).

    Raises :class:`~metacrate_grid_agent.errors.ConfigError` naming the variable that cannot
    be honoured, and :class:`UsageError` when OpenTelemetry is not installed.
    """
    if not requested():
        return None
    try:
        from metacrate_grid_agent import otel  # noqa: PLC0415 - only when asked
    except ImportError:
        raise UsageError(EXTRA_HINT) from None
    export = otel.configure_from_environment()
    return None if export is None else CommandTracing(export, console)
