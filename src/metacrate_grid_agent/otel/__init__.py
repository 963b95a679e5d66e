"""OpenTelemetry traces and metrics for tool-loop sessions, in the GenAI semantic conventions.

Optional: install ``metacrate-grid-agent[otel]`` (which adds ``opentelemetry-api`` only) and
bring the SDK and exporters of your choice. Nothing is enabled by importing this module, and
nothing global is patched: build a :class:`GenAITelemetry` from the providers you pass (or
from the global ones, with :meth:`GenAITelemetry.from_global`), then give each run its own
sink::

    telemetry = GenAITelemetry(tracer_provider=tp, meter_provider=mp, llm=llm_config)
    result = await loop.run(goal, generation=gen, on_event=telemetry.session(gen))

The rest of the library never imports this module or OpenTelemetry: without it there is no
tracing work at all. Prompts, replies, arguments and observations are never recorded unless
``record_content=True`` (or, left unset, the standard
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``); even then each is redacted (the
key, and anything credential-shaped) and cut to ``max_content_bytes``. The span tree is on
the guide's "Tracing" page (docs/guide/tracing.md).

A program with no providers of its own gets them from the standard ``OTEL_*`` variables with
:func:`configure_from_environment` (the SDK and the OTLP/HTTP exporter: the ``otel-export``
extra), or from ``opentelemetry-instrument``'s global ones; the ``grid-agent`` command does::

    export = configure_from_environment()  # None when no exporter is asked for
    if export is not None:
        telemetry = GenAITelemetry(tracer_provider=export.tracer_provider,
                                   meter_provider=export.meter_provider, llm=llm_config)
        ...
        export.close()  # flushed within a bound before the program exits
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("opentelemetry") is None:  # pragma: no cover - tests have it
    raise ImportError(
        "metacrate_grid_agent.otel needs the OpenTelemetry API: install metacrate-grid-agent[otel]"
    )

from metacrate_grid_agent import _public
from metacrate_grid_agent.otel._chat import RequestTelemetry
from metacrate_grid_agent.otel._export import (
    TelemetryExport,
    configure_from_environment,
    export_requested,
)
from metacrate_grid_agent.otel._telemetry import GenAITelemetry, SessionTelemetry

__all__ = [
    "GenAITelemetry",
    "RequestTelemetry",
    "SessionTelemetry",
    "TelemetryExport",
    "configure_from_environment",
    "export_requested",
]

_public.claim(globals())
