"""Providers from the standard ``OTEL_*`` variables, for a program that has none of its own.

:func:`configure_from_environment` is how the ``grid-agent`` command gets its providers, and
any application may call it too:

- ``OTEL_SDK_DISABLED=true``, or no exporter asked for: None, and nothing is built.
- Global providers already set (``opentelemetry-instrument`` sets them up before the program
  runs): those, flushed at :meth:`TelemetryExport.close` and left to their owner to shut down.
- Under ``opentelemetry-instrument`` whose start failed (say its distro's default protocol,
  gRPC, without the gRPC exporter installed): no providers (``exporters`` names none), and
  nothing built from the same variables, which the instrument has read, and changed, first.
- Otherwise the SDK's providers, built here and never registered globally, with the
  exporters ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER`` name (comma-separated):
  ``console`` (JSON on stderr, so a command's stdout stays its result), ``otlp`` (OTLP over
  HTTP/protobuf, ``opentelemetry-exporter-otlp-proto-http``, which reads
  ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``_HEADERS``, ``_TIMEOUT`` and their per-signal forms) or
  ``none``. A signal whose variable is unset exports by OTLP when an OTLP endpoint variable
  names a collector, and not at all otherwise (the standard default, OTLP to localhost,
  would send to a collector nobody named). The resource is the SDK's (``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``), with ``service.name`` ``grid-agent`` when neither names one.

A value this function cannot honour (an unknown exporter, an OTLP protocol other than
``http/protobuf``, the SDK not installed) is a :class:`ConfigError` naming the variable;
nothing is half built. The SDK and the exporter are imported only here, only when asked for:
the ``otel-export`` extra brings them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Final, Literal

from opentelemetry import metrics, trace

from metacrate_grid_agent.errors import ConfigError, ConfigProblem

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "FLUSH_TIMEOUT_S",
    "INSTRUMENT_MODULE",
    "TelemetryExport",
    "configure_from_environment",
    "export_requested",
]

#: ``service.name`` when neither ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` names one.
DEFAULT_SERVICE_NAME: Final = "grid-agent"
#: Default bound on :meth:`TelemetryExport.close`: flushing what a short command recorded
#: takes milliseconds; a collector that does not answer must not hold the command's exit
#: (each export is bounded by the exporter's own timeout too, ``OTEL_EXPORTER_OTLP_TIMEOUT``).
FLUSH_TIMEOUT_S: Final = 5.0
#: The variable naming each signal's exporters, and its OTLP variables' signal part.
SIGNALS: Final = {"traces": "OTEL_TRACES_EXPORTER", "metrics": "OTEL_METRICS_EXPORTER"}
#: The exporters this function builds (``otlp_proto_http`` is the SDK's name for ``otlp``
#: over HTTP).
EXPORTERS: Final = ("console", "otlp", "otlp_proto_http", "none")
#: The one OTLP protocol the ``otel-export`` extra brings.
PROTOCOL: Final = "http/protobuf"
#: The module ``opentelemetry-instrument``'s start-up (its ``sitecustomize``) imports in the
#: program it runs: loaded means the program runs under the instrument.
INSTRUMENT_MODULE: Final = "opentelemetry.instrumentation.auto_instrumentation"
#: The install hint when the SDK or the exporter is missing.
EXTRA: Final = "install metacrate-grid-agent[otel-export] (the OpenTelemetry SDK and exporter)"


def _names(environ: Mapping[str, str], signal: str) -> tuple[str, ...]:
    """The exporters asked for one signal (``none`` and blanks dropped)."""
    value = environ.get(SIGNALS[signal], "").strip()
    if not value:
        endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
        return ("otlp",) if any(environ.get(name, "").strip() for name in endpoints) else ()
    names = tuple(dict.fromkeys(n.strip().lower() for n in value.split(",") if n.strip()))
    return tuple(n for n in names if n != "none")


def export_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the variables ask for any export (the rule of the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(_names(env, signal) for signal in SIGNALS)


@dataclasses.dataclass(frozen=True, slots=True)
class TelemetryExport:
    """The providers to build :class:`GenAITelemetry` from, and how to end them.

    ``source`` is ``"global"`` (someone else's, e.g. ``opentelemetry-instrument``'s) or
    ``"environment"`` (built here from the variables). ``exporters`` names what each signal
    goes to, for a status line.
    """

    tracer_provider: trace.TracerProvider | None
    meter_provider: metrics.MeterProvider | None
    source: Literal["global", "environment"]
    exporters: Mapping[str, tuple[str, ...]]
    _close: Callable[[float], bool] = dataclasses.field(repr=False)

    def close(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Export what was recorded, within ``timeout_s``; shut down the providers built
        here (global ones are only flushed). True when everything was flushed in time.

        The work runs in a daemon thread that is waited for ``timeout_s`` at most: an
        exporter retrying against a collector that does not answer never holds the caller
        longer (what it had not sent by then is dropped).
        """
        outcome: list[bool] = []
        worker = threading.Thread(
            target=lambda: outcome.append(self._close(timeout_s)),
            name="metacrate-grid-agent-otel-close",
            daemon=True,
        )
        worker.start()
        worker.join(max(0.0, timeout_s))
        return outcome == [True]


def configure_from_environment() -> TelemetryExport | None:
    """The providers the standard variables ask for, or None (see the module docstring)."""
    if not export_requested(os.environ):
        return None
    tracer_provider = trace.get_tracer_provider()
    if not isinstance(tracer_provider, trace.ProxyTracerProvider):
        meter_provider = metrics.get_meter_provider()
        return TelemetryExport(
            tracer_provider,
            meter_provider,
            "global",
            {"traces": ("global",), "metrics": ("global",)},
            lambda timeout_s: _flush(tracer_provider, meter_provider, timeout_s, shut=False),
        )
    if INSTRUMENT_MODULE in sys.modules:  # the instrument's own start failed: its call
        return TelemetryExport(None, None, "global", {"traces": (), "metrics": ()}, lambda _: True)
    wanted = {signal: _names(os.environ, signal) for signal in SIGNALS}
    problems = _problems(os.environ, wanted)
    if problems:
        raise ConfigError(problems)
    try:
        return _build(wanted)
    except ImportError:
        variable = SIGNALS["traces" if wanted["traces"] else "metrics"]
        raise ConfigError([ConfigProblem(variable, f"needs the SDK: {EXTRA}")]) from None


def _problems(
    environ: Mapping[str, str], wanted: Mapping[str, tuple[str, ...]]
) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for signal, names in wanted.items():
        unknown = [n for n in names if n not in EXPORTERS]
        if unknown:
            problems.append(
                ConfigProblem(
                    SIGNALS[signal],
                    f"unknown exporter {unknown[0]!r}: this command builds console, otlp "
                    "(OTLP over HTTP) or none; run it under opentelemetry-instrument for others",
                )
            )
        if any(n.startswith("otlp") for n in names):
            specific = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
            for variable in (specific, "OTEL_EXPORTER_OTLP_PROTOCOL"):
                protocol = environ.get(variable, "").strip()
                if protocol:
                    if protocol != PROTOCOL:
                        problems.append(
                            ConfigProblem(
                                variable,
                                f"{protocol!r} is not supported here: the otel-export extra "
                                f"speaks {PROTOCOL}; for grpc, run under opentelemetry-instrument "
                                "with opentelemetry-exporter-otlp-proto-grpc",
                            )
                        )
                    break
    return problems


def _build(wanted: Mapping[str, tuple[str, ...]]) -> TelemetryExport:
    """The SDK's providers with the exporters asked for (imports the SDK: may raise
    ImportError before anything is built)."""
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415 - only when asked
    from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
        ConsoleMetricExporter,
        MetricExporter,
        MetricReader,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    otlp = any(n.startswith("otlp") for names in wanted.values() for n in names)
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))

    tracer_provider = None
    if wanted["traces"]:
        # No exit hook: close() ends them, bounded; a hook would wait on a silent collector.
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for name in wanted["traces"]:
            span_exporter: SpanExporter = (
                ConsoleSpanExporter(out=sys.stderr) if name == "console" else OTLPSpanExporter()
            )
            tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    meter_provider = None
    if wanted["metrics"]:
        readers: list[MetricReader] = []
        for name in wanted["metrics"]:
            metric_exporter: MetricExporter = (
                ConsoleMetricExporter(out=sys.stderr) if name == "console" else OTLPMetricExporter()
            )
            readers.append(PeriodicExportingMetricReader(metric_exporter))
        meter_provider = MeterProvider(
            resource=resource, metric_readers=readers, shutdown_on_exit=False
        )

    def close(timeout_s: float) -> bool:
        return _flush(tracer_provider, meter_provider, timeout_s, shut=True)

    return TelemetryExport(
        tracer_provider,
        meter_provider,
        "environment",
        {
            signal: tuple("otlp" if n.startswith("otlp") else n for n in names)
            for signal, names in wanted.items()
        },
        close,
    )


def _flush(
    tracer_provider: trace.TracerProvider | None,
    meter_provider: metrics.MeterProvider | None,
    timeout_s: float,
    *,
    shut: bool,
) -> bool:
    """Flush both providers within ``timeout_s`` (the API types have no flush: the SDK's
    do, and a provider without one has nothing to flush); shut them down when ``shut``."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    flushed = True
    for provider in (tracer_provider, meter_provider):
        flush = getattr(provider, "force_flush", None)
        if callable(flush):
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            flushed = bool(flush(timeout_millis=left_ms)) and flushed
    if shut:
        if tracer_provider is not None:
            getattr(tracer_provider, "shutdown", lambda: None)()
        if meter_provider is not None:
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            getattr(meter_provider, "shutdown", lambda **_: None)(timeout_millis=left_ms)
    return flushed
