"""What the event sinks cost: tracing (OpenTelemetry) and the transcript, off and on.

Without a sink there is nothing to measure by construction: ``ToolLoop.run`` calls a no-op
``on_event`` and the library never imports OpenTelemetry. This script shows it and prices
each sink when it is on, two ways:

1. the sinks alone, fed the events of a recorded two-turn session (precise: no I/O);
2. whole two-turn sessions against the loopback benchmark server (in its own process), CPU
   time of this process per session, with no sink and with each sink.

Run: ``uv run --locked python -m benchmarks.bench_sinks [--sessions N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from benchmarks._server import serve
from metacrate_grid_agent import (
    Effect,
    LLMClient,
    LLMConfig,
    LoopEvent,
    Secret,
    SessionGeneration,
    Success,
    Tool,
    ToolLoop,
    ToolLoopConfig,
    ValidatedCall,
)
from metacrate_grid_agent.otel import GenAITelemetry
from metacrate_grid_agent.transcript import TranscriptWriter

MOVE = Tool(
    name="move_to",
    description="Walk to (x, y).",
    parameters={
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
    },
    effect=Effect.MUTATING,
)
Sink = Callable[[LoopEvent], None]


class _Executor:
    async def execute(self, call: ValidatedCall, cancel: Any) -> Success:
        return Success("You walked.")


def _sdk(*, record_content: bool = False) -> GenAITelemetry:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return GenAITelemetry(
        tracer_provider=tracer_provider, meter_provider=meters, record_content=record_content
    )


def _api_only() -> GenAITelemetry:
    # The API with no SDK: what an operator gets who installs the extra but configures
    # nothing and still passes a sink (spans are non-recording, instruments no-ops).
    from opentelemetry import metrics  # noqa: PLC0415

    return GenAITelemetry(
        tracer_provider=trace.NoOpTracerProvider(), meter_provider=metrics.NoOpMeterProvider()
    )


def _sinks() -> dict[str, Callable[[SessionGeneration], Sink | None]]:
    sdk, api, content = _sdk(), _api_only(), _sdk(record_content=True)
    return {
        "no sink (on_event=None)": lambda g: None,
        "otel, API only (no-op providers)": api.session,
        "otel, SDK + in-memory exporter": sdk.session,
        "otel, SDK, record_content": content.session,
        "transcript to memory": lambda g: TranscriptWriter(io.StringIO()),
    }


async def _session(loop: ToolLoop, sink: Sink | None, number: int) -> list[LoopEvent]:
    events: list[LoopEvent] = []
    generation = SessionGeneration(f"bench-{number}")
    # The sink beside a recorder, as an application composes them (each scope entered).
    sinks = None if sink is None else (sink, events.append)
    await loop.run("walk", generation=generation, on_event=sinks)
    return events


async def _record_events(url: str) -> list[LoopEvent]:
    config = LLMConfig(endpoint_url=url, api_key=Secret("bench-key-0000"), max_retries=0)
    async with LLMClient(config) as client:
        loop = ToolLoop(client, [MOVE], _Executor(), config=ToolLoopConfig())
        events: list[LoopEvent] = []
        await loop.run("walk", generation=SessionGeneration("bench"), on_event=events.append)
    return events


def _sinks_alone(events: list[LoopEvent], repeats: int) -> None:
    print(f"1. sinks alone, one {len(events)}-event session ({repeats} sessions each)")
    for name, make in _sinks().items():
        samples = []
        for _ in range(5):
            started = time.perf_counter()
            for number in range(repeats):
                sink = make(SessionGeneration(f"s{number}"))
                if sink is not None:
                    for event in events:
                        sink(event)
            samples.append((time.perf_counter() - started) / repeats)
        best = min(samples) * 1e6
        print(f"   {name:<36} {best:8.1f} µs per session")


async def _whole(url: str, sessions: int) -> None:
    print(f"2. whole sessions on loopback ({sessions} each, CPU of this process)")
    config = LLMConfig(endpoint_url=url, api_key=Secret("bench-key-0000"), max_retries=0)
    baseline = None
    async with LLMClient(config) as client:
        loop = ToolLoop(client, [MOVE], _Executor(), config=ToolLoopConfig())
        for _ in range(20):  # warm up the connection pool and caches
            await _session(loop, None, 0)
        for name, make in _sinks().items():
            samples = []
            for _ in range(3):
                started = time.process_time()
                for number in range(sessions):
                    await _session(loop, make(SessionGeneration(f"s{number}")), number)
                samples.append((time.process_time() - started) / sessions)
            cpu = statistics.median(samples) * 1e6
            baseline = baseline or cpu
            print(f"   {name:<36} {cpu:8.0f} µs CPU per session  ({cpu / baseline:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=300)
    args = parser.parse_args()
    with serve() as origin:
        url = origin + "/v1/chat/completions"
        events = asyncio.run(_record_events(url))
        _sinks_alone(events, 2000)
        asyncio.run(_whole(url, args.sessions))


if __name__ == "__main__":
    main()
