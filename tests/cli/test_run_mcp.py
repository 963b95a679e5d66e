"""``grid-agent run`` and ``tools`` with ``[mcp.servers.NAME]``: the servers' tools, not the
sandbox's, with approval, transcript and summary naming the server of each call.

The MCP server is the MCP tier's test server (``tests/mcp/world_server.py``) over stdio; the
model is the test's fake endpoint, which asks for ``look`` (read-only), then ``move``
(mutating: the server gives no read-only hint), then finishes. Needs the ``mcp`` extra.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("mcp", reason="the MCP tier needs the mcp extra")

from metacrate_grid_agent.cli import main
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import (
    CHILD_TIMEOUT_S,
    KEY_ENV,
    RunCLI,
    assert_no_key,
)
from tests.cli.test_approve import QUESTION, on_a_terminal, read_until
from tests.mcp.support import ROOT, EventLog

if TYPE_CHECKING:
    from pathlib import Path

GOAL = "Look around, then walk to (3, 4)."


def script() -> list[Reply]:
    """The model's side: look, move, then a summary."""
    return [
        Reply.completion(tool_calls=[("c1", "w_look", "{}")]),
        Reply.completion(tool_calls=[("c2", "w_move", json.dumps({"x": 3, "y": 4}))]),
        Reply.completion("I looked around and walked to (3, 4)."),
    ]


def mcp_config(tmp_path: Path, url: str, log: EventLog) -> Path:
    """agent.toml with the endpoint and the world server over stdio (prefix ``w_``)."""
    path = tmp_path / "agent.toml"
    path.write_text(
        f"""
[llm]
endpoint_url = "{url}"
api_key_env = "{KEY_ENV}"

[mcp.servers.world]
command = {json.dumps(sys.executable)}
args = ["-m", "tests.mcp.world_server", "stdio", {json.dumps(str(log.path))}]
env = {{ PYTHONPATH = {json.dumps(str(ROOT))} }}
tool_prefix = "w_"
effects = {{ say = "read_only" }}
""",
        encoding="utf-8",
    )
    return path


@pytest.mark.slow
async def test_run_drives_the_configured_mcp_server(cli: RunCLI, tmp_path: Path) -> None:
    """With a server configured the model is offered its tools and none of the sandbox's;
    each call reaches the server; stderr says where the tools come from; the summary counts
    calls by server, and the transcript records each tool's server, which the report names."""
    log = EventLog(tmp_path / "events.log")
    transcript = tmp_path / "session.jsonl"
    async with FakeEndpoint(script()) as ep:
        config = mcp_config(tmp_path, ep.url, log)
        text = await cli("run", "--config", str(config), "--goal", GOAL,
                         "--transcript", str(transcript))  # fmt: skip
    assert text.returncode == 0, text.stderr
    offered = [t["function"]["name"] for t in ep.requests[0].json()["tools"]]
    assert {"w_look", "w_move"} <= set(offered)
    assert "look_around" not in offered
    assert log.starts() == ["look", "move"]
    assert "grid-agent: tools: " in text.stderr
    assert "from MCP servers world (stdio," in text.stderr
    assert "grid-agent: MCP server world: tool w_bad_schema left out: " in text.stderr
    assert "calls by MCP server:\n  world: 2 call(s) (w_look 1, w_move 1)" in text.stdout
    assert "sandbox" not in text.stdout
    header = json.loads(transcript.read_text("utf-8").splitlines()[0])
    assert header["labels"]["tools"] == "mcp"
    servers = {t["name"]: t["server"] for t in header["tools"]}
    assert (servers["w_look"], servers["w_move"]) == ("world", "world")
    shown = await cli("report", str(transcript), "--json")
    assert shown.returncode == 0, shown.stderr
    calls = [e for e in shown.json()["timeline"] if e["type"] == "tool_call"]
    assert [(e["tool"], e["server"]) for e in calls] == [("w_look", "world"), ("w_move", "world")]


@pytest.mark.slow
async def test_run_json_lists_calls_by_server(cli: RunCLI, tmp_path: Path) -> None:
    """``--json``: the calls by server, and no sandbox world."""
    log = EventLog(tmp_path / "events.log")
    async with FakeEndpoint(script()) as ep:
        config = mcp_config(tmp_path, ep.url, log)
        result = await cli("run", "--config", str(config), "--goal", GOAL, "--json")
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert (data["tools"], data["servers"]) == ("mcp", {"world": {"w_look": 1, "w_move": 1}})
    assert "world" not in data


async def test_without_servers_the_output_says_the_sandbox_runs(cli: RunCLI) -> None:
    """No [mcp.servers]: the sandbox, as before, and one line says so."""
    result = await cli("demo")
    assert result.returncode == 0, result.stderr
    assert "grid-agent: tools: the built-in sandbox region" in result.stderr


@pytest.mark.slow
async def test_approve_asks_before_a_mutating_mcp_call_naming_server_and_tool(
    pycache: Path, tmp_path: Path
) -> None:
    """--approve on a terminal: the read-only look runs unasked; the move is asked about,
    the question names the server and the tool, and a refusal keeps it from the server."""
    log = EventLog(tmp_path / "events.log")
    async with FakeEndpoint(script()) as ep:
        config = mcp_config(tmp_path, ep.url, log)
        args = ("run", "--config", str(config), "--goal", GOAL, "--approve", "--json")
        async with on_a_terminal(pycache, *args) as (child, tty):
            assert child.stderr is not None
            seen: list[str] = []
            await read_until(child.stderr, QUESTION, seen)
            os.write(tty, b"n not now\n")
            async with asyncio.timeout(CHILD_TIMEOUT_S):
                out, rest = await child.communicate()
    err = "".join(seen) + rest.decode()
    assert_no_key(out.decode(), err)
    assert child.returncode == 0, err
    assert "  MCP server:  world" in err
    assert "  tool:        w_move (mutating)" in err
    assert log.starts() == ["look"]
    data = json.loads(out.decode())
    assert [(c["name"], c["status"]) for c in data["calls"]] == [
        ("w_look", "ok"),
        ("w_move", "denied"),
    ]


def test_tools_lists_each_tool_with_its_effect_why_and_approval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``grid-agent tools`` starts the server and lists its tools: effect and why (the
    server's hint, or the configuration's override), whether approval is asked, and the
    tools left out with the reason; ``--json`` gives the same. No tool is called."""
    log = EventLog(tmp_path / "events.log")
    config = str(mcp_config(tmp_path, "https://llm.example.com/v1/chat/completions", log))
    monkeypatch.setenv(KEY_ENV, "unused-key-for-the-listing")
    assert main(["tools", config, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(["tools", "--config", config]) == 0
    text = capsys.readouterr().out
    world = data["servers"]["world"]
    by_name = {t["name"]: t for t in world["tools"]}
    assert by_name["w_look"] == {
        "name": "w_look", "effect": "read_only", "why": "the server's readOnlyHint: true",
        "approval": False,
    }  # fmt: skip
    assert (by_name["w_move"]["effect"], by_name["w_move"]["approval"]) == ("mutating", True)
    assert by_name["w_say"]["why"] == "override in [mcp.servers.world] effects"
    assert {s["name"] for s in world["skipped"]} >= {"w_bad_schema", "w_remote_ref"}
    assert log.starts() == []
    assert "world (stdio): " in text
    look = next(line.split() for line in text.splitlines() if "w_look" in line)
    assert look[:4] == ["w_look", "read_only", "runs", "unasked"]
    assert "left out: w_bad_schema" in text


def test_tools_reads_an_mcp_servers_json_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tools --mcp-config FILE`` alone (no model configuration needed to list tools) starts
    the servers of a Claude Desktop style file and lists their tools."""
    log = EventLog(tmp_path / "events.log")
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"world": {
        "command": sys.executable,
        "args": ["-m", "tests.mcp.world_server", "stdio", str(log.path)],
        "env": {"PYTHONPATH": str(ROOT)},
    }}}), encoding="utf-8")  # fmt: skip
    assert main(["tools", "--mcp-config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [t["name"] for t in data["servers"]["world"]["tools"]]
    assert {"look", "move"} <= set(names)


def test_tools_lists_a_configuration_with_no_llm_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tools agent.toml`` with only ``[mcp.servers]`` (the file ``run --model-script``
    takes) lists the servers' tools: listing sends no request, so no ``[llm]`` is needed."""
    log = EventLog(tmp_path / "events.log")
    path = tmp_path / "agent.toml"
    path.write_text(
        f"""
[mcp.servers.world]
command = {json.dumps(sys.executable)}
args = ["-m", "tests.mcp.world_server", "stdio", {json.dumps(str(log.path))}]
env = {{ PYTHONPATH = {json.dumps(str(ROOT))} }}
""",
        encoding="utf-8",
    )
    assert main(["tools", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"look", "move"} <= {t["name"] for t in data["servers"]["world"]["tools"]}
    assert log.starts() == []


def test_allow_and_block_tools_filter_what_is_offered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``allow_tools`` keeps only the tools it names, ``block_tools`` drops the ones it names
    (by their names on the server); each tool left out is listed with the reason."""
    log = EventLog(tmp_path / "events.log")
    config = mcp_config(tmp_path, "https://llm.example.com/v1/chat/completions", log)
    with config.open("a", encoding="utf-8") as file:
        file.write('allow_tools = ["look", "move", "say"]\nblock_tools = ["say"]\n')
    monkeypatch.setenv(KEY_ENV, "unused-key-for-the-listing")
    assert main(["tools", str(config), "--json"]) == 0
    world = json.loads(capsys.readouterr().out)["servers"]["world"]
    assert [t["name"] for t in world["tools"]] == ["w_look", "w_move"]
    reasons = {s["name"]: s["reason"] for s in world["skipped"]}
    assert reasons["w_say"] == "in [mcp.servers.world] block_tools"
    assert reasons["w_fail"] == "not in [mcp.servers.world] allow_tools"


def test_a_server_with_more_tools_than_the_ceiling_is_used_through_its_allow_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filter applies before the loop's tool ceiling: a server offering more tools than
    ``max_tools`` is listed by ``tools`` once ``allow_tools`` brings it under, and the tools
    left out still carry the configuration's reason."""
    log = EventLog(tmp_path / "events.log")
    config = mcp_config(tmp_path, "https://llm.example.com/v1/chat/completions", log)
    with config.open("a", encoding="utf-8") as file:
        file.write('allow_tools = ["look", "move", "say"]\nblock_tools = ["say"]\n')
        file.write("\n[tool_loop]\nmax_tools = 2\n")
    monkeypatch.setenv(KEY_ENV, "unused-key-for-the-listing")
    assert main(["tools", str(config), "--json"]) == 0, capsys.readouterr()
    world = json.loads(capsys.readouterr().out)["servers"]["world"]
    assert [t["name"] for t in world["tools"]] == ["w_look", "w_move"]
    reasons = {s["name"]: s["reason"] for s in world["skipped"]}
    assert reasons["w_say"] == "in [mcp.servers.world] block_tools"
    assert reasons["w_panorama"] == "not in [mcp.servers.world] allow_tools"


@pytest.mark.slow
async def test_run_uses_an_allow_listed_server_over_the_tool_ceiling(
    cli: RunCLI, tmp_path: Path
) -> None:
    """``run`` with a server over ``max_tools``, allow-listed under it: the model is offered
    the allowed tools alone and its calls reach the server."""
    log = EventLog(tmp_path / "events.log")
    async with FakeEndpoint(script()) as ep:
        config = mcp_config(tmp_path, ep.url, log)
        with config.open("a", encoding="utf-8") as file:
            file.write('allow_tools = ["look", "move"]\n\n[tool_loop]\nmax_tools = 2\n')
        text = await cli("run", "--config", str(config), "--goal", GOAL)
    assert text.returncode == 0, text.stderr
    offered = [t["function"]["name"] for t in ep.requests[0].json()["tools"]]
    assert offered == ["w_look", "w_move"]
    assert log.starts() == ["look", "move"]


def test_check_config_starts_servers_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check-config --start-servers`` starts the servers and lists their tools (in JSON
    under ``mcp_tools``); without it, none is started. A server that does not start is
    exit 1 with the reason."""
    log = EventLog(tmp_path / "events.log")
    config = mcp_config(tmp_path, "https://llm.example.com/v1/chat/completions", log)
    monkeypatch.setenv(KEY_ENV, "unused-key-for-the-listing")
    assert main(["check-config", str(config), "--json"]) == 0
    assert "mcp_tools" not in json.loads(capsys.readouterr().out)
    assert not log.path.exists()
    assert main(["check-config", str(config), "--start-servers", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["mcp_tools"]
    assert listed["ok"] is True
    assert "w_look" in [t["name"] for t in listed["servers"]["world"]["tools"]]
    broken = tmp_path / "broken.toml"
    broken.write_text(
        config.read_text("utf-8").replace(json.dumps(sys.executable), '"/nonexistent/server"'),
        encoding="utf-8",
    )
    assert main(["check-config", str(broken), "--start-servers"]) == 1
    assert "an MCP server did not start" in capsys.readouterr().err


TYPOS = (
    'effects = { say = "read_only", mvoe = "mutating" }',
    'allow_tools = ["look", "lok"]',
    'block_tools = ["sya"]',
)


@pytest.mark.slow
@pytest.mark.parametrize("typo", TYPOS, ids=["effects", "allow_tools", "block_tools"])
def test_a_tool_policy_typo_is_a_usage_error_in_every_command(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    typo: str,
) -> None:
    """A tool in ``effects``, ``allow_tools`` or ``block_tools`` that the server does not
    list stops ``tools``, ``check-config --start-servers`` and ``run`` at start (exit 2),
    naming the key under ``[mcp.servers.NAME]`` and the nearest tool the server lists; no
    session starts."""
    log = EventLog(tmp_path / "events.log")
    config = mcp_config(tmp_path, "https://llm.example.com/v1/chat/completions", log)
    text = config.read_text(encoding="utf-8")
    if typo.startswith("effects"):
        text = text.replace('effects = { say = "read_only" }', typo)
    else:
        text += typo + "\n"
    config.write_text(text, encoding="utf-8")
    script = tmp_path / "script.json"
    script.write_text('[{"text": "done"}]', encoding="utf-8")
    monkeypatch.setenv(KEY_ENV, "unused-key-for-the-listing")
    commands = (
        ["tools", str(config)],
        ["check-config", str(config), "--start-servers"],
        ["run", "--config", str(config), "--model-script", str(script), "--goal", GOAL],
    )
    for command in commands:
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert "did you mean" in err, (command, err)
        assert "mcp.servers.world." in err, (command, err)
        assert "the server lists no tool" in err, (command, err)
        assert "session finished" not in err
    assert log.starts() == []


def test_a_server_that_exits_at_start_says_why_without_verbose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tools`` (and so ``run``) with a stdio server that exits at start prints its exit
    status and its last stderr line without -v; ``tools -v`` is accepted like ``run -v``
    and logs the server's stderr lines as they come."""
    path = tmp_path / "mcp.json"
    failing = "import sys; print('fatal: no repository at /nowhere', file=sys.stderr); sys.exit(2)"
    path.write_text(json.dumps({"mcpServers": {"git": {
        "command": sys.executable, "args": ["-c", failing],
    }}}), encoding="utf-8")  # fmt: skip
    for verbose in ([], ["-v"]):
        assert main(["tools", "--mcp-config", str(path), *verbose]) == 1
        err = capsys.readouterr().err
        assert "exited with status 2" in err, err
        assert "its stderr ended: fatal: no repository at /nowhere" in err, err
    assert "MCP server 'git' stderr: fatal" in err  # the -v log line


def test_inherit_env_reaches_the_server_from_either_form(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``inherit_env`` in ``[mcp.servers.NAME]`` and in the ``--mcp-config`` JSON form hands
    the command's own variable to the stdio server (here a server that prints it to stderr
    and exits, which the start-up error then quotes)."""
    monkeypatch.setenv("GRID_TEST_CA", "/etc/region/ca.pem")
    monkeypatch.setenv(KEY_ENV, "unused-key-for-the-listing")
    shows = "import os, sys; print('CA=' + os.environ.get('GRID_TEST_CA', '-'), file=sys.stderr)"
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"region": {
        "command": sys.executable, "args": ["-c", shows], "inherit_env": ["GRID_TEST_CA"],
    }}}), encoding="utf-8")  # fmt: skip
    toml = tmp_path / "agent.toml"
    toml.write_text(
        f'[llm]\nendpoint_url = "https://llm.example.com/v1/chat/completions"\n'
        f'api_key_env = "{KEY_ENV}"\n\n[mcp.servers.region]\n'
        f"command = {json.dumps(sys.executable)}\nargs = ['-c', {json.dumps(shows)}]\n"
        'inherit_env = ["GRID_TEST_CA"]\n',
        encoding="utf-8",
    )
    for command in (["tools", "--mcp-config", str(path)], ["tools", str(toml)]):
        assert main(command) == 1
        assert "CA=/etc/region/ca.pem" in capsys.readouterr().err
