"""``grid-agent run --model-script FILE``: any tools, played by a scripted model, no key.

The script is a JSON array of turns, each ``{"text": ...}`` (the final answer) or
``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}``. The command serves it from the
library's loopback fake endpoint, says the model is scripted, and needs neither a key nor
``--endpoint``: with the sandbox, ``--config``'s ``[mcp.servers]`` and ``--mcp-config``. A
script that runs out ends the session with one line; a bad script is one line, exit 2.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent.cli._model_script import MAX_SCRIPT_BYTES, ModelScript
from tests.cli.conftest import RunCLI, together

if TYPE_CHECKING:
    from pathlib import Path

GOAL = "Look around, then walk to (3, 4)."
SANDBOX_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "look_around", "arguments": {}}]},
    {"tool_calls": [{"name": "move_to", "arguments": {"x": 3, "y": 4}}]},
    {"text": "I looked around and walked to (3, 4)."},
]


def write_script(tmp_path: Path, turns: object, name: str = "script.json") -> Path:
    """The script file ``name`` in ``tmp_path``, holding ``turns`` as JSON."""
    path = tmp_path / name
    path.write_text(json.dumps(turns), encoding="utf-8")
    return path


async def test_run_plays_a_model_script_in_the_sandbox(cli: RunCLI, tmp_path: Path) -> None:
    """No key, no --endpoint: the script's calls run in the sandbox in order, with
    deterministic call ids, its text ends the session, and stderr says the model is scripted
    and which file plays it."""
    script = write_script(tmp_path, SANDBOX_SCRIPT)
    result = await cli("run", "--model-script", str(script), "--goal", GOAL, "--json")
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert data["model"] == "scripted"
    assert data["outcome"] == "completed"
    assert [(c["id"], c["name"], c["status"]) for c in data["calls"]] == [
        ("script-1-1", "look_around", "ok"),
        ("script-2-1", "move_to", "ok"),
    ]
    assert json.loads(data["calls"][1]["arguments"]) == {"x": 3, "y": 4}
    assert data["final_text"] == "I looked around and walked to (3, 4)."
    assert data["world"]["position"] == [3, 4]
    assert "SCRIPTED" in result.stderr
    assert "script.json (3 turns)" in result.stderr
    assert "Traceback" not in result.stderr


async def test_a_scripted_session_is_recorded_and_replays(cli: RunCLI, tmp_path: Path) -> None:
    """With --transcript the scripted session is recorded as scripted (its header names the
    model), and ``replay`` finds the library deciding as it did."""
    script = write_script(tmp_path, SANDBOX_SCRIPT)
    transcript = tmp_path / "session.jsonl"
    result = await cli("run", "--model-script", str(script), "--goal", GOAL,
                       "--transcript", str(transcript), "-q")  # fmt: skip
    assert result.returncode == 0, result.stderr
    header = json.loads(transcript.read_text(encoding="utf-8").splitlines()[0])
    assert header["type"] == "session"
    assert "scripted" in json.dumps(header)
    replayed = await cli("replay", str(transcript))
    assert replayed.returncode == 0, replayed.stderr
    assert "no difference" in replayed.stdout


async def test_a_script_that_runs_out_ends_the_session_with_one_line(
    cli: RunCLI, tmp_path: Path
) -> None:
    """A script with no final text: the session asks for a turn the script does not have and
    ends (exit 1) with one line saying the script ran out after its turns, and how to end
    one; no traceback, nothing recorded as a failure of the built-in endpoint."""
    script = write_script(tmp_path, SANDBOX_SCRIPT[:1])
    result = await cli("run", "--model-script", str(script), "--goal", GOAL)
    assert result.returncode == 1, result.stderr
    ran_out = [line for line in result.stderr.splitlines() if line.startswith("grid-agent: the")]
    assert len(ran_out) == 1, result.stderr
    assert "1 turn" in ran_out[0]
    assert '{"text": ...}' in ran_out[0]
    assert "Traceback" not in result.stderr
    assert "built-in endpoint reported" not in result.stderr


BAD_SCRIPTS: list[tuple[str, bytes, str]] = [
    ("not-json", b"[{", "not JSON"),
    ("not-utf8", b'[{"text": "\xff"}]', "not JSON"),
    ("not-an-array", b'{"text": "hi"}', "a JSON array"),
    ("empty", b"[]", "no turns"),
    ("turn-not-object", b'["hi"]', "turn 1"),
    ("both", b'[{"text": "a", "tool_calls": []}]', "turn 1"),
    ("neither", b"[{}]", "turn 1"),
    ("unknown-key", b'[{"txt": "a"}]', "txt"),
    ("text-not-string", b'[{"text": 3}]', "turn 1"),
    ("no-calls", b'[{"tool_calls": []}]', "turn 1"),
    ("call-without-name", b'[{"tool_calls": [{"arguments": {}}]}]', "name"),
    ("arguments-not-object", b'[{"tool_calls": [{"name": "say", "arguments": [1]}]}]', "arguments"),
    ("call-unknown-key", b'[{"tool_calls": [{"name": "say", "args": {}}]}]', "args"),
    ("deep", b"[" * 100_000 + b"]" * 100_000, "not JSON"),
]


@pytest.mark.slow
async def test_a_bad_script_is_one_line_and_exit_2(cli: RunCLI, tmp_path: Path) -> None:
    """Not JSON, not an array of turns, a turn of the wrong shape, too big, not a regular
    file, missing: each is one line on stderr naming the script's problem, exit 2, before
    any session starts (no traceback)."""
    cases: list[tuple[str, str, str]] = []
    for name, data, expected in BAD_SCRIPTS:
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        cases.append((name, str(path), expected))
    big = tmp_path / "big.json"
    big.write_text(
        json.dumps([{"text": "x" * 1000}] * (MAX_SCRIPT_BYTES // 1000 + 1)), encoding="utf-8"
    )
    cases.append(("big", str(big), f"larger than {MAX_SCRIPT_BYTES} bytes"))
    cases.append(("directory", str(tmp_path), "cannot read"))
    cases.append(("missing", str(tmp_path / "missing.json"), "cannot read"))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cases.append(("fifo", str(fifo), "cannot read"))

    results = await together(
        *(cli("run", "--model-script", path, "--goal", GOAL) for _, path, _ in cases)
    )
    for (name, _, expected), result in zip(cases, results, strict=True):
        assert result.returncode == 2, (name, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (name, result.stderr)
        assert lines[0].startswith("grid-agent run: error: --model-script "), (name, lines)
        assert expected in lines[0], (name, lines[0])


async def test_a_model_script_goes_without_an_endpoint(cli: RunCLI, tmp_path: Path) -> None:
    """--model-script replaces the model: --endpoint or --api-key-env beside it is a usage
    error (exit 2), not a silently ignored option."""
    script = write_script(tmp_path, SANDBOX_SCRIPT)
    results = await together(
        cli("run", "--model-script", str(script), "--goal", GOAL,
            "--endpoint", "http://127.0.0.1:9/v1/chat/completions", "--api-key-env", "K"),
        cli("run", "--model-script", str(script), "--goal", GOAL, "--api-key-env", "K"),
    )  # fmt: skip
    for result in results:
        assert result.returncode == 2, result.stderr
        assert "--model-script" in result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr


def test_the_script_answers_by_the_turns_in_the_history(tmp_path: Path) -> None:
    """The reply depends on the request alone (the assistant turns already in its history),
    so a retried request gets the same turn; ids are ``script-TURN-INDEX``; a request past
    the end is answered with an error and the script notes that it ran out."""
    script = ModelScript.load(str(write_script(tmp_path, SANDBOX_SCRIPT)))
    assert len(script.turns) == 3

    def body(assistant_turns: int) -> bytes:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        messages += [{"role": "assistant", "content": "x"}] * assistant_turns
        return json.dumps({"messages": messages}).encode()

    first = json.loads(script.reply_to(body(0)).body)
    again = json.loads(script.reply_to(body(0)).body)
    assert first == again
    call = first["choices"][0]["message"]["tool_calls"][0]
    assert (call["id"], call["function"]["name"]) == ("script-1-1", "look_around")
    last = json.loads(script.reply_to(body(2)).body)
    assert last["choices"][0]["message"]["content"] == SANDBOX_SCRIPT[2]["text"]
    assert not script.ran_out
    past = script.reply_to(body(3))
    assert past.status >= 400
    assert script.ran_out


def _world_server(log_path: Path) -> dict[str, Any]:
    """The MCP tier's test server over stdio, as a JSON server entry."""
    from tests.mcp.support import ROOT

    return {
        "command": sys.executable,
        "args": ["-m", "tests.mcp.world_server", "stdio", str(log_path)],
        "env": {"PYTHONPATH": str(ROOT)},
    }


MCP_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "look", "arguments": {}}]},
    {"tool_calls": [{"name": "move", "arguments": {"x": 3, "y": 4}}]},
    {"text": "I looked around and walked to (3, 4)."},
]


@pytest.mark.slow
async def test_a_model_script_drives_mcp_servers_of_either_form(
    cli: RunCLI, tmp_path: Path
) -> None:
    """The script drives an MCP server's tools with no key and no --endpoint: the server of
    ``--mcp-config`` (alone), and the ``[mcp.servers]`` of a --config file that has no
    ``[llm]`` table at all; each call reaches the server (its own log says so)."""
    pytest.importorskip("mcp", reason="the MCP tier needs the mcp extra")
    from tests.mcp.support import EventLog

    script = write_script(tmp_path, MCP_SCRIPT)
    json_log, toml_log = EventLog(tmp_path / "json.log"), EventLog(tmp_path / "toml.log")
    mcp_json = tmp_path / "mcp.json"
    mcp_json.write_text(json.dumps({"mcpServers": {"world": _world_server(json_log.path)}}))
    server = _world_server(toml_log.path)
    toml = tmp_path / "agent.toml"
    toml.write_text(
        "[mcp.servers.world]\n"
        f"command = {json.dumps(server['command'])}\n"
        f"args = {json.dumps(server['args'])}\n"
        f"env = {{ PYTHONPATH = {json.dumps(server['env']['PYTHONPATH'])} }}\n",
        encoding="utf-8",
    )
    results = await together(
        cli("run", "--model-script", str(script), "--goal", GOAL, "--mcp-config", str(mcp_json),
            "--json"),
        cli("run", "--model-script", str(script), "--goal", GOAL, "--config", str(toml),
            "--json"),
    )  # fmt: skip
    for result, log in zip(results, (json_log, toml_log), strict=True):
        assert result.returncode == 0, result.stderr
        data = result.json()
        assert (data["model"], data["tools"], data["outcome"]) == ("scripted", "mcp", "completed")
        assert [(c["id"], c["name"]) for c in data["calls"]] == [
            ("script-1-1", "look"),
            ("script-2-1", "move"),
        ]
        assert data["servers"] == {"world": {"look": 1, "move": 1}}
        assert log.starts() == ["look", "move"]
        assert "SCRIPTED" in result.stderr


def test_the_scripted_endpoint_lives_as_long_as_the_session_may(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scripted endpoint is built for the run: it outlives the session's own wall-clock
    bound (an operator may take minutes to approve; the test kit's default is 30 s) and is
    not strict (nothing a session sends is a test failure to raise at its end)."""
    from metacrate_grid_agent.cli import _run, main
    from metacrate_grid_agent.testing import FakeEndpoint

    built: list[dict[str, Any]] = []

    class Recorded(FakeEndpoint):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(_run, "FakeEndpoint", Recorded)
    config = tmp_path / "agent.toml"
    config.write_text("[tool_loop]\nmax_session_s = 3600\n", encoding="utf-8")
    script = write_script(tmp_path, SANDBOX_SCRIPT)
    status = main(["run", "--config", str(config), "--model-script", str(script),
                   "--goal", GOAL, "-q"])  # fmt: skip
    assert status == 0, capsys.readouterr().err
    (kwargs,) = built
    assert kwargs["lifetime_s"] > 3600
    assert kwargs["strict"] is False
