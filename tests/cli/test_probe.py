"""``grid-agent probe``: one real request through LLMClient, reported as text or one JSON object.

Each test runs the command as a child process against the loopback fake endpoint started in
the test's own event loop, and checks the exit status, the output shape, what the fake
recorded, and that the key (a canary) never appears in stdout or stderr.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent.errors import error_kinds
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import CANARY, KEY_ENV, RunCLI, WriteConfig, assert_no_key, together

if TYPE_CHECKING:
    from pathlib import Path

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(64))
OK_KEYS = {
    "outcome",
    "text",
    "tool_calls",
    "finish_reason",
    "usage",
    "attempts",
    "latency_ms",
    "request_id",
    "supports",
}
ERROR_KEYS = {
    "outcome",
    "kind",
    "retryable",
    "status",
    "error_type",
    "error_code",
    "attempts",
    "latency_ms",
    "request_id",
    "message",
    "supports",
}
#: Fast failure settings: no retries, so each failure is one attempt.
NO_RETRY = {"max_retries": 0}


def probe_args(url: str, *extra: str) -> tuple[str, ...]:
    return ("probe", "--endpoint", url, "--api-key-env", KEY_ENV, *extra)


def closed_port() -> int:
    """A loopback port with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- success ----------------------------------------------------------------------------------


async def test_text_reply_json_shape_and_request(cli: RunCLI) -> None:
    """A text reply gives exactly the documented JSON object, exit 0, and the key in the header.

    Protects the --json contract (members and types), the default prompt, and that the key
    travels from the environment variable to the Authorization header only.
    """
    async with FakeEndpoint([Reply.completion("Hello there.", usage=(5, 3))]) as ep:
        result = await cli(*probe_args(ep.url, "--json"))
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert set(data) == OK_KEYS
    assert isinstance(data["latency_ms"], int)
    assert data["latency_ms"] >= 0
    del data["latency_ms"]
    assert data == {
        "outcome": "ok",
        "text": "Hello there.",
        "tool_calls": [],
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        "attempts": 1,
        "request_id": "grid-agent-probe-1",
        "supports": {"text": "yes", "tool_calls": "not_asked", "images": "not_asked"},
    }
    (request,) = ep.requests
    assert request.header("Authorization") == f"Bearer {CANARY}"
    assert request.header("X-Request-Id") == "grid-agent-probe-1"
    body = request.json()
    assert body["messages"] == [{"role": "user", "content": "Reply with one short sentence."}]
    assert "tools" not in body


async def test_sample_tool_call_reported_with_raw_arguments(cli: RunCLI) -> None:
    """--sample-tool offers get_time (empty-object schema); the call comes back verbatim."""
    reply = Reply.completion(None, tool_calls=[("call_7", "get_time", '{ "tz" : "UTC" }')])
    async with FakeEndpoint([reply]) as ep:
        result = await cli(*probe_args(ep.url, "--sample-tool", "--json"))
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert data["text"] is None
    assert data["usage"] is None
    assert data["tool_calls"] == [
        {"id": "call_7", "name": "get_time", "arguments": '{ "tz" : "UTC" }'}
    ]
    (tool,) = ep.requests[0].json()["tools"]
    assert tool["type"] == "function"
    assert tool["function"]["name"] == "get_time"
    assert tool["function"]["parameters"]["type"] == "object"
    assert tool["function"]["parameters"]["properties"] == {}


async def test_tools_file_offered_as_given(cli: RunCLI, tmp_path: Path) -> None:
    """A --tools file in the standard envelope reaches the endpoint unchanged, with --prompt."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a word up.",
                "parameters": {
                    "type": "object",
                    "properties": {"word": {"type": "string"}},
                    "required": ["word"],
                },
            },
        },
        {"type": "function", "function": {"name": "noop"}},
    ]
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools), encoding="utf-8")
    reply = Reply.completion("Sure.", tool_calls=[("c1", "lookup", '{"word":"grid"}')])
    async with FakeEndpoint([reply]) as ep:
        result = await cli(*probe_args(ep.url, "--tools", str(path), "--prompt", "Hi", "--json"))
    assert result.returncode == 0, result.stderr
    assert result.json()["tool_calls"][0]["arguments"] == '{"word":"grid"}'
    body = ep.requests[0].json()
    assert [t["function"]["name"] for t in body["tools"]] == ["lookup", "noop"]
    assert body["tools"][0] == tools[0]
    assert body["messages"][0]["content"] == "Hi"


async def test_image_sent_as_data_url_and_human_report(cli: RunCLI, tmp_path: Path) -> None:
    """--image sends a data:image/png;base64 part next to the prompt; the report says so.

    Also protects the default (human) report: status, attempts, usage, text and the three
    support lines.
    """
    image = tmp_path / "shot.bin"  # the type comes from the magic bytes, not the name
    image.write_bytes(PNG)
    async with FakeEndpoint([Reply.completion("A tiny picture.", usage=(9, 4))]) as ep:
        result = await cli(*probe_args(ep.url, "--image", str(image)))
    assert result.returncode == 0, result.stderr
    content = ep.requests[0].json()["messages"][0]["content"]
    assert content[0] == {"type": "text", "text": "Reply with one short sentence."}
    assert content[1]["type"] == "image_url"
    url = content[1]["image_url"]["url"]
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    assert base64.b64decode(url[len(prefix) :]) == PNG
    out = result.stdout
    assert "status:      ok" in out
    assert "attempts:    1" in out
    assert "usage:       prompt 9, completion 4, total 13" in out
    assert "text:        A tiny picture." in out
    assert "  text:        yes" in out
    assert "  tool calls:  not asked" in out
    assert "  images:      accepted" in out


# --- failures: one kind each, exit status 1 ---------------------------------------------------


def _stalled() -> list[Reply]:
    return [dataclasses.replace(Reply.completion("late"), stall_before_headers_s=10.0)]


@dataclasses.dataclass(frozen=True)
class Failure:
    kind: str
    script: Callable[[], list[Reply]]
    llm: dict[str, Any]
    status: int | None = None
    attempts: int = 1
    retryable: bool = False


FAILURES = [
    Failure("http_status", lambda: [Reply.error(400, "bad request")], NO_RETRY, status=400),
    Failure(
        "http_status",
        lambda: [Reply.error(503, "busy"), Reply.error(503, "still busy")],
        {"max_retries": 1, "max_retry_delay_s": 0.01},
        status=503,
        attempts=2,
        retryable=True,
    ),
    Failure(
        "redirect_refused",
        lambda: [Reply.redirect(307, "https://elsewhere.example/v1/chat/completions")],
        NO_RETRY,
        status=307,
    ),
    Failure(
        "malformed_json",
        lambda: [Reply(body=b'{"choices": [', headers=(("Content-Type", "application/json"),))],
        NO_RETRY,
    ),
    Failure("empty_choices", lambda: [Reply.json({"choices": []})], NO_RETRY),
    Failure("missing_member", lambda: [Reply.json({"object": "chat.completion"})], NO_RETRY),
    Failure(
        "duplicate_call_id",
        lambda: [Reply.completion(tool_calls=[("c1", "a", "{}"), ("c1", "b", "{}")])],
        NO_RETRY,
    ),
    Failure(
        "response_too_large",
        lambda: [Reply.completion("x" * 5000)],
        {"max_retries": 0, "max_response_bytes": 1024},
    ),
    Failure(
        "content_encoding",
        lambda: [Reply.completion("hi", headers=[("Content-Encoding", "gzip")])],
        NO_RETRY,
    ),
    Failure(
        "response_idle_timeout",
        _stalled,
        {"max_retries": 0, "response_idle_timeout_s": 0.3},
        retryable=True,
    ),
]


@pytest.mark.slow
async def test_failures_report_kind_and_exit_1(cli: RunCLI, write_config: WriteConfig) -> None:
    """Each endpoint or response failure is reported with the library's kind, and exit 1.

    One child per kind, each against its own fake endpoint, run side by side (one per core at a
    time; a failing case stops the others). Protects the failure JSON (every member, a bounded
    message, status only for HTTP), the attempts count after retries, and that no error path
    prints the key.
    """

    async def check(case: Failure) -> str | None:
        async with FakeEndpoint(case.script()) as ep:
            config = write_config(ep.url, llm=case.llm)
            result = await cli("probe", "--config", str(config), "--json")
        data = result.json()
        expected = {
            "returncode": 1,
            "keys": ERROR_KEYS,
            "kind": case.kind,
            "status": case.status,
            "attempts": case.attempts,
            "retryable": case.retryable,
            "request_id": "grid-agent-probe-1",
            "requests seen": case.attempts,
            "message bounded": True,
            "latency is int": True,
        }
        actual = {
            "returncode": result.returncode,
            "keys": set(data),
            "kind": data.get("kind"),
            "status": data.get("status"),
            "attempts": data.get("attempts"),
            "retryable": data.get("retryable"),
            "request_id": data.get("request_id"),
            "requests seen": len(ep.requests),
            "message bounded": 0 < len(data.get("message", "")) <= 500,
            "latency is int": isinstance(data.get("latency_ms"), int),
        }
        return None if expected == actual else f"{case.kind}: {expected} != {actual}"

    assert {f.kind for f in FAILURES} <= set(error_kinds())
    problems = await together(*(check(case) for case in FAILURES))
    assert [p for p in problems if p is not None] == []


async def test_connect_failure_on_closed_port(cli: RunCLI, write_config: WriteConfig) -> None:
    """Nothing listening: kind "connect", retryable, no status, exit 1."""
    config = write_config(f"http://127.0.0.1:{closed_port()}/v1/chat/completions", llm=NO_RETRY)
    result = await cli("probe", "--config", str(config), "--json")
    assert result.returncode == 1
    data = result.json()
    assert (data["kind"], data["status"], data["retryable"]) == ("connect", None, True)
    assert data["attempts"] == 1


async def test_human_failure_report(cli: RunCLI, write_config: WriteConfig) -> None:
    """Without --json a failure is a readable report on stdout: kind, status, message."""
    async with FakeEndpoint([Reply.error(404, "no such model")]) as ep:
        result = await cli("probe", "--config", str(write_config(ep.url, llm=NO_RETRY)))
    assert result.returncode == 1
    assert "status:      error (http_status, HTTP 404, not retryable)" in result.stdout
    assert "no such model" in result.stdout


# --- the key stays out of every output -------------------------------------------------------


async def test_key_echoed_by_endpoint_is_redacted_even_verbose(cli: RunCLI) -> None:
    """An endpoint that echoes the key in its error body never gets it printed.

    --verbose turns the library's logging on (stderr); the key appears in neither stream.
    """
    echo = Reply.error(401, f"invalid api key {CANARY} (Bearer {CANARY})")
    async with FakeEndpoint([echo]) as ep:
        result = await cli(*probe_args(ep.url, "--json", "--verbose"))
    assert result.returncode == 1
    data = result.json()
    assert data["status"] == 401
    assert "[REDACTED]" in data["message"]
    assert "attempt 1" in result.stderr  # the library's log line reached stderr


async def test_verbose_success_logs_without_key(cli: RunCLI) -> None:
    """--verbose on success: log lines on stderr, the human report on stdout, no key."""
    async with FakeEndpoint([Reply.completion("fine")]) as ep:
        result = await cli(*probe_args(ep.url, "--verbose"))
    assert result.returncode == 0
    assert "metacrate_grid_agent" in result.stderr
    assert "grid-agent-probe-1" in result.stderr
    assert "status:      ok" in result.stdout


@pytest.mark.slow
async def test_key_on_command_line_is_refused_and_not_echoed(cli: RunCLI) -> None:
    """There is no --api-key flag (not even as an abbreviation); the value is not echoed."""
    results = await together(
        cli("probe", "--api-key", CANARY),
        cli("probe", f"--api-key={CANARY}"),
        cli(CANARY),
    )
    for result in results:
        assert result.returncode == 2
        assert result.stdout == ""
        assert_no_key(result.stderr)


# --- usage and configuration errors: exit 2 --------------------------------------------------


@pytest.mark.slow
async def test_insecure_http_endpoint_is_a_configuration_error(cli: RunCLI) -> None:
    """http to a non-loopback host without --allow-insecure-http: configuration, exit 2.

    Nothing is sent (the check happens before any connection).
    """
    url = "http://llm.example.com/v1/chat/completions"
    result, text = await together(cli(*probe_args(url, "--json")), cli(*probe_args(url)))
    assert result.returncode == 2
    data = result.json()
    assert set(data) == ERROR_KEYS - {"supports"}  # nothing was sent: nothing is known
    assert data["kind"] == "configuration"
    assert data["attempts"] == 0
    assert "cleartext http" in data["message"]
    assert text.returncode == 2
    assert text.stdout == ""
    assert "cleartext http" in text.stderr


CONFIG_ERRORS = {
    "name the endpoint": ("probe",),
    "--api-key-env NAME": ("probe", "--endpoint", "http://127.0.0.1:9/v1"),
    "NO_SUCH_VAR_X": (
        "probe",
        "--endpoint",
        "http://127.0.0.1:9/v1",
        "--api-key-env",
        "NO_SUCH_VAR_X",
    ),
    "not the key itself": (
        "probe",
        "--endpoint",
        "http://127.0.0.1:9/v1",
        "--api-key-env",
        "sk-pasted-key",
    ),
    "scheme": probe_args("ftp://127.0.0.1/v1"),
    "cannot read": ("probe", "--config", "/nonexistent/grid-agent.toml"),
    "go with --endpoint": ("probe", "--config", "x.toml", "--api-key-env", KEY_ENV),
}


@pytest.mark.slow
async def test_configuration_errors_exit_2_with_json(cli: RunCLI) -> None:
    """Every configuration or usage problem exits 2; with --json it is one error object.

    Covers: no endpoint, --endpoint without --api-key-env, an unset variable, a key pasted
    where the variable name goes (refused without echoing it), a bad scheme, an unreadable
    config, and flags that only go with --endpoint.
    """
    cases = list(CONFIG_ERRORS.items())
    results = await together(*(cli(*args, "--json") for _, args in cases))
    for (fragment, args), result in zip(cases, results, strict=True):
        assert result.returncode == 2, (args, result.stderr)
        data = result.json()
        assert (data["outcome"], data["kind"]) == ("error", "configuration"), args
        assert fragment in data["message"], (args, data["message"])
    assert "sk-pasted-key" not in results[3].stdout


async def test_invalid_config_file_lists_problems(cli: RunCLI, write_config: WriteConfig) -> None:
    """A config with several bad values: exit 2, every problem named in the message."""
    config = write_config("https://x.example/v1", llm={"max_retries": 99, "colour": "blue"})
    result = await cli("probe", "--config", str(config))
    assert result.returncode == 2
    assert "llm.max_retries" in result.stderr
    assert "llm.colour" in result.stderr


TOOLS_FILE_ERRORS = {
    "not valid JSON": b"not json",
    "non-empty JSON array": b"[]",
    "[0].function": b'[{"type": "function", "function": {"name": "bad name!"}}]',
    "unknown member": b'[{"type": "tool", "function": {"name": "a", "strict": true}}]',
    '"function"': b'[{"type": "tool", "function": {"name": "a"}}]',
    "parameters": b'[{"type": "function", "function": {"name": "a", "parameters": []}}]',
    "appears twice": b'[{"type": "function", "function": {"name": "a"}}] '.replace(
        b"}}]", b'}}, {"type": "function", "function": {"name": "a"}}]'
    ),
    "larger than": b" " * (256 * 1024 + 1),
}


@pytest.mark.parametrize(
    ("fragment", "content"), TOOLS_FILE_ERRORS.items(), ids=list(TOOLS_FILE_ERRORS)
)
def test_tools_file_problems_are_named(tmp_path: Path, fragment: str, content: bytes) -> None:
    """In-process: each kind of bad --tools file is refused with a message naming it."""
    from metacrate_grid_agent.cli._common import UsageError
    from metacrate_grid_agent.cli._probe import load_tools_file

    path = tmp_path / "tools.json"
    path.write_bytes(content)
    with pytest.raises(UsageError) as caught:
        load_tools_file(str(path))
    assert fragment in str(caught.value)


async def test_invalid_tools_file_exits_2(cli: RunCLI, tmp_path: Path) -> None:
    """A bad --tools file is a usage error: exit 2, the configuration-kind JSON, no request."""
    path = tmp_path / "tools.json"
    path.write_bytes(TOOLS_FILE_ERRORS["unknown member"])
    result = await cli(*probe_args("http://127.0.0.1:9/v1", "--tools", str(path), "--json"))
    assert result.returncode == 2
    data = result.json()
    assert (data["kind"], data["attempts"]) == ("configuration", 0)
    assert "[0].function.strict: unknown member" in data["message"]
    assert '[0].type: must be "function"' in data["message"]


async def test_image_that_is_not_an_image_exits_2(cli: RunCLI, tmp_path: Path) -> None:
    """--image sniffs the magic bytes: a text file is refused (exit 2) before any request."""
    path = tmp_path / "fake.png"
    path.write_bytes(b"hello, not a picture")
    result = await cli(*probe_args("http://127.0.0.1:9/v1", "--image", str(path)))
    assert result.returncode == 2
    assert "not a PNG, JPEG, GIF or WebP" in result.stderr


@pytest.mark.slow
async def test_argparse_errors_exit_2(cli: RunCLI) -> None:
    """Unknown flags and both --config and --endpoint are argparse errors: exit 2, no stdout."""
    results = await together(
        cli("probe", "--no-such-flag"),
        cli("probe", "--config", "a.toml", "--endpoint", "http://127.0.0.1:9/"),
        cli(),
    )
    for result in results:
        assert result.returncode == 2
        assert result.stdout == ""
        assert "usage:" in result.stderr


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (PNG, "png"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "jpeg"),
        (b"GIF89a\x01\x00", "gif"),
        (b"GIF87a\x01\x00", "gif"),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "webp"),
        (b"RIFF\x24\x00\x00\x00WAVEfmt ", None),
        (b"<svg xmlns=", None),
        (b"", None),
    ],
)
def test_image_type_is_sniffed_from_magic_bytes(data: bytes, kind: str | None) -> None:
    """In-process: --image decides the data-URL type from the content, never the file name."""
    from metacrate_grid_agent.cli._probe import sniff_image

    assert sniff_image(data) == kind


# --- complete outputs: supports, finish reason, the endpoint's error type and code ------------


@pytest.mark.slow
async def test_a_reply_without_a_tool_call_does_not_prove_tools_unsupported(cli: RunCLI) -> None:
    """Tools offered, text back: "not shown", never "no"; the finish reason is reported."""
    reply = Reply.completion("I cannot tell the time.", finish_reason="stop")
    async with FakeEndpoint([reply, reply]) as ep:
        data, text = await together(
            cli(*probe_args(ep.url, "--sample-tool", "--json")),
            cli(*probe_args(ep.url, "--sample-tool")),
        )
    assert (data.returncode, text.returncode) == (0, 0)
    report = data.json()
    assert report["supports"] == {"text": "yes", "tool_calls": "not_shown", "images": "not_asked"}
    assert report["finish_reason"] == "stop"
    assert "  tool calls:  not shown (tools were offered and this reply called none" in text.stdout
    assert "finish:      stop" in text.stdout


@pytest.mark.slow
async def test_an_image_refused_by_the_server_says_so(
    cli: RunCLI, write_config: WriteConfig, tmp_path: Path
) -> None:
    """--image answered by an HTTP 500: "images refused (HTTP 500 ...)", not "unknown"."""
    image = tmp_path / "shot.png"
    image.write_bytes(PNG)
    refused = Reply.error(
        500, "image input is not supported", type="server_error", code="no_vision"
    )
    async with FakeEndpoint([refused, refused]) as ep:
        config = write_config(ep.url, llm=NO_RETRY)
        args = ("probe", "--config", str(config), "--image", str(image))
        data, text = await together(cli(*args, "--json"), cli(*args))
    assert (data.returncode, text.returncode) == (1, 1)
    report = data.json()
    assert report["supports"]["images"] == "refused"
    assert (report["error_type"], report["error_code"]) == ("server_error", "no_vision")
    assert "  images:      refused (HTTP 500: " in text.stdout
    assert "image input is not supported" in text.stdout


@pytest.mark.slow
async def test_retryable_is_not_claimed_once_the_retries_are_spent(
    cli: RunCLI, write_config: WriteConfig
) -> None:
    """503 on every attempt: the report says the retries are spent, never "(retryable)"."""
    busy = [Reply.error(503, "busy")] * 4
    async with FakeEndpoint(busy) as ep:
        config = write_config(ep.url, llm={"max_retries": 1, "max_retry_delay_s": 0.01})
        data, text = await together(
            cli("probe", "--config", str(config), "--json"), cli("probe", "--config", str(config))
        )
    assert (data.returncode, text.returncode) == (1, 1)
    assert "(retryable)" not in data.json()["message"]
    assert "(retryable)" not in text.stdout
    assert "status:      error (http_status, HTTP 503, retries spent)" in text.stdout
    assert "attempts:    2" in text.stdout
