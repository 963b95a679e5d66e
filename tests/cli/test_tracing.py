"""``grid-agent run`` traced the standard way: with the ``OTEL_*`` variables (OTLP over HTTP to
a loopback receiver that decodes what it gets), and under ``opentelemetry-instrument``; and
with no such variable, no OpenTelemetry module imported at all.

The receiver decodes each payload with ``opentelemetry-proto``; the command's child gets the
canary key, which must be in no byte the receiver gets. Without the ``otel-test`` group these
tests skip, saying so; with ``GRID_AGENT_OTEL=required`` (as in CI) that is a failure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gzip
import http.server
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from metacrate_grid_agent.cli._scripted_model import respond
from metacrate_grid_agent.cli._tracing import FLUSH_TIMEOUT_S, MAX_EXPORT_WARNINGS, requested
from metacrate_grid_agent.otel import export_requested
from metacrate_grid_agent.testing import FakeEndpoint
from tests.cli.conftest import (
    CANARY,
    CHILD_TIMEOUT_S,
    KEY_ENV,
    CLIResult,
    RunCLI,
    WriteConfig,
    child_env,
    finish_child,
)
from tests.cli.test_run import SCRIPTED_CALLS
from tests.otel.test_otel_export import REQUESTED

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Set to ``required`` to fail, rather than skip, when the OTLP packages are missing.
REQUIRED_ENV = "GRID_AGENT_OTEL"
#: What the receiver tests need: the exporter the command uses, the payloads' definitions.
NEEDED = ("opentelemetry.exporter.otlp.proto.http", "opentelemetry.proto", "opentelemetry.sdk")
#: Bound on one request the receiver reads (a session's spans are a few KiB).
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
#: Every OTEL_* variable of this environment, blanked in the child (it then decides alone).
BLANK_OTEL = {name: "" for name in os.environ if name.startswith("OTEL_")}
GOAL = "Look around and greet whoever is nearby."


def _give_up(reason: str) -> NoReturn:
    if os.environ.get(REQUIRED_ENV) == "required":
        pytest.fail(f"{REQUIRED_ENV}=required, but {reason}", pytrace=False)
    pytest.skip(reason)


def _need_otlp() -> None:
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        _give_up(f"{', '.join(missing)} not installed (the otel-test dependency group)")


@dataclass
class Receiver:
    """A loopback OTLP/HTTP receiver: every POST body kept, by path."""

    port: int = 0
    bodies: dict[str, list[bytes]] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def everything(self) -> bytes:
        return b"".join(b for bodies in self.bodies.values() for b in bodies)


@contextlib.contextmanager
def receiving() -> Iterator[Receiver]:
    """Serve on 127.0.0.1 in a thread for the block; stopped (and joined) after it."""
    received = Receiver()
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 10  # a stuck client never holds the receiver

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, MAX_PAYLOAD_BYTES))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            with lock:
                received.bodies.setdefault(self.path, []).append(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
            """Quiet: the test reads what was received, not a log."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    received.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


#: The OTLP/gRPC services and their methods, as the OTLP/HTTP path each payload would have.
GRPC_PATHS = {
    "opentelemetry.proto.collector.trace.v1.TraceService": "/v1/traces",
    "opentelemetry.proto.collector.metrics.v1.MetricsService": "/v1/metrics",
    "opentelemetry.proto.collector.logs.v1.LogsService": "/v1/logs",
}


@contextlib.contextmanager
def receiving_grpc() -> Iterator[Receiver]:
    """An OTLP/gRPC receiver on 127.0.0.1 for the block: every request's payload kept (as
    bytes, under the OTLP/HTTP path of its signal); stopped (and joined) after it."""
    if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is None:
        _give_up("opentelemetry-exporter-otlp-proto-grpc not installed (the otel-test group)")
    import grpc  # type: ignore[import-untyped]  # no stubs; used through Any here

    received = Receiver()
    lock = threading.Lock()

    def keeper(path: str) -> Any:
        def export(body: bytes, context: Any) -> bytes:
            with lock:
                received.bodies.setdefault(path, []).append(body)
            return b""  # an empty Export*ServiceResponse: everything accepted

        return grpc.unary_unary_rpc_method_handler(export)

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(service, {"Export": keeper(path)})
            for service, path in GRPC_PATHS.items()
        ]
    )
    received.port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield received
    finally:
        server.stop(grace=None).wait(10)


@dataclass(frozen=True)
class Span:
    name: str
    span_id: bytes
    parent: bytes
    trace_id: bytes
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def _spans(bodies: list[bytes]) -> list[Span]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    spans = []
    for body in bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                spans += [
                    Span(
                        s.name,
                        s.span_id,
                        s.parent_span_id,
                        s.trace_id,
                        {a.key: _value(a.value) for a in s.attributes},
                    )
                    for s in scope_spans.spans
                ]
    return spans


def _service_names(bodies: list[bytes]) -> set[str]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    return {
        str(_value(a.value))
        for body in bodies
        for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans
        for a in resource_spans.resource.attributes
        if a.key == "service.name"
    }


def _metric_names(bodies: list[bytes]) -> set[str]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    return {
        metric.name
        for body in bodies
        for resource_metrics in ExportMetricsServiceRequest.FromString(body).resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    }


def check_session_tree(spans: list[Span], *, provider: str) -> None:
    """One trace: ``invoke_agent`` at the root, every ``chat`` and ``execute_tool`` its
    child, one ``execute_tool`` per scripted call; ``provider`` as gen_ai.provider.name."""
    (root,) = [s for s in spans if s.name == "invoke_agent grid-agent"]
    assert root.parent == b""
    assert {s.trace_id for s in spans} == {root.trace_id}
    children = [s for s in spans if s is not root]
    assert {s.parent for s in children} == {root.span_id}
    assert {s.name for s in children if not s.name.startswith("execute_tool")} == {
        "chat fake-model"
    }
    tools = [s for s in children if s.name.startswith("execute_tool")]
    assert sorted(s.name for s in tools) == sorted(f"execute_tool {n}" for n, _ in SCRIPTED_CALLS)
    assert len(children) - len(tools) == len(SCRIPTED_CALLS) + 1  # one reply per call, then done
    assert {s.attributes["gen_ai.provider.name"] for s in spans} == {provider}


async def _child(*argv: str, env: dict[str, str], pycache: Path) -> CLIResult:
    """Run ``argv`` to completion (bounded), its output checked for the key."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(pycache, env),
    )
    # Twice a child's bound: the instrumentation's own start comes first.
    return await finish_child(process, timeout_s=CHILD_TIMEOUT_S * 2)


@pytest.mark.parametrize(("environ", "expected"), REQUESTED)
def test_the_command_asks_for_an_export_by_the_library_rule(
    environ: dict[str, str], expected: bool
) -> None:
    """The command's own check (made before anything of OpenTelemetry is imported) is the
    library's rule, case by case."""
    assert requested(environ) is export_requested(environ) is expected


NO_OTEL_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from metacrate_grid_agent.cli import main
    status = main(sys.argv[1:])
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print(json.dumps({"status": status, "loaded": loaded}), file=sys.stderr)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("otel", [{}, {"OTEL_TRACES_EXPORTER": "none", "OTEL_SERVICE_NAME": "x"}])
def test_without_an_exporter_no_opentelemetry_module_is_imported(
    otel: dict[str, str], tmp_path: Path
) -> None:
    """A whole ``demo`` session with no exporter asked for imports no OpenTelemetry module
    and exports nothing (a child process, its environment stripped of every ``OTEL_*``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(otel)
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", NO_OTEL_SCRIPT, "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report == {"status": 0, "loaded": []}, done.stderr


@pytest.mark.slow
async def test_run_exports_the_session_over_otlp_and_never_the_key(
    cli: RunCLI, write_config: WriteConfig
) -> None:
    """``grid-agent run`` with ``OTEL_EXPORTER_OTLP_ENDPOINT`` (and content capture on) sends
    its spans and metrics to the collector before it exits: the session's span tree, the
    GenAI metrics, ``OTEL_SERVICE_NAME`` as the service; the key is in no byte sent."""
    _need_otlp()
    with receiving() as receiver:
        async with FakeEndpoint(responder=respond) as endpoint:
            config = write_config(endpoint.url, llm={"provider_name": "mistral_ai"})
            env = {
                **BLANK_OTEL,
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                "OTEL_SERVICE_NAME": "plaza-bot",
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
            }
            result = await cli("run", "--config", str(config), "--goal", GOAL, env=env)
    assert result.returncode == 0, result.stderr
    assert "grid-agent: tracing: traces to otlp, metrics to otlp" in result.stderr
    assert sorted(receiver.bodies) == ["/v1/metrics", "/v1/traces"]
    check_session_tree(_spans(receiver.bodies["/v1/traces"]), provider="mistral_ai")
    assert _service_names(receiver.bodies["/v1/traces"]) == {"plaza-bot"}
    assert _metric_names(receiver.bodies["/v1/metrics"]) >= {
        "gen_ai.client.operation.duration",
        "gen_ai.client.token.usage",
        "grid_agent.session.outcomes",
    }
    sent = receiver.everything()
    assert b"gen_ai.input.messages" in sent  # content was on: the check below saw it
    for form in (CANARY, CANARY[-12:], CANARY[:12]):
        assert form.encode() not in sent
    assert os.environ.get(KEY_ENV) != CANARY  # the key reached the child only


def _instrument() -> str:
    """The ``opentelemetry-instrument`` wrapper beside this interpreter (or a skip)."""
    _need_otlp()
    instrument = shutil.which("opentelemetry-instrument", path=str(Path(sys.executable).parent))
    if instrument is None:
        _give_up("opentelemetry-instrument not installed (the otel-test dependency group)")
    return instrument


async def _instrumented(env: dict[str, str], pycache: Path, write_config: WriteConfig) -> CLIResult:
    """``opentelemetry-instrument -- grid-agent run`` as the guide writes it (no
    ``OTEL_EXPORTER_OTLP_PROTOCOL``: the distro's default, gRPC, applies), under ``env``."""
    async with FakeEndpoint(responder=respond) as endpoint:
        # "--" as the guide says: without it the wrapper's own parser takes --config
        # for its --config_file, even after the command.
        config = write_config(endpoint.url, llm={"provider_name": "mistral_ai"})
        command = [_instrument(), "--", sys.executable, "-m", "metacrate_grid_agent", "run"]
        options = ["--config", str(config), "--goal", GOAL]
        return await _child(*command, *options, env={**BLANK_OTEL, **env}, pycache=pycache)


@pytest.mark.slow
async def test_run_under_opentelemetry_instrument_uses_its_providers(
    pycache: Path, write_config: WriteConfig
) -> None:
    """Under ``opentelemetry-instrument`` with only a collector named (the distro's defaults:
    OTLP over gRPC, traces and metrics) the command builds no providers of its own and its
    spans and metrics go where the distro's go."""
    _instrument()
    with receiving_grpc() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "instrumented",
        }
        result = await _instrumented(env, pycache, write_config)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "grid-agent: tracing: traces to global, metrics to global" in result.stderr
    check_session_tree(_spans(receiver.bodies["/v1/traces"]), provider="mistral_ai")
    assert _service_names(receiver.bodies["/v1/traces"]) == {"instrumented"}
    assert "gen_ai.client.operation.duration" in _metric_names(receiver.bodies["/v1/metrics"])
    assert CANARY.encode() not in receiver.everything()


@pytest.mark.slow
async def test_run_under_opentelemetry_instrument_prints_its_console_spans(
    pycache: Path, write_config: WriteConfig
) -> None:
    """The guide's console form under ``opentelemetry-instrument`` (traces to the console,
    no metrics or logs, no protocol variable) runs the session and its spans are printed by
    the distro's console exporter: no traceback, no refusal."""
    env = {
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    }
    result = await _instrumented(env, pycache, write_config)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "grid-agent: tracing: traces to global, metrics to global" in result.stderr
    assert '"name": "invoke_agent grid-agent"' in result.stdout
    assert '"name": "chat fake-model"' in result.stdout


@pytest.mark.slow
async def test_under_an_instrument_that_failed_no_exporter_is_built_from_its_variables(
    pycache: Path, write_config: WriteConfig
) -> None:
    """When ``opentelemetry-instrument`` could not set up its providers (here an exporter it
    does not know; on a machine without the gRPC exporter, its default protocol), the command
    never builds its own from the same variables (which would refuse them and exit 2, asking
    to run under the instrument it runs under): one line says tracing is off, and the session
    runs."""
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "no_such_exporter"}
    result = await _instrumented(env, pycache, write_config)
    assert result.returncode == 0, result.stderr
    assert (
        "grid-agent: tracing: opentelemetry-instrument set up no providers "
        "(its messages above say why): nothing is traced"
    ) in result.stderr
    assert "unknown exporter" not in result.stderr
    assert "session finished: completed" in result.stderr


@pytest.mark.slow
async def test_a_silent_collector_delays_the_exit_by_the_flush_bound_at_most(
    cli: RunCLI, write_config: WriteConfig
) -> None:
    """With a collector that refuses every connection (and an exporter told to retry for
    two minutes), the session still completes and the command exits once its flush bound
    (5 s) has passed, saying that not everything was exported; OpenTelemetry's warnings come
    as the command's own lines, a few at most."""
    _need_otlp()
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with FakeEndpoint(responder=respond) as endpoint:
        config = write_config(endpoint.url)
        env = {
            **BLANK_OTEL,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "120",  # seconds of retries, were it not bounded
        }
        started = time.monotonic()
        result = await cli("run", "--config", str(config), "--goal", GOAL, env=env)
        took_s = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "grid-agent: tracing: not everything was exported within 5 s" in result.stderr
    warnings = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("grid-agent: tracing: ") and "traces to" not in line
    ]
    assert 2 <= len(warnings) <= MAX_EXPORT_WARNINGS + 1  # and "not everything was exported"
    assert took_s < FLUSH_TIMEOUT_S + 10  # start-up and session: about 2 s; unbounded: > 60 s


@pytest.mark.slow
async def test_probe_exports_its_one_request_as_a_chat_span(
    cli: RunCLI, write_config: WriteConfig
) -> None:
    """``grid-agent probe`` traced by the variables sends one ``chat`` span (no session
    around it) and its metrics, before it exits; the key is in no byte sent."""
    _need_otlp()
    with receiving() as receiver:
        async with FakeEndpoint(responder=respond) as endpoint:
            config = write_config(endpoint.url, llm={"provider_name": "mistral_ai"})
            env = {**BLANK_OTEL, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
            result = await cli("probe", "--config", str(config), "--sample-tool", env=env)
    assert result.returncode == 0, result.stderr
    (span,) = _spans(receiver.bodies["/v1/traces"])
    assert (span.name, span.parent) == ("chat fake-model", b"")
    assert span.attributes["gen_ai.provider.name"] == "mistral_ai"
    assert span.attributes["grid_agent.request.id"].startswith("grid-agent-probe")
    assert "gen_ai.client.operation.duration" in _metric_names(receiver.bodies["/v1/metrics"])
    assert CANARY.encode() not in receiver.everything()
