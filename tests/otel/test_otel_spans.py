"""OpenTelemetry: spans made current, every retry of a failed request seen, content that
stays JSON, the conversation id on every span, no invented usage, no span for an unsent
request.

Spans and metrics go to the SDK's in-memory exporter and reader; the sessions run against
the loopback fake endpoint.
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import TYPE_CHECKING, Any

import msgspec
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from metacrate_grid_agent import (
    CancelToken,
    Failure,
    GridAgentError,
    LLMClient,
    LoopEvent,
    SessionGeneration,
    Success,
    SystemMessage,
    ToolDefinition,
    ToolOutcome,
    UserMessage,
    ValidatedCall,
)
from metacrate_grid_agent.otel import GenAITelemetry
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from metacrate_grid_agent.transcript import TranscriptWriter
from tests.llm_transport.loop_support import (
    GOAL,
    SESSION,
    SYSTEM,
    TOOLS,
    RecordingExecutor,
    Step,
    call,
    calls_reply,
    loop_config,
    make_loop,
)
from tests.llm_transport.support import make_config
from tests.otel.test_otel import Telemetry, _by_name, _chats, otel, traced_run

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import pytest
    from opentelemetry.sdk.trace import ReadableSpan

    from metacrate_grid_agent import Completion, Message
    from tests.llm_transport.conftest import ClientFactory

__all__ = ["otel"]


class SpanningExecutor:
    """An executor that opens a span of its own, as an instrumented application would."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Open ``app {call id}`` as the current span around an await."""
        with self.tracer.start_as_current_span(f"app {call.id}"):
            await asyncio.sleep(0)
        return Success(f"{call.name} ok")


class WatchedClient(LLMClient):
    """A client that notes the span current while each request is being made."""

    current: list[trace.Span]

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        **options: Any,
    ) -> Completion:
        """Note the current span, then send as usual."""
        self.current.append(trace.get_current_span())
        return await super().complete(messages, tools, **options)


def _one_call_then_done(request: Any) -> Reply:
    """A model that asks for one call, then answers once it has seen the observation."""
    if b'"role":"tool"' in request.body.replace(b" ", b""):
        return Reply.completion("done")
    return calls_reply(call(f"c{request.index}", "look"))


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


async def test_execute_tool_is_current_in_ten_concurrent_sessions(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """A span the executor opens with ``start_as_current_span`` is a child of its own
    ``execute_tool`` span, in its own session's trace, with ten sessions running at once
    (no context leaks from one session to another)."""
    tracer = otel.tracer_provider.get_tracer("app")
    telemetry = GenAITelemetry(tracer_provider=otel.tracer_provider, meter_provider=None)
    generations = [SessionGeneration(f"s{n}") for n in range(10)]
    async with FakeEndpoint(responder=_one_call_then_done) as endpoint:
        client = client_factory(endpoint.url)
        loop = make_loop(client, SpanningExecutor(tracer))
        runs = [loop.run("walk", generation=g, on_event=telemetry.session(g)) for g in generations]
        results = await asyncio.gather(*runs)
    assert [r.outcome for r in results] == ["completed"] * 10
    spans = otel.finished()
    apps = [s for s in spans if s.name.startswith("app ")]
    assert len(apps) == 10
    by_id = {s.context.span_id: s for s in spans}
    for app in apps:
        parent_id = _parent(app)
        assert parent_id is not None
        tool = by_id[parent_id]
        assert tool.name == "execute_tool look"
        call_id = app.name.removeprefix("app ")
        assert dict(tool.attributes or {})["gen_ai.tool.call.id"] == call_id
        session = by_id[_parent(tool) or 0]
        assert session.name == "invoke_agent grid-agent"
        assert app.context.trace_id == session.context.trace_id
    assert len({s.context.trace_id for s in apps}) == 10


async def test_chat_is_current_around_the_request(otel: Telemetry) -> None:
    """While the client makes a request, the current span is that request's ``chat`` span
    (an HTTP client instrumentation nests under it)."""
    telemetry = GenAITelemetry(tracer_provider=otel.tracer_provider, meter_provider=None)
    async with FakeEndpoint([Reply.completion("done")]) as endpoint:
        client = WatchedClient(make_config(endpoint.url))
        client.current = []
        generation = SessionGeneration(SESSION)
        try:
            result = await make_loop(client, RecordingExecutor()).run(
                "walk", generation=generation, on_event=telemetry.session(generation)
            )
        finally:
            await client.aclose()
    assert result.outcome == "completed"
    (chat,) = _chats(otel.finished())
    assert [s.get_span_context().span_id for s in client.current] == [chat.context.span_id]


async def test_a_request_failing_after_its_retries_shows_every_retry(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """Three 503s with ``max_retries=2``: the ``chat`` span carries a retry event for each
    retried attempt, the retries counter counts them, and the span has the final status."""
    busy = Reply.error(503, "busy", headers=(("Retry-After", "0"),))
    async with FakeEndpoint([busy, busy, busy]) as endpoint:
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
        )
        run = await traced_run(
            telemetry, make_loop(client_factory(endpoint.url, max_retries=2), RecordingExecutor())
        )
    assert run.result.outcome == "http_status"
    (chat,) = _chats(otel.finished())
    assert [e.name for e in chat.events] == ["grid_agent.retry", "grid_agent.retry"]
    assert [dict(e.attributes or {})["http.response.status_code"] for e in chat.events] == [
        503,
        503,
    ]
    attributes = dict(chat.attributes or {})
    assert attributes["http.response.status_code"] == 503
    assert attributes["error.type"] == "http_status"
    assert attributes["grid_agent.request.attempts"] == 3
    assert chat.status.status_code is StatusCode.ERROR
    assert sum(p.value for p in otel.points("grid_agent.request.retries")) == 2


async def test_long_output_messages_stay_json(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """With content on, a reply far past ``max_content_bytes`` still gives an
    ``gen_ai.output.messages`` that parses (each part bounded, then serialised)."""
    big = "x" * 100_000
    async with FakeEndpoint([Reply.completion(big)]) as endpoint:
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider,
            meter_provider=None,
            record_content=True,
            max_content_bytes=256,
        )
        await traced_run(telemetry, make_loop(client_factory(endpoint.url), RecordingExecutor()))
    (chat,) = _chats(otel.finished())
    text = str(dict(chat.attributes or {})["gen_ai.output.messages"])
    (message,) = json.loads(text)
    assert message["role"] == "assistant"
    assert message["parts"][0]["type"] == "text"
    assert message["parts"][0]["content"].startswith("xxx")
    assert len(text.encode()) <= 256


async def test_conversation_id_is_on_every_span(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """``gen_ai.conversation.id`` is on every ``chat`` and ``execute_tool`` span."""
    script = [calls_reply(call("c1", "look")), Reply.completion("done")]
    async with FakeEndpoint(script) as endpoint:
        telemetry = GenAITelemetry(tracer_provider=otel.tracer_provider, meter_provider=None)
        await traced_run(telemetry, make_loop(client_factory(endpoint.url), RecordingExecutor()))
    spans = otel.finished()
    assert sorted(s.name for s in spans) == [
        "chat fake-model", "chat fake-model", "execute_tool look", "invoke_agent grid-agent"
    ]  # fmt: skip
    assert [dict(s.attributes or {}).get("gen_ai.conversation.id") for s in spans] == [SESSION] * 4


async def test_no_usage_reported_leaves_the_token_attributes_out(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """An endpoint that reports no usage: ``invoke_agent`` claims no token counts (not 0)."""
    async with FakeEndpoint([Reply.completion("done")]) as endpoint:
        telemetry = GenAITelemetry(tracer_provider=otel.tracer_provider, meter_provider=None)
        await traced_run(telemetry, make_loop(client_factory(endpoint.url), RecordingExecutor()))
    (root,) = _by_name(otel.finished())["invoke_agent grid-agent"]
    attributes = dict(root.attributes or {})
    assert "gen_ai.usage.input_tokens" not in attributes
    assert "gen_ai.usage.output_tokens" not in attributes


def advancing(generation: SessionGeneration) -> Callable[[LoopEvent], None]:
    """A sink that advances the generation on the first ``tool_result``, as an application
    superseding the run from its own sink would (given beside the tracing sink)."""

    def advance(event: LoopEvent) -> None:
        if event.kind == "tool_result" and generation.current == 0:
            generation.advance()

    return advance


async def test_no_chat_span_for_a_request_never_sent(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """The generation advanced on a ``tool_result``: the next request is never sent, and
    no ``chat`` span is opened for it."""
    script = [calls_reply(call("c1", "look")), Reply.completion("done")]
    async with FakeEndpoint(script) as endpoint:
        telemetry = GenAITelemetry(tracer_provider=otel.tracer_provider, meter_provider=None)
        generation = SessionGeneration(SESSION)
        loop = make_loop(client_factory(endpoint.url), RecordingExecutor())
        result = await loop.run(
            "walk",
            generation=generation,
            on_event=(telemetry.session(generation), advancing(generation)),
        )
        sent = len(endpoint.requests)
    assert result.outcome == "superseded"
    assert sent == 1
    assert len(_chats(otel.finished())) == 1


def test_the_content_switch_follows_the_standard_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` turns content on or off when
    the application did not choose; an explicit ``record_content`` always wins."""
    variable = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    seen = []
    for value, chosen in [(None, None), ("true", None), ("TRUE", None), ("false", None),
                          ("true", False), ("false", True), ("maybe", None)]:  # fmt: skip
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
        telemetry = GenAITelemetry(tracer_provider=None, meter_provider=None, record_content=chosen)
        seen.append(telemetry.record_content)
    assert seen == [False, True, True, False, False, True, False]


def test_the_content_switch_reads_the_latest_values_under_the_stability_opt_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``gen_ai_latest_experimental`` in ``OTEL_SEMCONV_STABILITY_OPT_IN`` the content
    switch takes the latest values, as the GenAI instrumentations read it: ``SPAN_ONLY`` and
    ``SPAN_AND_EVENT`` (any case) put content on spans; ``NO_CONTENT``, ``EVENT_ONLY`` (this
    library emits no log events), ``true`` and anything else leave it off."""
    variable = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    seen = {}
    for opt_in in ("gen_ai_latest_experimental", "http, gen_ai_latest_experimental "):
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
        for value in ("SPAN_ONLY", "span_and_event", "NO_CONTENT", "EVENT_ONLY", "true", ""):
            monkeypatch.setenv(variable, value)
            telemetry = GenAITelemetry(tracer_provider=None, meter_provider=None)
            seen[opt_in, value] = telemetry.record_content
    assert [value for (_, value), on in seen.items() if on] == ["SPAN_ONLY", "span_and_event"] * 2
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http,gen_ai_latest")  # not the value
    monkeypatch.setenv(variable, "SPAN_ONLY")
    assert GenAITelemetry(tracer_provider=None, meter_provider=None).record_content is False
    monkeypatch.setenv(variable, "true")
    assert GenAITelemetry(tracer_provider=None, meter_provider=None).record_content is True


async def test_a_failed_call_is_an_error_and_not_tool_output(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """With content on, a failed call's span has ``error.type`` and status ERROR, and its
    observation is not recorded as ``gen_ai.tool.call.result`` (the tool's output)."""
    script = [calls_reply(call("c1", "look"), call("c2", "look")), Reply.completion("done")]
    async with FakeEndpoint(script) as endpoint:
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider, meter_provider=None, record_content=True
        )
        executor = RecordingExecutor({"c1": Step(outcome=Failure("the fountain is dry"))})
        await traced_run(telemetry, make_loop(client_factory(endpoint.url), executor))
    tools = {
        dict(s.attributes or {})["gen_ai.tool.call.id"]: s
        for s in otel.finished()
        if s.name.startswith("execute_tool")
    }
    failed, ok = dict(tools["c1"].attributes or {}), dict(tools["c2"].attributes or {})
    assert "gen_ai.tool.call.result" not in failed
    assert failed["grid_agent.tool.observation"] == "the fountain is dry"
    assert failed["error.type"] == "tool_failed"
    assert tools["c1"].status.status_code is StatusCode.ERROR
    assert ok["gen_ai.tool.call.result"] == "look ok: {}"
    assert "error.type" not in ok


async def test_input_messages_system_instructions_and_tool_definitions(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """With content on, each ``chat`` span records what was sent: the system instructions,
    the other messages and the tool definitions, as JSON in the conventions' shapes; every
    ``execute_tool`` span has the tool's description (content on or off)."""
    script = [calls_reply(call("c1", "look", {"radius": 2})), Reply.completion("done")]
    async with FakeEndpoint(script) as endpoint:
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider, meter_provider=None, record_content=True
        )
        await traced_run(telemetry, make_loop(client_factory(endpoint.url), RecordingExecutor()))
    first, second = (dict(s.attributes or {}) for s in _chats(otel.finished()))
    assert json.loads(str(first["gen_ai.system_instructions"])) == [
        {"type": "text", "content": SYSTEM}
    ]
    assert json.loads(str(first["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": GOAL}]}
    ]
    definitions = json.loads(str(first["gen_ai.tool.definitions"]))
    assert [(d["type"], d["name"], d["description"]) for d in definitions] == [
        ("function", t.name, t.description) for t in TOOLS
    ]
    assert definitions[0]["parameters"] == dict(TOOLS[0].parameters)
    assert json.loads(str(second["gen_ai.input.messages"]))[1:] == [
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "c1", "name": "look", "arguments": '{"radius": 2}'}
            ],
        },
        {
            "role": "tool",
            "parts": [
                {"type": "tool_call_response", "id": "c1", "response": 'look ok: {"radius": 2}'}
            ],
        },
    ]
    (tool,) = _by_name(otel.finished())["execute_tool look"]
    assert dict(tool.attributes or {})["gen_ai.tool.description"] == TOOLS[0].description


async def test_long_input_messages_stay_json_within_the_bound(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """A goal far past ``max_content_bytes`` still gives input messages that parse, within
    the bound."""
    async with FakeEndpoint([Reply.completion("done")]) as endpoint:
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider,
            meter_provider=None,
            record_content=True,
            max_content_bytes=256,
        )
        await traced_run(
            telemetry,
            make_loop(client_factory(endpoint.url), RecordingExecutor()),
            '"quoted" ' * 10_000,
        )
    (chat,) = _chats(otel.finished())
    for name in ("gen_ai.input.messages", "gen_ai.system_instructions", "gen_ai.tool.definitions"):
        text = str(dict(chat.attributes or {})[name])
        json.loads(text)
        assert len(text.encode()) <= 256
    (message,) = json.loads(str(dict(chat.attributes or {})["gen_ai.input.messages"]))
    assert message["parts"][0]["content"].startswith('"quoted" ')


async def test_response_id_and_model(client_factory: ClientFactory, otel: Telemetry) -> None:
    """The reply's ``id`` and ``model`` are on its ``chat`` span as ``gen_ai.response.id`` and
    ``gen_ai.response.model``."""
    async with FakeEndpoint([Reply.completion("done")]) as endpoint:
        telemetry = GenAITelemetry(tracer_provider=otel.tracer_provider, meter_provider=None)
        await traced_run(telemetry, make_loop(client_factory(endpoint.url), RecordingExecutor()))
    (chat,) = _chats(otel.finished())
    attributes = dict(chat.attributes or {})
    assert (attributes["gen_ai.response.id"], attributes["gen_ai.response.model"]) == (
        "chatcmpl-fake",
        "fake-model",
    )


async def test_chat_span_is_named_after_the_replying_model(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """A ``chat`` span is renamed ``chat {model}`` when the reply names its model (the
    request never does); without one it stays ``chat``. ``invoke_agent`` carries the agent
    name and ``execute_tool`` the tool's, as the conventions name them."""
    script = [
        calls_reply(call("c1", "look")),
        Reply.completion("done", extra_top={"model": None}),
    ]
    async with FakeEndpoint(script) as endpoint:
        telemetry = GenAITelemetry(tracer_provider=otel.tracer_provider, meter_provider=None)
        await traced_run(telemetry, make_loop(client_factory(endpoint.url), RecordingExecutor()))
    spans = sorted(otel.finished(), key=lambda s: s.start_time or 0)
    assert [s.name for s in spans] == [
        "invoke_agent grid-agent", "chat fake-model", "execute_tool look", "chat"
    ]  # fmt: skip
    assert "gen_ai.response.model" not in dict(spans[3].attributes or {})


async def test_provider_name_comes_from_the_configuration(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """``gen_ai.provider.name`` is the configuration's ``provider_name`` on spans and metrics,
    unless the application names one itself."""
    async with FakeEndpoint([Reply.completion("done"), Reply.completion("done")]) as endpoint:
        config = msgspec.structs.replace(make_config(endpoint.url), provider_name="mistral_ai")
        for chosen in (None, "groq"):
            telemetry = GenAITelemetry(
                tracer_provider=otel.tracer_provider,
                meter_provider=otel.meter_provider,
                llm=config,
                provider_name=chosen,
            )
            await traced_run(
                telemetry, make_loop(client_factory(endpoint.url), RecordingExecutor())
            )
    names = [dict(s.attributes or {})["gen_ai.provider.name"] for s in otel.finished()]
    assert names == ["mistral_ai"] * 2 + ["groq"] * 2
    measured = {p.attributes["gen_ai.provider.name"] for p in otel.points(
        "gen_ai.client.operation.duration")}  # fmt: skip
    assert measured == {"mistral_ai", "groq"}


async def test_one_request_outside_a_loop_is_one_chat_span(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """``GenAITelemetry.request`` traces one request sent without a tool loop (``grid-agent
    probe``): a ``chat`` span, current around the request, named after the replying model,
    with the same attributes and metrics as a session's; a request that fails after its
    retries has its retries, final status and ``error.type``; no ``invoke_agent``."""
    script = [Reply.completion("hi", usage=(5, 2))] + [Reply.error(503, "busy")] * 3
    async with FakeEndpoint(script) as endpoint:
        client = client_factory(endpoint.url)
        telemetry = GenAITelemetry(
            tracer_provider=otel.tracer_provider,
            meter_provider=otel.meter_provider,
            llm=make_config(endpoint.url),
        )
        messages: list[Message] = [SystemMessage(content=SYSTEM), UserMessage(content="hi")]
        tools = [ToolDefinition.create(t.name, t.description, t.parameters) for t in TOOLS]
        seen = []
        for _ in range(2):
            with telemetry.request(messages, tools, request_id="probe-1") as traced:
                seen.append(trace.get_current_span().get_span_context().span_id)
                try:
                    traced.reply(await client.complete(messages, tools, request_id="probe-1"))
                except GridAgentError as exc:
                    traced.failed(exc)
    ok, failed = _chats(otel.finished())
    assert [s.name for s in otel.finished()] == ["chat fake-model", "chat"]
    assert seen == [ok.context.span_id, failed.context.span_id]
    assert ok.parent is None
    attributes = dict(ok.attributes or {})
    assert (attributes["gen_ai.usage.input_tokens"], attributes["grid_agent.request.id"]) == (
        5,
        "probe-1",
    )
    assert "gen_ai.conversation.id" not in attributes
    failed_attributes = dict(failed.attributes or {})
    assert failed_attributes["http.response.status_code"] == 503
    assert failed_attributes["error.type"] == "http_status"
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["grid_agent.retry"] * 2
    durations = otel.points("gen_ai.client.operation.duration")
    assert sorted((p.attributes.get("error.type", ""), p.count) for p in durations) == [
        ("", 1),
        ("http_status", 1),
    ]


async def test_tracing_beside_a_transcript_and_a_function_still_nests(
    client_factory: ClientFactory, otel: Telemetry
) -> None:
    """``on_event=(telemetry.session(gen), writer, my_fn)``, with no wrapper: the executor's
    own span is a child of its ``execute_tool`` span, every ``chat`` a child of
    ``invoke_agent``, and the writer and the function get every event too."""
    tracer = otel.tracer_provider.get_tracer("app")
    telemetry = GenAITelemetry(tracer_provider=otel.tracer_provider, meter_provider=None)
    stream = io.StringIO()
    kinds: list[str] = []
    generation = SessionGeneration(SESSION)
    async with FakeEndpoint(responder=_one_call_then_done) as endpoint:
        loop = make_loop(client_factory(endpoint.url), SpanningExecutor(tracer))
        writer = TranscriptWriter(stream)
        writer.begin(
            session_id=SESSION, generation=0, goal="walk", tools=TOOLS, config=loop_config()
        )
        result = await loop.run(
            "walk",
            generation=generation,
            on_event=(telemetry.session(generation), writer, lambda e: kinds.append(e.kind)),
        )
    assert result.outcome == "completed"
    spans = otel.finished()
    by_id = {s.context.span_id: s for s in spans}
    (session,) = _by_name(spans)["invoke_agent grid-agent"]
    (app,) = [s for s in spans if s.name.startswith("app ")]
    assert by_id[_parent(app) or 0].name == "execute_tool look"
    assert {_parent(s) for s in spans if s is not session and s is not app} == {
        session.context.span_id
    }
    assert kinds == ["request", "reply", "tool_call", "tool_result", "request", "reply", "finish"]
    records = [json.loads(line)["type"] for line in stream.getvalue().splitlines()]
    assert records.count("finish") == 1
