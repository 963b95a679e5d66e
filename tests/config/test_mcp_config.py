"""The ``[mcp.servers.NAME]`` tables: read and checked like the rest of the configuration.

Every problem at once with its key path and a did-you-mean, paths relative to the file,
and secrets only from the environment or a file: never written in the file, never shown.
"""

from __future__ import annotations

import json
import logging
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


def _problems(mcp: object, **kwargs: Any) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        AgentConfig.from_mapping({"llm": LLM, "mcp": mcp}, **kwargs)
    assert CANARY_KEY not in str(caught.value)
    return [(p.key, p.problem) for p in caught.value.problems]


def _json_problems(document: object, **kwargs: Any) -> list[tuple[str, str]]:
    base = AgentConfig.from_mapping({"llm": LLM})
    with pytest.raises(ConfigError) as caught:
        base.with_mcp_json(json.dumps(document), source="m.json", **kwargs)
    assert CANARY_KEY not in str(caught.value)
    return [(p.key, p.problem) for p in caught.value.problems]


def test_the_mcp_table_and_its_servers_table_must_be_tables() -> None:
    """A non-table [mcp] or servers, an unknown key beside servers, too many servers: each
    a problem at its key, never a crash."""
    assert _problems("x") == [("mcp", "must be a table")]
    assert _problems({"servrs": 1, "servers": []}) == [
        ("mcp.servrs", "unknown key; did you mean `servers`?"),
        ("mcp.servers", "must be a table of servers"),
    ]
    many = {f"s{i}": {"command": "x"} for i in range(17)}
    assert _problems({"servers": many}) == [("mcp.servers", "names 17; the limit is 16")]


def test_a_bad_server_name_or_a_non_table_server_is_refused() -> None:
    """A server's name is a label of logs and prompts: its alphabet is checked; a server
    that is not a table is a problem, not a crash."""
    assert _problems({"servers": {"a b": {"command": "x"}, "flat": "uvx"}}) == [
        ("mcp.servers.a b", "a server's name must be 1 to 64 of letters, digits and . _ -"),
        ("mcp.servers.flat", "must be a table"),
    ]


def test_wrong_types_for_each_key_are_reported_with_their_key_path() -> None:
    """Each key of a stdio server with a value of the wrong type: one problem per key."""
    found = _problems(
        {
            "servers": {
                "s": {
                    "command": 3,
                    "args": "a b",
                    "env": ["A"],
                    "tool_prefix": "no spaces",
                    "effects": "read_only",
                    "allow_tools": "x",
                    "block_tools": ["", "y"],
                    "startup_timeout_s": "10",
                    "tool_timeout_s": True,
                }
            }
        }
    )
    assert found == [
        ("mcp.servers.s.command", "must be a non-empty string"),
        ("mcp.servers.s.args", "must be a list of strings"),
        ("mcp.servers.s.tool_prefix", "must be 1 to 32 of letters, digits, _ and -"),
        ("mcp.servers.s.effects", 'must be a table: TOOL = "read_only" or "mutating"'),
        ("mcp.servers.s.allow_tools", "must be a list of tool names (at most 256)"),
        ("mcp.servers.s.block_tools", "must be a list of tool names (at most 256)"),
        ("mcp.servers.s.env", 'must be a table: NAME = "value" or NAME = { env = "VAR" }'),
        ("mcp.servers.s.startup_timeout_s", "must be a number of seconds, got '10'"),
        ("mcp.servers.s.tool_timeout_s", "must be a number of seconds, got True"),
    ]


def test_timeouts_out_of_range_and_too_many_entries_are_refused() -> None:
    """Every bound is checked: the startup floor, a non-finite tool timeout, more args or
    env entries than MAX_ENTRIES."""
    found = _problems(
        {
            "servers": {
                "s": {
                    "command": "x",
                    "args": ["a"] * 257,
                    "env": {f"V{i}": "v" for i in range(257)},
                    "startup_timeout_s": 0,
                    "tool_timeout_s": float("inf"),
                }
            }
        }
    )
    assert found == [
        ("mcp.servers.s.args", "has 257 entries; the limit is 256"),
        ("mcp.servers.s.env", "has 257 entries; the limit is 256"),
        ("mcp.servers.s.startup_timeout_s", "0 is outside 0.001 to 300 s"),
        ("mcp.servers.s.tool_timeout_s", "inf is outside 0.001 to 600 s"),
    ]


def test_stdio_and_http_keys_do_not_mix() -> None:
    """args/env/cwd go with command, headers with url; neither command nor url is asked
    for; a URL must be absolute http(s) and carry no credentials."""
    found = _problems(
        {
            "servers": {
                "h": {"url": "https://a.example/", "args": ["x"], "cwd": "."},
                "c": {"command": "x", "headers": {"X-A": "b"}},
                "none": {"tool_prefix": "n"},
                "ftp": {"url": "ftp://a.example/"},
                "cred": {"url": "https://user:pw@a.example/"},
            }
        }
    )
    assert found == [
        ("mcp.servers.h.args", "goes with command (a stdio server), not url"),
        ("mcp.servers.c.headers", "goes with url (an HTTP server), not command"),
        (
            "mcp.servers.none.command",
            "give command (a server started over stdio) or url (streamable HTTP)",
        ),
        ("mcp.servers.ftp.url", "must be an absolute http:// or https:// URL"),
        ("mcp.servers.cred.url", "must not carry credentials; send them in headers"),
    ]


def test_secret_forms_are_checked_without_showing_the_secret(tmp_path: Path) -> None:
    """A bad variable or header name, a wrong value shape, an empty reference, a variable
    name that is not one, a missing file and a file of many lines: each a problem; a
    credential written inline is refused without quoting it."""
    (tmp_path / "two").write_text("a\nb\n", encoding="utf-8")
    found = _problems(
        {
            "servers": {
                "s": {
                    "command": "x",
                    "env": {
                        "1BAD": "x",
                        "SHAPE": {"env": "A", "file": "b"},
                        "EMPTY": {"env": ""},
                        "ODD": {"env": "not a name"},
                        "GONE": {"file": "missing"},
                        "MANY": {"file": "two"},
                    },
                },
                "h": {
                    "url": "https://a.example/",
                    "headers": {"bad header": "x", "X-Api-Key": CANARY_KEY},
                },
            }
        },
        env={},
        base_dir=tmp_path,
    )
    gone, many = str(tmp_path / "missing"), str(tmp_path / "two")
    assert [
        ("mcp.servers.s.env.1BAD", "is not an environment variable's name"),
        ("mcp.servers.s.env.SHAPE", 'must be a string, { env = "VAR" } or { file = "path" }'),
        ("mcp.servers.s.env.EMPTY.env", "must be a non-empty string"),
        (
            "mcp.servers.s.env.ODD",
            "the environment variable (a name not repeated here) is unset or empty",
        ),
        ("mcp.servers.s.env.GONE", f"cannot read the file {gone!r} (No such file or directory)"),
        (
            "mcp.servers.s.env.MANY",
            f"the file {many!r} must hold the value alone: one line, at most 16384 bytes",
        ),
        ("mcp.servers.h.headers.bad header", "is not a header's name"),
        (
            "mcp.servers.h.headers.X-Api-Key",
            (
                'names a credential: give it as { env = "VAR" } or { file = "path" }, '
                "never written in the configuration file"
            ),
        ),
    ] == found


def test_relative_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    """A ./command and a cwd are taken beside the configuration file; a cwd that is not a
    folder is a problem naming the resolved path."""
    (tmp_path / "work").mkdir()
    config = _config({"s": {"command": "./run.sh", "cwd": "work"}}, base_dir=tmp_path)
    (server,) = config.mcp_servers
    assert (str(tmp_path / "run.sh"), str(tmp_path / "work")) == (server.command, server.cwd)
    missing = str(tmp_path / "nowhere")
    assert [("mcp.servers.s.cwd", f"{missing!r} is not a folder")] == _problems(
        {"servers": {"s": {"command": "x", "cwd": "nowhere"}}}, base_dir=tmp_path
    )


def test_allow_and_block_lists_filter_tools_and_are_shown() -> None:
    """allow_tools offers only the tools it names, block_tools never offers its own; both
    are shown in the redacted form, with the reason a tool is left out."""
    config = _config({"s": {"command": "x", "allow_tools": ["a", "b"], "block_tools": ["b"]}})
    (server,) = config.mcp_servers
    assert [server.filtered_out(name) for name in ("a", "b", "c")] == [
        None,
        "in [mcp.servers.s] block_tools",
        "not in [mcp.servers.s] allow_tools",
    ]
    shown = server.to_redacted_dict(shown_url)
    assert (shown["allow_tools"], shown["block_tools"]) == (["a", "b"], ["b"])


def test_two_servers_with_one_prefix_are_refused() -> None:
    """Two servers given the same tool_prefix would offer clashing names: refused at load."""
    assert _problems(
        {"servers": {"a": {"command": "x", "tool_prefix": "p"},
                     "b": {"command": "y", "tool_prefix": "p"}}}
    ) == [("mcp.servers.b.tool_prefix", "'p' is also the prefix of 'a'")]  # fmt: skip


def test_the_json_form_refuses_what_it_cannot_read() -> None:
    """Not an object, no servers object, a server that is not an object, an unknown key and
    a ${...} substitution in a plain key: each a problem naming the file and key."""
    assert _json_problems([]) == [("m.json: mcpServers", "the file must hold a JSON object")]
    assert (_json_problems({"other": {}})) == [
        ("m.json: mcpServers", "no mcpServers (or servers) object found")
    ]
    found = _json_problems(
        {
            "mcpServers": {
                "flat": "uvx",
                "s": {"command": "${input:cmd}", "alias": "y"},
            }
        },
        env={},
    )
    assert found == [
        ("m.json: mcpServers.flat", "must be an object"),
        (
            "m.json: mcpServers.s.command",
            (
                "a ${...} substitution other than a whole ${env:NAME} cannot be honoured "
                "(inputs and workspace variables are the editor's)"
            ),
        ),
        ("m.json: mcpServers.s.alias", "not supported here; left unread"),
        (
            "m.json: mcpServers.s.command",
            "give command (a server started over stdio) or url (streamable HTTP)",
        ),
    ]


def test_an_env_reference_outside_env_and_headers_is_not_silently_dropped(
    tmp_path: Path,
) -> None:
    """``${env:NAME}`` is read in env and headers only: in cwd it would be dropped and the
    server started in another folder, so it is a problem naming the key; a non-string env
    value is checked like the TOML table's."""
    found = _json_problems(
        {"mcpServers": {"s": {"command": "x", "cwd": "${env:WORK}", "env": {"N": 3}}}},
        env={"WORK": str(tmp_path)},
    )
    assert found == [
        (
            "m.json: mcpServers.s.cwd",
            "a ${env:NAME} reference is read in env and headers only; write the value",
        ),
        (
            "m.json: mcpServers.s.env.N",
            'must be a string, { env = "VAR" } or { file = "path" }',
        ),
    ]


def test_a_substitution_inside_args_is_refused_not_passed_literally() -> None:
    """VS Code's ``${input:...}``/``${workspaceFolder}`` and ``${env:NAME}`` in an ``args``
    item would reach the server as the literal text: each is a problem naming the item."""
    found = _json_problems(
        {
            "mcpServers": {
                "s": {
                    "command": "x",
                    "args": ["--repo", "${workspaceFolder}", "--token=${input:token}", "ok"],
                },
                "e": {"command": "y", "args": ["${env:HOME}"]},
            }
        },
        env={"HOME": "/home/agent"},
    )
    assert found == [
        (
            "m.json: mcpServers.s.args[1]",
            (
                "a ${...} substitution other than a whole ${env:NAME} cannot be honoured "
                "(inputs and workspace variables are the editor's)"
            ),
        ),
        (
            "m.json: mcpServers.s.args[2]",
            (
                "a ${...} substitution other than a whole ${env:NAME} cannot be honoured "
                "(inputs and workspace variables are the editor's)"
            ),
        ),
        (
            "m.json: mcpServers.e.args[0]",
            "a ${env:NAME} reference is read in env and headers only; write the value",
        ),
    ]


def test_a_secret_file_readable_by_others_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``{ file = ... }`` secret is read by the key file's rule: one that other users can
    read is used, with one warning naming the file and its mode; the secret is not in it."""
    caplog.set_level(logging.WARNING, logger="metacrate_grid_agent.config")
    path = tmp_path / "token"
    path.write_text(CANARY_KEY + "\n", encoding="utf-8")
    path.chmod(0o644)
    config = _config({"h": {"url": "https://a.example/", "headers": {"Auth": {"file": "token"}}}},
                     base_dir=tmp_path)  # fmt: skip
    assert config.mcp_servers[0].revealed("headers") == {"Auth": CANARY_KEY}
    assert caplog.record_tuples == [
        (
            "metacrate_grid_agent.config",
            logging.WARNING,
            f"the file {str(path)!r} is readable by other users (mode 0644); chmod 600 it",
        )
    ]


def test_inherit_env_names_variables_of_the_command_for_a_stdio_server() -> None:
    """``inherit_env`` (TOML and JSON forms) lists variables the stdio server gets from the
    command's own environment: names checked, kept in order and shown; a credential's name,
    a name also set in ``env`` and an HTTP server's ``inherit_env`` are problems."""
    stdio = {"command": "uvx", "args": ["mcp-server-git"]}
    config = _config({"git": {**stdio, "inherit_env": ["SSL_CERT_FILE", "UV_INDEX_URL"]}})
    (git,) = config.mcp_servers
    assert git.inherit_env == ("SSL_CERT_FILE", "UV_INDEX_URL")
    assert git.to_redacted_dict(shown_url)["inherit_env"] == ["SSL_CERT_FILE", "UV_INDEX_URL"]
    assert _config({"git": stdio}).mcp_servers[0].inherit_env == ()

    with pytest.raises(ConfigError) as caught:
        _config(
            {
                "a": {**stdio, "inherit_env": ["SSL-CERT"]},
                "b": {**stdio, "inherit_env": "SSL_CERT_FILE"},
                "c": {**stdio, "inherit_env": ["GITHUB_TOKEN"]},
                "d": {**stdio, "inherit_env": ["LOG"], "env": {"LOG": "info"}},
                "e": {"url": "https://x.example/mcp", "inherit_env": ["SSL_CERT_FILE"]},
                "f": {**stdio, "inherit_envs": ["SSL_CERT_FILE"]},
            }
        )
    problems = {p.key: p.problem for p in caught.value.problems}
    assert "not an environment variable's name" in problems["mcp.servers.a.inherit_env"]
    assert "a list of environment variable names" in problems["mcp.servers.b.inherit_env"]
    assert '{ env = "GITHUB_TOKEN" }' in problems["mcp.servers.c.inherit_env"]
    assert "also set in env" in problems["mcp.servers.d.inherit_env"]
    assert "goes with command" in problems["mcp.servers.e.inherit_env"]
    assert "did you mean `inherit_env`" in problems["mcp.servers.f.inherit_envs"]

    document = {"mcpServers": {"git": {**stdio, "inherit_env": ["SSL_CERT_DIR"]}}}
    merged = AgentConfig.from_mapping({"llm": LLM}).with_mcp_json(json.dumps(document))
    assert merged.mcp_servers[0].inherit_env == ("SSL_CERT_DIR",)


def test_the_configuration_page_documents_every_server_key() -> None:
    """Every key of ``[mcp.servers.NAME]`` has its row in the configuration reference."""
    from pathlib import Path

    from metacrate_grid_agent._mcp_config import _KNOWN

    page = (Path(__file__).parents[2] / "docs" / "guide" / "configuration.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    for key in sorted(_KNOWN):
        assert any(f"`{key}`" in row.split(" | ")[0] for row in rows), key


def test_the_configuration_says_which_secrets_it_holds(tmp_path: Path) -> None:
    """``AgentConfig.secrets()`` lists every credential the configuration holds, as
    Secrets: the API key (here from a file), each MCP server's secret environment entries
    and its bearer token header, in the file's order; plain values are not secrets."""
    (tmp_path / "llm.key").write_text("sk-file-key-0123456789\n", encoding="utf-8")
    (tmp_path / "token").write_text(CANARY_KEY + "\n", encoding="utf-8")
    config = AgentConfig.from_toml_text(
        f"""
[llm]
endpoint_url = "{LLM["endpoint_url"]}"
api_key_file = "llm.key"

[mcp.servers.git]
command = "uvx"
env = {{ LOG_LEVEL = "info", GITHUB_TOKEN = {{ env = "GH_VAR" }} }}

[mcp.servers.world]
url = "https://world.example/mcp"
headers = {{ Authorization = {{ file = "token" }} }}
""",
        env={"GH_VAR": "gh-token-from-env-123"},
        base_dir=tmp_path,
    )
    held = config.secrets()
    assert [s.reveal() for s in held] == [
        "sk-file-key-0123456789",
        "gh-token-from-env-123",
        CANARY_KEY,
    ]
    assert CANARY_KEY not in repr(held)
