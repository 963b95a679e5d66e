"""Providers from the standard ``OTEL_*`` variables: built only when an exporter is asked for,
never registered globally, flushed within a bound, and refused with the variable's name when
they cannot be honoured.
"""

from __future__ import annotations

import json
import os
import sys
import types

import pytest
from opentelemetry import trace

from metacrate_grid_agent.errors import ConfigError
from metacrate_grid_agent.otel import configure_from_environment, export_requested
from metacrate_grid_agent.otel._export import INSTRUMENT_MODULE


@pytest.fixture(autouse=True)
def no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from an environment with no ``OTEL_*`` variable."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


REQUESTED = [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x"}, False),
    ({"OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_TRACES_EXPORTER": " none ", "OTEL_METRICS_EXPORTER": "none"}, False),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_METRICS_EXPORTER": "otlp"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
    (
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "none",
        },
        False,
    ),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"}, True),
]


@pytest.mark.parametrize(("environ", "requested"), REQUESTED)
def test_an_export_is_requested_only_by_an_exporter_or_a_collector(
    environ: dict[str, str], requested: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exporter variable other than ``none``, or an OTLP endpoint, asks for an export;
    ``OTEL_SDK_DISABLED=true`` turns everything off; with no request nothing is built."""
    assert export_requested(environ) is requested
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    export = configure_from_environment()
    assert (export is not None) is requested
    if export is not None:
        export.close(0.5)


def test_console_traces_go_to_stderr_with_a_service_name_and_nothing_global(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OTEL_TRACES_EXPORTER=console`` builds the SDK's providers (traces only: no metrics
    variable and no collector), never registered globally; a span is written as JSON on
    stderr by ``close``, stdout untouched; ``service.name`` is ``grid-agent`` unless
    ``OTEL_SERVICE_NAME`` names one."""
    for service, expected in ((None, "grid-agent"), ("plaza-bot", "plaza-bot")):
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
        if service is not None:
            monkeypatch.setenv("OTEL_SERVICE_NAME", service)
        export = configure_from_environment()
        assert export is not None
        assert (export.source, export.meter_provider) == ("environment", None)
        assert dict(export.exporters) == {"traces": ("console",), "metrics": ()}
        assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        assert export.tracer_provider is not None
        export.tracer_provider.get_tracer("t").start_span("one").end()
        assert export.close(2.0) is True
        out, err = capsys.readouterr()
        assert out == ""
        span = json.loads(err)
        assert (span["name"], span["resource"]["attributes"]["service.name"]) == ("one", expected)


def test_a_collector_endpoint_alone_exports_both_signals_by_otlp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` with no exporter variable exports traces and metrics
    over OTLP/HTTP; a signal set to ``none`` stays off."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    export = configure_from_environment()
    assert export is not None
    assert dict(export.exporters) == {"traces": ("otlp",), "metrics": ()}
    assert export.meter_provider is None
    export.close(0.5)  # nothing recorded: nothing sent


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_METRICS_EXPORTER": "console,prometheus"}, "OTEL_METRICS_EXPORTER"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json",
            },
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
    ],
)
def test_what_cannot_be_honoured_is_a_config_error_naming_the_variable(
    environ: dict[str, str], variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown exporter or an OTLP protocol other than HTTP/protobuf is refused before
    anything is built, naming the variable."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        configure_from_environment()
    assert [p.key for p in caught.value.problems] == [variable]


def test_under_an_instrument_that_set_up_nothing_no_provider_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run under ``opentelemetry-instrument`` whose start failed (no global provider), the
    variables it read (and defaulted: gRPC) are never read again to build providers: the
    export holds none, names no exporter, and its close has nothing to do."""
    monkeypatch.setitem(sys.modules, INSTRUMENT_MODULE, types.ModuleType(INSTRUMENT_MODULE))
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")  # what the distro defaults to
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    export = configure_from_environment()
    assert export is not None
    assert (export.tracer_provider, export.meter_provider) == (None, None)
    assert (export.source, dict(export.exporters)) == ("global", {"traces": (), "metrics": ()})
    assert export.close(0.5) is True
