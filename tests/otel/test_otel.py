"""OpenTelemetry: the span tree, attributes and metrics of whole sessions, and no key anywhere.

Spans and metrics go to the SDK's in-memory exporter and reader (a test-only dependency);
the sessions run against the loopback fake endpoint.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from metacrate_grid_agent import Failure, LLMClient, LLMConfig, Secret, SessionGeneration
from metacrate_grid_agent.otel import GenAITelemetry
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    GOAL,
    LONG_STALL_S,
    SESSION,
    FakeSummarizer,
    RecordingExecutor,
    Step,
    call,
    calls_reply,
    loop_config,
    make_loop,
    run_loop,
    start_loop,
)
from tests.llm_transport.support import FAST, make_config

if TYPE_CHECKING:
    from collections.abc import Iterator

    from metacrate_grid_agent import ToolLoop
    from tests.llm_transport.conftest import ClientFactory
    from tests.llm_transport.loop_support import LoopRun


@dataclasses.dataclass
class Telemetry:
    """An SDK tracer and meter provider, each with an in-memory exporter."""

    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self, name: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        assert data is not None
        found: list[Any] = []
        for resource_metrics in data.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    """Fresh providers per test; nothing global is set."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=Resource.create({"service.name": "grid-test"}))
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Telemetry(spans, reader, tracer_provider, meter_provider)
    tracer_provider.shutdown()
    meter_provider.shutdown()


def _chats(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    """The ``chat`` spans (named ``chat {model}`` once a reply names its model), in order."""
    found = [s for s in spans if dict(s.attributes or {}).get("gen_ai.operation.name") == "chat"]
    return sorted(found, key=lambda s: s.start_time or 0)


def _by_name(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


async def traced_run(telemetry: GenAITelemetry, loop: ToolLoop, goal: str = GOAL) -> LoopRun:
    """Run ``loop`` to its end as the session ``SESSION``, its events going to ``telemetry``."""
    generation = SessionGeneration(SESSION)
    return await run_loop(loop, goal, generation=generation, on_event=telemetry.session(generation))


async def test_whole_session_span_tree_and_metrics(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """A session with a retry, a tool failure, a rejected call and a supersession mid-request.

    Protects the documented span tree (one invoke_agent root; a chat span per request, an
    execute_tool span per proposed call, all its children), the GenAI attributes, the retry
    reconstructed as a span event with its delay and source, error.type on every failed span,
    no span left open by the supersession, and the metrics (duration, tokens, counters).
    """
    stalled = dataclasses.replace(Reply.completion("too late"), stall_before_headers_s=LONG_STALL_S)
    script = [
        Reply.error(503, "busy", headers=(("Retry-After", "0"),)),
        calls_reply(call("c1", "look"), call("c2", "move", {"x": -1}), usage=(11, 7)),
        calls_reply(call("c3", "move", {"x": 1, "y": 2}), usage=(13, 5)),
        stalled,
    ]
    async with FakeEndpoint(script) as endpoint:
        client = client_factory(endpoint.url)
        config = make_config(endpoint.url)
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider, llm=config
        )
        executor = RecordingExecutor({"c1": Step(outcome=Failure("the fountain is dry"))})
        generation = SessionGeneration(SESSION)
        handle = start_loop(
            make_loop(client, executor),
            generation=generation,
            on_event=telemetry.session(generation),
        )
        await endpoint.wait_for_request(3)
        generation.advance()
        run = await handle.finish()
    assert run.result.outcome == "superseded"

    spans = otel.finished()
    named = _by_name(spans)
    assert sorted(named) == [
        "chat", "chat fake-model", "execute_tool look", "execute_tool move",
        "invoke_agent grid-agent",
    ]  # fmt: skip
    (root,) = named["invoke_agent grid-agent"]
    assert root.parent is None
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id
               for s in spans if s is not root)  # fmt: skip
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    assert root.kind is SpanKind.INTERNAL
    attributes = dict(root.attributes or {})
    assert attributes["gen_ai.operation.name"] == "invoke_agent"
    assert attributes["gen_ai.conversation.id"] == SESSION
    assert attributes["grid_agent.session.generation"] == 0
    assert attributes["grid_agent.session.outcome"] == "superseded"
    assert attributes["error.type"] == "cancelled"
    assert attributes["grid_agent.end_reason"] == "superseded"
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        24,
        12,
    )
    assert root.status.status_code is StatusCode.ERROR

    chats = _chats(spans)
    assert len(chats) == 3
    first, second, cut = (dict(s.attributes or {}) for s in chats)
    assert all(s.kind is SpanKind.CLIENT for s in chats)
    assert first["gen_ai.operation.name"] == "chat"
    assert first["server.address"] == "127.0.0.1"
    assert first["server.port"] == endpoint.port
    assert first["gen_ai.usage.input_tokens"] == 11
    assert first["gen_ai.usage.output_tokens"] == 7
    assert first["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert first["grid_agent.request.id"] == run.events[0].request_id
    assert first["grid_agent.request.attempts"] == 2
    assert "error.type" not in first
    assert "error.type" not in second
    (retry,) = chats[0].events
    assert retry.name == "grid_agent.retry"
    assert dict(retry.attributes or {}) == {
        "grid_agent.retry.attempt": 1,
        "grid_agent.retry.delay_s": 0.0,
        "grid_agent.retry.delay_source": "retry_after",
        "error.type": "http_status",
        "http.response.status_code": 503,
    }
    assert second["grid_agent.request.attempts"] == 1
    assert cut["error.type"] == "cancelled"
    assert cut["grid_agent.end_reason"] == "superseded"
    assert chats[2].status.status_code is StatusCode.ERROR

    tools = {str(dict(s.attributes or {})["gen_ai.tool.call.id"]): s for s in spans if
             s.name.startswith("execute_tool")}  # fmt: skip
    assert sorted(tools) == ["c1", "c2", "c3"]
    expected = {
        "c1": ("look", "failed", "tool_failed", "read_only"),
        "c2": ("move", "rejected", "tool_rejected", None),
        "c3": ("move", "ok", None, "mutating"),
    }
    for call_id, (name, status, error, effect) in expected.items():
        span_attributes = dict(tools[call_id].attributes or {})
        assert span_attributes["gen_ai.operation.name"] == "execute_tool"
        assert span_attributes["gen_ai.tool.name"] == name
        assert span_attributes["grid_agent.tool.status"] == status
        assert span_attributes.get("error.type") == error
        assert span_attributes.get("grid_agent.tool.effect") == effect
        assert "gen_ai.tool.call.arguments" not in span_attributes  # content is opt-in
        assert "gen_ai.tool.call.result" not in span_attributes

    durations = otel.points("gen_ai.client.operation.duration")
    by_operation: dict[tuple[str, str], int] = {}
    for point in durations:
        key = (point.attributes["gen_ai.operation.name"], point.attributes.get("error.type", ""))
        by_operation[key] = by_operation.get(key, 0) + point.count
    assert by_operation == {
        ("chat", ""): 2,
        ("chat", "cancelled"): 1,
        ("execute_tool", ""): 1,
        ("execute_tool", "tool_failed"): 1,
        ("invoke_agent", "cancelled"): 1,
    }
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in otel.points(
        "gen_ai.client.token.usage")}  # fmt: skip
    assert tokens == {"input": 24, "output": 12}
    outcomes = otel.points("grid_agent.session.outcomes")
    assert [(p.attributes["grid_agent.session.outcome"], p.value) for p in outcomes] == [
        ("superseded", 1)
    ]
    assert [p.value for p in otel.points("grid_agent.request.retries")] == [1]
    assert [p.value for p in otel.points("grid_agent.tool.rejected_calls")] == [1]
    assert otel.points("grid_agent.tool.ambiguous_mutations") == []


async def test_cut_mid_tool_ends_the_tool_span_as_ambiguous(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """A supersession while a mutating call runs ends its span (ambiguous) and counts it."""
    import asyncio

    gate = asyncio.Event()
    async with FakeEndpoint([calls_reply(call("c1", "move", {"x": 1, "y": 2}))]) as endpoint:
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
        )
        executor = RecordingExecutor({"c1": Step(gate=gate)})
        generation = SessionGeneration(SESSION)
        handle = start_loop(
            make_loop(client_factory(endpoint.url), executor),
            generation=generation,
            on_event=telemetry.session(generation),
        )
        await executor.wait_for_call(0)
        generation.advance()
        run = await handle.finish()
    assert run.result.outcome == "superseded"
    named = _by_name(otel.finished())
    (tool,) = named["execute_tool move"]
    attributes = dict(tool.attributes or {})
    assert attributes["grid_agent.tool.status"] == "ambiguous"
    assert attributes["error.type"] == "ambiguous_mutation"
    # The loop reports the cut call's record before it finishes: the tool span ends with
    # that record, and the session span says why the session ended.
    (session,) = named["invoke_agent grid-agent"]
    assert dict(session.attributes or {})["grid_agent.end_reason"] == "superseded"
    assert [p.value for p in otel.points("grid_agent.tool.ambiguous_mutations")] == [1]


async def test_compaction_event_and_a_request_that_fails_for_good(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """Compaction is an event on the session span; a request that fails for good ends its
    chat span with the error's stable kind as error.type, and so does the session."""
    script = [*(calls_reply(call(f"c{n}", "look")) for n in range(1, 4)), Reply.error(400, "no")]
    async with FakeEndpoint(script) as endpoint:
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
        )
        generation = SessionGeneration(SESSION)
        run = await run_loop(
            make_loop(
                client_factory(endpoint.url, max_retries=0),
                RecordingExecutor(),
                config=loop_config(max_history_messages=6, keep_recent_messages=2),
                summarizer=FakeSummarizer(),
            ),
            generation=generation,
            on_event=telemetry.session(generation),
        )
    assert run.result.outcome == "http_status"
    assert run.result.compactions > 0
    named = _by_name(otel.finished())
    (root,) = named["invoke_agent grid-agent"]
    compactions = [e for e in root.events if e.name == "grid_agent.compaction"]
    assert len(compactions) == run.result.compactions
    assert dict(root.attributes or {})["error.type"] == "http_status"
    chats = _chats(otel.finished())
    assert len(chats) == 4
    failed = dict(chats[-1].attributes or {})
    assert (failed["error.type"], failed["grid_agent.request.attempts"]) == ("http_status", 1)
    assert chats[-1].status.status_code is StatusCode.ERROR
    errors = [
        p.attributes.get("error.type")
        for p in otel.points("gen_ai.client.operation.duration")
        if p.attributes["gen_ai.operation.name"] == "chat"
    ]
    assert sorted(map(str, errors)) == ["None", "http_status"]


#: A key no redaction pattern recognises: only the configured secret can hide it.
HEX_CANARY = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def _every_text(spans: list[ReadableSpan], telemetry: Telemetry) -> str:
    pieces: list[str] = []
    for span in spans:
        pieces.append(span.name)
        pieces.append(json.dumps(dict(span.attributes or {}), default=str))
        pieces.append(json.dumps(dict(span.resource.attributes), default=str))
        pieces.append(str(span.status.description))
        for event in span.events:
            pieces += [event.name, json.dumps(dict(event.attributes or {}), default=str)]
    data = telemetry.metrics.get_metrics_data()
    pieces.append(data.to_json() if data is not None else "")
    return "\n".join(pieces)


async def test_the_key_is_in_no_attribute_event_or_resource_even_with_content(
    otel: Telemetry,
) -> None:
    """With content opted in, an endpoint and an executor echoing the key leak it nowhere.

    The key is 64 hex digits, a shape no credential pattern matches, so only the redaction
    of the configured key can hide it. Content is recorded (so redaction is what hides it).
    """
    echo = f"your key is {HEX_CANARY}!"
    script = [
        calls_reply(
            call("c1", "look", {"radius": 1}),
            call("c2", "move", json.dumps({"x": HEX_CANARY})),
            text=echo,
        ),
        Reply.completion(echo, finish_reason=HEX_CANARY),
    ]
    async with FakeEndpoint(script) as endpoint:
        config = LLMConfig(endpoint_url=endpoint.url, api_key=Secret(HEX_CANARY), **FAST)
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider,
            meter_provider=otel.meter_provider,
            llm=config,
            record_content=True,
        )
        executor = RecordingExecutor({"c1": Step(outcome=Failure(echo * 3))})
        async with LLMClient(config) as client:
            run = await traced_run(telemetry, make_loop(client, executor))
    assert run.result.outcome == "completed"
    spans = otel.finished()
    text = _every_text(spans, otel)
    assert HEX_CANARY not in text.lower()
    assert HEX_CANARY[:16] not in text.lower()
    # Content was recorded: the redaction, not the absence of content, hid the key.
    assert "your key is [REDACTED]!" in text
    tools = [s for s in spans if s.name == "execute_tool look"]
    # c1 failed: its observation is kept, but not as the tool's output.
    assert "[REDACTED]" in str(dict(tools[0].attributes or {})["grid_agent.tool.observation"])


@pytest.mark.parametrize("mark", ["\u00ad", "\u034f", "\ufe0f", "\u180e"], ids=ascii)
async def test_a_key_interleaved_with_invisible_characters_is_in_no_recorded_content(
    otel: Telemetry, mark: str
) -> None:
    """A reply and an observation that hide the key behind characters a reader does not see
    (a soft hyphen, a grapheme joiner, a variation selector, a Mongolian vowel separator)
    are recorded redacted."""
    echo = f"your key is {mark.join(HEX_CANARY)}!"
    script = [calls_reply(call("c1", "look", {"radius": 1}), text=echo), Reply.completion(echo)]
    async with FakeEndpoint(script) as endpoint:
        config = LLMConfig(endpoint_url=endpoint.url, api_key=Secret(HEX_CANARY), **FAST)
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider,
            meter_provider=otel.meter_provider,
            llm=config,
            record_content=True,
        )
        executor = RecordingExecutor({"c1": Step(outcome=Failure(echo))})
        async with LLMClient(config) as client:
            run = await traced_run(telemetry, make_loop(client, executor))
    assert run.result.outcome == "completed"
    text = _every_text(otel.finished(), otel)
    solid = text.replace(mark, "").replace(json.dumps(mark)[1:-1], "").lower()
    assert HEX_CANARY[:12] not in solid
    assert HEX_CANARY[-12:] not in solid
    assert "your key is [REDACTED]!" in text


async def test_content_is_bounded_when_recorded(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """An opted-in observation or reply far past ``max_content_bytes`` is cut to it."""
    big = "x" * 100_000
    async with FakeEndpoint([calls_reply(call("c1", "look")), Reply.completion(big)]) as endpoint:
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider,
            meter_provider=None,
            record_content=True,
            max_content_bytes=256,
        )
        executor = RecordingExecutor({"c1": Step(outcome=Failure(big))})
        await traced_run(telemetry, make_loop(client_factory(endpoint.url), executor))
    for span in otel.finished():
        for value in (span.attributes or {}).values():
            assert len(str(value).encode()) <= 256


async def test_from_global_reads_the_global_providers_and_sets_nothing(
    client_factory: ClientFactory,
) -> None:
    """``from_global`` uses whatever is registered (here nothing: the API's no-ops), and a
    session traced through it runs as without it."""
    from opentelemetry import metrics, trace

    before = (trace.get_tracer_provider(), metrics.get_meter_provider())
    telemetry = GenAITelemetry.from_global()
    async with FakeEndpoint([Reply.completion("done")]) as endpoint:
        run = await traced_run(
            telemetry, make_loop(client_factory(endpoint.url), RecordingExecutor())
        )
    assert run.result.outcome == "completed"
    assert (trace.get_tracer_provider(), metrics.get_meter_provider()) == before


def test_nothing_global_is_set() -> None:
    """Building telemetry from explicit providers leaves the global providers untouched."""
    from opentelemetry import metrics, trace

    before = (trace.get_tracer_provider(), metrics.get_meter_provider())
    GenAITelemetry(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    assert (trace.get_tracer_provider(), metrics.get_meter_provider()) == before
