"""Fixtures of the interop tier: a real LiteLLM proxy on loopback, started as a child process.

The proxy (dependency group ``interop``) serves two deployments, reached through its Azure-style
deployment route ``/openai/deployments/<model>/chat/completions?api-version=...``, the route
that selects the model by URL:

- ``grid-mock``: LiteLLM's built-in mock backend (``mock_response``), a fixed text reply;
- ``grid-scripted``: LiteLLM's ``openai/`` provider forwarding to a loopback
  :class:`~metacrate_grid_agent.testing.FakeEndpoint` that plays the scripted model, so a
  real proxy carries several turns of tool calls and tool results, and the tests can see what
  the proxy sent on (the mock backend answers every request with the same reply, so it
  cannot take a tool loop to its end).

The proxy's master key is the CLI suite's canary; every test checks that it appears nowhere in
the proxy's own output either. Everything stays on 127.0.0.1: the model cost map is the one
packaged with LiteLLM, usage telemetry stays off (it has no destination unless one is set),
and proxy variables are dropped from the child's environment.

Without the group the tier is skipped with the reason (with ``GRID_AGENT_INTEROP=required``,
as in CI, that is a failure too); a proxy that is installed but does not start is a failure.
"""

from __future__ import annotations

import asyncio
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pytest

from metacrate_grid_agent.cli._scripted_model import respond
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest
from tests.cli.conftest import CANARY, cli, pycache  # noqa: F401  (fixtures reused here)

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator

#: The proxy's console script, installed beside this interpreter by the ``interop`` group.
LITELLM = Path(sys.executable).with_name("litellm")
#: Set to ``required`` to fail, rather than skip, when the proxy is not installed.
REQUIRED_ENV = "GRID_AGENT_INTEROP"
#: The proxy's master key: the key the client sends (and the canary the tests look for).
PROXY_KEY = CANARY
#: The key the proxy sends to the scripted backend (never the client's key).
BACKEND_KEY = "sk-backend-of-the-proxy-0000"
#: The text of the mock deployment.
MOCK_TEXT = "Hello from the LiteLLM mock backend."
API_VERSION = "2024-10-21"
#: Bound on the proxy's start (about 18 s on a busy two-core machine, mostly imports).
START_DEADLINE_S = 150.0
#: Starts tried when the chosen port was taken before the proxy bound it.
START_ATTEMPTS = 3
#: Bound on the proxy's exit after SIGTERM before it is killed.
STOP_GRACE_S = 10.0
#: Bound on the scripted backend's whole life (the session) and on one step of its thread.
BACKEND_LIFETIME_S = 1800.0
THREAD_STEP_S = 10.0
#: Variables the proxy child never inherits: proxies, credentials, LiteLLM's own settings.
_DROPPED = ("LITELLM", "OPENAI", "AZURE", "ANTHROPIC", "GRID_AGENT", "DATABASE_URL")
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")

T = TypeVar("T")


def _missing_reason() -> str | None:
    if importlib.util.find_spec("litellm") is None or not LITELLM.exists():
        return (
            "the LiteLLM proxy is not installed: install the interop group with "
            "`uv sync --locked --group interop` to run this tier"
        )
    return None


def _give_up(reason: str) -> NoReturn:
    """Skip the tier, or fail it when it is required (CI)."""
    if os.environ.get(REQUIRED_ENV) == "required":
        pytest.fail(f"{REQUIRED_ENV}=required, but {reason}", pytrace=False)
    pytest.skip(reason)


class _LoopThread:
    """An event loop in a daemon thread: the backend outlives each test's own loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(THREAD_STEP_S)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(THREAD_STEP_S)
        self.loop.close()


@dataclass
class Backend:
    """The scripted model behind the proxy, and what the proxy sent it."""

    endpoint: FakeEndpoint

    @property
    def origin(self) -> str:
        return self.endpoint.origin

    def requests_since(self, start: int) -> list[RecordedRequest]:
        """Requests received after the first ``start`` ones."""
        return list(self.endpoint.requests[start:])

    @property
    def count(self) -> int:
        return len(self.endpoint.requests)


@dataclass
class Proxy:
    """A running LiteLLM proxy: its origin, and its stdout and stderr so far."""

    origin: str
    log_path: Path

    def route(self, model: str) -> str:
        """The deployment route that selects ``model`` by URL."""
        return (
            f"{self.origin}/openai/deployments/{model}/chat/completions?api-version={API_VERSION}"
        )

    def log(self) -> str:
        return self.log_path.read_text("utf-8", errors="replace")


@pytest.fixture(scope="session")
def backend() -> Iterator[Backend]:
    """The scripted model on a loopback FakeEndpoint, served from its own thread."""
    reason = _missing_reason()
    if reason is not None:
        _give_up(reason)
    thread = _LoopThread()

    async def start() -> FakeEndpoint:
        return await FakeEndpoint(
            responder=respond, lifetime_s=BACKEND_LIFETIME_S, strict=False
        ).start()

    endpoint = thread.run(start())
    try:
        yield Backend(endpoint)
    finally:
        thread.run(endpoint.aclose())
        thread.close()
    assert endpoint.failures == [], endpoint.failures


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _config(backend: Backend) -> dict[str, Any]:
    """The proxy's configuration (JSON is YAML too)."""
    return {
        "model_list": [
            {
                "model_name": "grid-mock",
                "litellm_params": {
                    "model": "openai/grid-mock",
                    "mock_response": MOCK_TEXT,
                    "api_key": "unused",
                },
            },
            {
                "model_name": "grid-scripted",
                "litellm_params": {
                    "model": "openai/grid-scripted",
                    "api_base": f"{backend.origin}/v1",
                    "api_key": BACKEND_KEY,
                },
            },
        ],
        # The client's own retries are under test, not the proxy's.
        "litellm_settings": {"num_retries": 0, "request_timeout": 30},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }


def _proxy_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith(_DROPPED) and k.lower() not in _PROXY_VARS
    }
    env.update(
        {
            "LITELLM_MASTER_KEY": PROXY_KEY,
            # The packaged model cost map: no download at start.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_DISABLE_BUG_REPORT_LINK": "true",
            "DISABLE_ADMIN_UI": "True",
            "NO_DOCS": "True",
            "NO_PROXY": "127.0.0.1,localhost",
            "PYTHONUNBUFFERED": "1",
            "HOME": str(home),
            "XDG_CACHE_HOME": str(home / "cache"),
        }
    )
    return env


def _ready(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        connection.request("GET", "/health/liveliness")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after a grace period (the proxy is one process: no workers)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_GRACE_S)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text("utf-8", errors="replace").splitlines()[-lines:])


def _start(config: Path, folder: Path, attempt: int) -> tuple[subprocess.Popen[bytes], Proxy, bool]:
    """Start the proxy on a free port; wait until it is ready, exits, or the deadline passes."""
    port = _free_port()
    log_path = folder / f"proxy-{attempt}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603  (our own console script, fixed arguments)
            [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            env=_proxy_env(folder),
        )
    deadline = time.monotonic() + START_DEADLINE_S
    while not (ready := _ready(port)):
        if process.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return process, Proxy(f"http://127.0.0.1:{port}", log_path), ready


@pytest.fixture(scope="session")
def proxy(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """A LiteLLM proxy on a free loopback port, ready, and stopped at the end of the session.

    The port is free when chosen; if another process takes it before the proxy binds it, the
    proxy is started again on another one.
    """
    folder = tmp_path_factory.mktemp("litellm")
    config = folder / "config.yaml"
    config.write_text(json.dumps(_config(backend), indent=2), encoding="utf-8")
    for attempt in range(1, START_ATTEMPTS + 1):
        process, started, ready = _start(config, folder, attempt)
        try:
            if ready:
                yield started
                return
            if process.poll() is None:
                reason = f"the LiteLLM proxy was not ready within {START_DEADLINE_S} s"
            else:
                reason = f"the LiteLLM proxy exited with {process.returncode}"
            if "address already in use" not in started.log().lower():
                break
        finally:
            _stop(process)
    pytest.fail(f"{reason}:\n{_tail(started.log_path)}", pytrace=False)
