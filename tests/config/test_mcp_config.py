"""The ``[mcp.servers.NAME]`` tables: read and checked like the rest of the configuration.

Every problem at once with its key path and a did-you-mean, paths relative to the file,
and secrets only from the environment or a file: never written in the file, never shown.
"""

from __future__ import annotations

import json
import pickle
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent.config import AgentConfig, shown_url
from metacrate_grid_agent.errors import ConfigError
from tests.llm_transport.support import CANARY_KEY

if TYPE_CHECKING:
    from pathlib import Path

LLM = {"endpoint_url": "https://llm.example.com/v1/chat/completions", "api_key": "k" * 8}


def _config(servers: dict[str, Any], **kwargs: Any) -> AgentConfig:
    return AgentConfig.from_mapping({"llm": LLM, "mcp": {"servers": servers}}, **kwargs)


def test_a_stdio_and_an_http_server_are_read_with_their_secrets(tmp_path: Path) -> None:
    """Both transports, in the file's order; a secret from the environment and one from a
    file beside the configuration (a relative path), held as Secrets nobody prints."""
    (tmp_path / "token").write_text(CANARY_KEY + "\n", encoding="utf-8")
    (tmp_path / "repo").mkdir()
    config = AgentConfig.from_toml_text(
        f"""
[llm]
endpoint_url = "{LLM["endpoint_url"]}"
api_key = "{LLM["api_key"]}"

[mcp.servers.git]
command = "uvx"
args = ["mcp-server-git", "--repository", "."]
cwd = "repo"
env = {{ LOG_LEVEL = "info", GITHUB_TOKEN = {{ env = "GH_VAR" }} }}
effects = {{ git_status = "read_only", git_commit = "mutating" }}
tool_timeout_s = 20

[mcp.servers.world]
url = "https://world.example/mcp"
headers = {{ Authorization = {{ file = "token" }} }}
tool_prefix = "w_"
startup_timeout_s = 30
""",
        env={"GH_VAR": CANARY_KEY},
        base_dir=tmp_path,
    )
    git, world = config.mcp_servers
    assert (git.name, git.transport, git.command, git.cwd) == (
        "git", "stdio", "uvx", str(tmp_path / "repo"),
    )  # fmt: skip
    assert git.revealed("env") == {"LOG_LEVEL": "info", "GITHUB_TOKEN": CANARY_KEY}
    assert (dict(git.effects), git.tool_timeout_s) == (
        {"git_status": "read_only", "git_commit": "mutating"}, 20.0,
    )  # fmt: skip
    assert (world.transport, world.tool_prefix, world.startup_timeout_s) == ("http", "w_", 30.0)
    assert world.revealed("headers") == {"Authorization": CANARY_KEY}
    shown = [
        repr(config),
        str(git.to_redacted_dict(shown_url)),
        str(world.to_redacted_dict(shown_url)),
    ]
    assert all(CANARY_KEY not in text for text in shown)
    assert "[REDACTED] (environment variable GH_VAR)" in shown[1]
    assert CANARY_KEY.encode() not in pickle.dumps(config.mcp_servers[0].secrets())


def test_every_problem_of_every_server_is_reported_at_once() -> None:
    """Unknown keys with a did-you-mean (and what to write for keys of other clients),
    command and url both or neither, a credential written in the file, a wrong effect, a
    timeout out of range, an unset variable: each with its key path; no secret echoed."""
    with pytest.raises(ConfigError) as caught:
        _config(
            {
                "git": {"comand": "uvx", "type": "stdio"},
                "both": {"command": "x", "url": "https://a.example/"},
                "leaky": {
                    "command": "x",
                    "env": {"GITHUB_TOKEN": CANARY_KEY, "OTHER": {"env": "UNSET_VAR"}},
                    "effects": {"commit": "write"},
                    "tool_timeout_s": 9999,
                },
            },
            env={},
        )
    found = [(p.key, p.problem) for p in caught.value.problems]
    assert [key for key, _ in found] == [
        "mcp.servers.git.comand",
        "mcp.servers.git.type",
        "mcp.servers.git.command",
        "mcp.servers.both.command",
        "mcp.servers.leaky.effects.commit",
        "mcp.servers.leaky.env.GITHUB_TOKEN",
        "mcp.servers.leaky.env.OTHER",
        "mcp.servers.leaky.tool_timeout_s",
    ]
    assert found[0][1] == "unknown key; did you mean `command`?"
    assert "follows from command" in found[1][1]
    assert '{ env = "VAR" }' in found[5][1]
    assert "UNSET_VAR is unset" in found[6][1]
    assert CANARY_KEY not in str(caught.value)


def test_without_an_mcp_table_there_are_no_servers() -> None:
    """No [mcp] table: no servers (the command drives its sandbox)."""
    assert AgentConfig.from_mapping({"llm": LLM}).mcp_servers == ()


def test_an_mcp_servers_json_file_maps_to_the_same_fields(tmp_path: Path) -> None:
    """The mcpServers form (Claude Desktop; VS Code's ``servers``) adds its servers: command,
    args, env, cwd, url, headers map as they are, ``${env:NAME}`` is an environment secret,
    a disabled server is left out."""
    base = AgentConfig.from_mapping({"llm": LLM})
    document = {
        "mcpServers": {
            "git": {"command": "uvx", "args": ["mcp-server-git"],
                    "env": {"GITHUB_TOKEN": "${env:GH_VAR}", "LOG": "info"}},
            "remote": {"type": "http", "url": "https://mcp.example.com/mcp",
                       "headers": {"Authorization": "${env:GH_VAR}"}},
            "off": {"command": "x", "disabled": True},
        }
    }  # fmt: skip
    config = base.with_mcp_json(json.dumps(document), env={"GH_VAR": CANARY_KEY})
    git, remote = config.mcp_servers
    assert (git.name, git.command, git.args) == ("git", "uvx", ("mcp-server-git",))
    assert git.revealed("env") == {"GITHUB_TOKEN": CANARY_KEY, "LOG": "info"}
    assert (remote.transport, remote.revealed("headers")) == (
        "http", {"Authorization": CANARY_KEY},
    )  # fmt: skip
    vscode = base.with_mcp_json(json.dumps({"servers": {"a": {"command": "x"}}}), env={})
    assert [s.name for s in vscode.mcp_servers] == ["a"]


def test_what_the_json_form_cannot_honour_is_refused_with_its_reason() -> None:
    """SSE, envFile, input prompts, auto-approval and a credential written in the file are
    each a problem naming the file, the key and why; the credential is never echoed."""
    base = AgentConfig.from_mapping({"llm": LLM})
    document = {
        "mcpServers": {
            "sse": {"type": "sse", "url": "https://a.example/sse"},
            "files": {"command": "x", "envFile": ".env", "autoApprove": ["y"]},
            "prompt": {"command": "x", "env": {"TOKEN": "${input:token}"}},
            "leaky": {"command": "x", "env": {"API_KEY": CANARY_KEY}},
        }
    }
    with pytest.raises(ConfigError) as caught:
        base.with_mcp_json(json.dumps(document), source="mcp.json", env={})
    found = {p.key: p.problem for p in caught.value.problems}
    assert sorted(found) == [
        "mcp.json: mcpServers.files.autoApprove",
        "mcp.json: mcpServers.files.envFile",
        "mcp.json: mcpServers.leaky.env.API_KEY",
        "mcp.json: mcpServers.prompt.env.TOKEN",
        "mcp.json: mcpServers.sse.type",
    ]
    assert "stdio or streamable HTTP" in found["mcp.json: mcpServers.sse.type"]
    assert "run --approve" in found["mcp.json: mcpServers.files.autoApprove"]
    assert CANARY_KEY not in str(caught.value)
