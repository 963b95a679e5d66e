"""The reference check: every emitted ``gen_ai.*`` (and other standard) attribute name, the
well-known values, every metric name and unit against the installed
``opentelemetry-semantic-conventions`` package, whose version the guide names.

A name that is not in the conventions must carry our own ``grid_agent.`` prefix.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry.semconv._incubating.attributes import (
    error_attributes,
    gen_ai_attributes,
    http_attributes,
    server_attributes,
)
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.semconv.attributes import (
    error_attributes as stable_error,
)
from opentelemetry.semconv.attributes import (
    http_attributes as stable_http,
)
from opentelemetry.semconv.attributes import (
    server_attributes as stable_server,
)

from metacrate_grid_agent import Failure, SessionGeneration
from metacrate_grid_agent.otel import GenAITelemetry
from metacrate_grid_agent.otel._telemetry import CONVENTIONS_VERSION
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    SESSION,
    RecordingExecutor,
    Step,
    call,
    calls_reply,
    make_loop,
    run_loop,
)
from tests.otel.test_otel import Telemetry, otel

if TYPE_CHECKING:
    from types import ModuleType

    from tests.llm_transport.conftest import ClientFactory

__all__ = ["otel"]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "tracing.md"
OWN_PREFIX = "grid_agent."


def _names(*modules: ModuleType) -> set[str]:
    return {v for m in modules for k, v in vars(m).items() if k.isupper() and isinstance(v, str)}


KNOWN = _names(
    gen_ai_attributes,
    server_attributes,
    error_attributes,
    http_attributes,
    stable_server,
    stable_error,
    stable_http,
)


class _Recorder:
    """A stand-in meter: records what each semconv ``create_*`` helper asks for."""

    def create_histogram(self, **options: Any) -> dict[str, Any]:
        return options


def test_the_documented_conventions_version_is_the_installed_one() -> None:
    """The guide names the conventions version the names are checked against, and it is the
    installed one (a change of version shows here first)."""
    installed = importlib.metadata.version("opentelemetry-semantic-conventions")
    assert installed == CONVENTIONS_VERSION
    assert f"opentelemetry-semantic-conventions {CONVENTIONS_VERSION}" in GUIDE.read_text("utf-8")


async def test_every_emitted_name_value_metric_and_unit_is_in_the_conventions(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """A session with a retry, a failed, a rejected and a successful call, content on, then
    a request failing after its retries: every name emitted is a conventions name (or ours,
    prefixed), the operation, token-type and provider values are the conventions', and the
    GenAI metrics have the conventions' names and units."""
    busy = Reply.error(503, "busy", headers=(("Retry-After", "0"),))
    script = [
        busy,
        calls_reply(call("c1", "look"), call("c2", "move", {"x": -1}), usage=(11, 7)),
        calls_reply(call("c3", "move", {"x": 1, "y": 2}), usage=(13, 5)),
        busy,
        busy,
        busy,
    ]
    async with FakeEndpoint(script) as endpoint:
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider,
            meter_provider=otel.meter_provider,
            record_content=True,
        )
        generation = SessionGeneration(SESSION)
        run = await run_loop(
            make_loop(
                client_factory(endpoint.url, max_retries=2),
                RecordingExecutor({"c1": Step(outcome=Failure("dry"))}),
            ),
            generation=generation,
            on_event=telemetry.session(generation),
        )
    assert run.result.outcome == "http_status"

    emitted: dict[str, set[Any]] = {}
    for span in otel.finished():
        for key, value in (span.attributes or {}).items():
            emitted.setdefault(key, set()).add(value if isinstance(value, (str, int)) else None)
        for event in span.events:
            for key in event.attributes or {}:
                emitted.setdefault(key, set())
    data = otel.metrics.get_metrics_data()
    assert data is not None
    metrics = {
        metric.name: metric
        for resource_metrics in data.resource_metrics
        for scope in resource_metrics.scope_metrics
        for metric in scope.metrics
    }
    for metric in metrics.values():
        for point in metric.data.data_points:
            for key, value in (point.attributes or {}).items():
                emitted.setdefault(key, set()).add(value)

    unknown = sorted(k for k in emitted if k not in KNOWN and not k.startswith(OWN_PREFIX))
    assert unknown == []
    for expected in ("gen_ai.input.messages", "gen_ai.output.messages",
                     "gen_ai.system_instructions", "gen_ai.tool.definitions",
                     "gen_ai.tool.description", "gen_ai.conversation.id",
                     "gen_ai.response.id", "gen_ai.response.model",
                     "http.response.status_code", "error.type"):  # fmt: skip
        assert expected in emitted, expected
    operations = {v.value for v in gen_ai_attributes.GenAiOperationNameValues}
    assert emitted["gen_ai.operation.name"] <= operations
    tokens = {v.value for v in gen_ai_attributes.GenAiTokenTypeValues}
    assert emitted["gen_ai.token.type"] <= tokens
    providers = {v.value for v in gen_ai_attributes.GenAiProviderNameValues}
    assert emitted["gen_ai.provider.name"] <= providers

    recorder: Any = _Recorder()
    specs: list[Any] = [
        gen_ai_metrics.create_gen_ai_client_operation_duration(recorder),
        gen_ai_metrics.create_gen_ai_client_token_usage(recorder),
    ]
    reference = {(spec["name"], spec["unit"]) for spec in specs}
    ours = {(m.name, m.unit) for m in metrics.values() if m.name.startswith("gen_ai.")}
    assert ours == reference
    assert all(m.startswith(("gen_ai.", OWN_PREFIX)) for m in metrics)
