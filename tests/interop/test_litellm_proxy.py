"""A real LiteLLM proxy, reached through its deployment route, which selects the model by URL.

``grid-agent probe`` and a whole ``grid-agent run``, and the library's ``ToolLoop``, talk to
a LiteLLM proxy started by the tests on loopback (see ``conftest.py``): text from its mock
backend, several turns of tool calls and results through its ``openai/`` provider, the
refusals an operator meets on the way (the standard route without a ``model`` member, an
unknown deployment, a wrong path, a wrong key) with their hints, and the key in no output,
the proxy's own included.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import (
    CancelToken,
    Effect,
    LLMClient,
    LLMConfig,
    Outcome,
    Secret,
    SessionGeneration,
    Success,
    Tool,
    ToolLoop,
    ValidatedCall,
)
from metacrate_grid_agent.cli._scripted_model import BAD_MOVE_ID, LOOK_ID, MOVE_ID, SAY_ID
from tests.cli.conftest import KEY_ENV, RunCLI, assert_no_key
from tests.interop.conftest import (
    BACKEND_KEY,
    MOCK_TEXT,
    PROXY_KEY,
    Backend,
    Proxy,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

#: Setup includes the proxy's start (tens of seconds on a busy machine), once per session.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Bound on one child: a proxy hop adds milliseconds, but the machine may be busy.
CHILD_S = 60.0
MODEL_HINT = "the endpoint wants a 'model' member, which this client never sends"
URL_HINT = "endpoint_url is the complete request URL"
#: The scripted session: (name, status) of every call, in order.
SCRIPTED_CALLS = [
    ("look_around", "ok"),
    ("move_to", "rejected"),
    ("move_to", "ok"),
    ("say", "ok"),
]


@pytest.fixture
def quiet_proxy(proxy: Proxy) -> Iterator[Proxy]:
    """The proxy; after the test, its output holds the key in no form."""
    yield proxy
    assert_no_key(proxy.log())


def probe(url: str, *extra: str) -> tuple[str, ...]:
    return ("probe", "--endpoint", url, "--api-key-env", KEY_ENV, "--json", *extra)


def write_config(path: Path, url: str, **tool_loop: int) -> Path:
    lines = ["[llm]", f"endpoint_url = {json.dumps(url)}", f'api_key_env = "{KEY_ENV}"']
    lines += ["max_retries = 0", "", "[tool_loop]"]
    lines += [f"{key} = {value}" for key, value in tool_loop.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- text -------------------------------------------------------------------------------------


async def test_probe_gets_text_through_the_deployment_route(
    cli: RunCLI, quiet_proxy: Proxy
) -> None:
    """``probe`` against the deployment route gets the mock backend's text, exit 0."""
    result = await cli(*probe(quiet_proxy.route("grid-mock")), timeout_s=CHILD_S)
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert (data["outcome"], data["text"], data["tool_calls"]) == ("ok", MOCK_TEXT, [])
    assert data["attempts"] == 1
    assert data["usage"]["total_tokens"] > 0


# --- tools over several turns -----------------------------------------------------------------


async def test_run_completes_a_tool_session_through_the_proxy(
    cli: RunCLI, quiet_proxy: Proxy, backend: Backend, tmp_path: Path
) -> None:
    """A whole ``run`` session crosses the proxy: five turns, four tool calls, one rejected.

    What the proxy sent on shows the round trip held: each request carried the tool results
    under the call ids the model chose, the proxy added the model the URL selected, and the
    client's key stayed at the proxy (the backend got the proxy's own key).
    """
    start = backend.count
    config = write_config(tmp_path / "agent.toml", quiet_proxy.route("grid-scripted"), max_turns=8)
    result = await cli(
        "run", "--config", str(config), "--goal", "Explore and greet.", "--json", timeout_s=CHILD_S
    )
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert (data["model"], data["outcome"], data["turns"]) == ("endpoint", "completed", 5)
    assert [(c["name"], c["status"]) for c in data["calls"]] == SCRIPTED_CALLS
    assert data["world"]["position"] == [19, 23]

    sent = backend.requests_since(start)
    assert len(sent) == 5
    assert {r.header("Authorization") for r in sent} == {f"Bearer {BACKEND_KEY}"}
    assert all(PROXY_KEY.encode() not in r.body for r in sent)
    last = sent[-1].json()
    assert last["model"] == "grid-scripted"
    assert [m["tool_call_id"] for m in last["messages"] if m["role"] == "tool"] == [
        LOOK_ID,
        BAD_MOVE_ID,
        MOVE_ID,
        SAY_ID,
    ]
    assert [t["function"]["name"] for t in last["tools"]][:3] == [
        "look_around",
        "inspect",
        "move_to",
    ]


class _Recorder:
    """A ToolExecutor that records each validated call and answers with a fixed observation."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> Success:
        self.calls.append((call.name, dict(call.arguments)))
        if call.name == "look_around":
            return Success("You see: sign at (4, 6).")
        return Success(f"{call.name} done")


def _tool(name: str, properties: dict[str, Any], effect: Effect) -> Tool:
    return Tool(
        name=name,
        description=f"The {name} action.",
        parameters={
            "type": "object",
            "properties": properties,
            "required": sorted(properties),
            "additionalProperties": False,
        },
        effect=effect,
    )


async def test_tool_loop_runs_tool_calls_through_the_proxy(
    quiet_proxy: Proxy, backend: Backend
) -> None:
    """The library's ToolLoop runs validated calls from replies that crossed the proxy.

    The invalid call never reaches the executor; the valid ones run in order with the
    arguments the model sent, and the session completes with the model's summary.
    """
    coordinate = {"type": "integer", "minimum": 0, "maximum": 63}
    tools = [
        _tool("look_around", {}, Effect.READ_ONLY),
        _tool("move_to", {"x": coordinate, "y": coordinate}, Effect.MUTATING),
        _tool("say", {"text": {"type": "string", "maxLength": 200}}, Effect.MUTATING),
    ]
    executor = _Recorder()
    config = LLMConfig(
        endpoint_url=quiet_proxy.route("grid-scripted"),
        api_key=Secret(PROXY_KEY),
        max_retries=0,
        request_timeout_s=CHILD_S,
    )
    start = backend.count
    async with LLMClient(config) as client:
        loop = ToolLoop(client, tools, executor, system_prompt="Drive the avatar.")
        result = await loop.run("Explore and greet.", generation=SessionGeneration("interop"))
    assert result.outcome is Outcome.COMPLETED, result
    assert [name for name, _ in executor.calls] == ["look_around", "move_to", "say"]
    assert executor.calls[1] == ("move_to", {"x": 4, "y": 5})
    assert result.final_text is not None
    assert backend.count - start == 5


# --- refusals and their hints -----------------------------------------------------------------


async def test_the_standard_route_says_a_model_member_is_wanted(
    cli: RunCLI, quiet_proxy: Proxy
) -> None:
    """LiteLLM's standard route refuses a request without ``model`` (HTTP 400): the hint says
    why and points to the Works-with recipes; nothing is retried."""
    result = await cli(*probe(f"{quiet_proxy.origin}/v1/chat/completions"), timeout_s=CHILD_S)
    assert result.returncode == 1, result.stderr
    data = result.json()
    assert (data["kind"], data["status"], data["retryable"]) == ("http_status", 400, False)
    assert "model=None" in data["message"]
    assert MODEL_HINT in data["message"]
    assert data["attempts"] == 1


async def test_an_unknown_deployment_is_a_400_naming_the_model(
    cli: RunCLI, quiet_proxy: Proxy
) -> None:
    """A deployment name the proxy does not serve is refused with its name, and the hint."""
    result = await cli(*probe(quiet_proxy.route("no-such-model")), timeout_s=CHILD_S)
    assert result.returncode == 1, result.stderr
    data = result.json()
    assert data["status"] == 400
    assert "no-such-model" in data["message"]
    assert MODEL_HINT in data["message"]


@pytest.mark.parametrize(
    ("path", "status"),
    [
        pytest.param("/v1/chat/completion", 404, id="typo-404"),
        pytest.param("/", 405, id="base-url-405"),
    ],
)
async def test_a_wrong_path_says_what_was_sent(
    cli: RunCLI, quiet_proxy: Proxy, path: str, status: int
) -> None:
    """A path the proxy does not serve (a typo, the bare base URL) is a 404 or 405 whose hint
    says endpoint_url is the complete request URL and shows the POST and the URL sent."""
    url = quiet_proxy.origin + path
    result = await cli(*probe(url), timeout_s=CHILD_S)
    assert result.returncode == 1, result.stderr
    data = result.json()
    assert (data["status"], data["retryable"], data["attempts"]) == (status, False, 1)
    assert URL_HINT in data["message"]
    assert f"sent: POST {url})" in data["message"]


async def test_a_wrong_key_is_refused_and_echoed_nowhere(cli: RunCLI, quiet_proxy: Proxy) -> None:
    """A key the proxy does not know is refused (4xx, not retried), and appears in no output:
    not the command's, not the proxy's."""
    wrong = "sk-WRONG-9d8c7b6a5f4e3d2c1b0a"
    result = await cli(
        "probe",
        "--endpoint",
        quiet_proxy.route("grid-mock"),
        "--api-key-env",
        "INTEROP_WRONG_KEY",
        "--json",
        env={"INTEROP_WRONG_KEY": wrong},
        timeout_s=CHILD_S,
    )
    assert result.returncode == 1, result.stderr
    data = result.json()
    assert 400 <= data["status"] < 500
    assert data["attempts"] == 1
    for text in (result.stdout, result.stderr, quiet_proxy.log()):
        assert wrong not in text
        assert wrong[-12:] not in text
