"""``grid-agent check-config``: effective settings with the key redacted, or every problem.

The files here hold the canary key inline or name its environment variable; it must never
be printed, whether the file is valid or not.
"""

from __future__ import annotations

import json
import os
import tomllib
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent.cli import main
from metacrate_grid_agent.config import MAX_CONFIG_FILE_BYTES, AgentConfig
from metacrate_grid_agent.errors import ConfigError
from tests.cli.conftest import CANARY, KEY_ENV, RunCLI, assert_no_key, together

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

GOOD = f"""
[llm]
endpoint_url = "https://llm.example.com/v1/chat/completions"
api_key = "{CANARY}"
max_retries = 1
response_idle_timeout_s = 12.5

[tool_loop]
max_turns = 8
"""

GOOD_ENV = f"""
[llm]
endpoint_url = "http://127.0.0.1:8080/v1/chat/completions"
api_key_env = "{KEY_ENV}"
"""

#: Five problems in two tables, each with its key path.
BAD = f"""
[llm]
endpoint_url = "http://llm.example.com/v1/chat/completions"
api_key = "{CANARY}"
max_retries = 99
connect_timeout_s = "fast"
colour = "blue"

[tool_loop]
max_turns = 0
"""
BAD_KEYS = [
    "llm.colour",
    "llm.endpoint_url",
    "llm.connect_timeout_s",
    "llm.max_retries",
    "tool_loop.max_turns",
]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


async def test_valid_config_prints_effective_settings(cli: RunCLI, tmp_path: Path) -> None:
    """A valid file: exit 0, every effective setting (defaults included), the key redacted.

    Covers an inline key and a key from the environment, in text and in JSON.
    """
    good, good_env = write(tmp_path, "good.toml", GOOD), write(tmp_path, "env.toml", GOOD_ENV)
    text, data, env_text = await together(
        cli("check-config", good),
        cli("check-config", good, "--json"),
        cli("check-config", good_env),
    )
    assert (text.returncode, data.returncode, env_text.returncode) == (0, 0, 0)
    out = text.stdout
    assert 'endpoint_url = "https://llm.example.com/v1/chat/completions"' in out
    assert 'api_key = "[REDACTED]"' in out
    assert "max_retries = 1  # default 2; ceiling 10 retries" in out
    assert "response_idle_timeout_s = 12.5" in out
    assert "max_prompt_bytes = 4194304  # default; ceiling 67108864 bytes" in out
    assert "[tool_loop]" in out
    assert "max_turns = 8" in out
    settings = data.json()
    assert settings["valid"] is True
    assert settings["llm"]["api_key"] == "[REDACTED]"
    assert settings["llm"]["max_retries"] == 1
    assert settings["llm"]["request_timeout_s"] == 120.0
    assert settings["tool_loop"]["max_turns"] == 8
    assert 'api_key = "[REDACTED]"' in env_text.stdout


@pytest.mark.slow
async def test_invalid_config_lists_every_problem(cli: RunCLI, tmp_path: Path) -> None:
    """An invalid file: exit 2 and every problem with its key path, never the inline key.

    The problems go to stderr like every other command's errors; JSON stays on stdout.
    """
    bad = write(tmp_path, "bad.toml", BAD)
    text, data = await together(cli("check-config", bad), cli("check-config", bad, "--json"))
    assert (text.returncode, data.returncode) == (2, 2)
    assert text.stdout == ""
    assert "invalid configuration (5 problems)" in text.stderr
    for key in BAD_KEYS:
        assert f"  {key}: " in text.stderr
    report = data.json()
    assert report["valid"] is False
    assert sorted(p["key"] for p in report["problems"]) == sorted(BAD_KEYS)
    assert all(p["problem"] for p in report["problems"])


@pytest.mark.slow
async def test_unreadable_or_malformed_file_exits_2(cli: RunCLI, tmp_path: Path) -> None:
    """A missing file, a file that is not TOML, and a file without [llm]: exit 2 each."""
    not_toml = write(tmp_path, "x.toml", f'[llm\napi_key = "{CANARY}"\n')
    no_llm = write(tmp_path, "y.toml", "[tool_loop]\nmax_turns = 3\n")
    missing, malformed, empty = await together(
        cli("check-config", str(tmp_path / "missing.toml")),
        cli("check-config", not_toml),
        cli("check-config", no_llm, "--json"),
    )
    assert (missing.returncode, malformed.returncode, empty.returncode) == (2, 2, 2)
    assert "cannot read" in missing.stderr
    assert "not valid TOML" in malformed.stderr
    assert [p["key"] for p in empty.json()["problems"]] == ["llm"]


async def test_check_config_takes_config_option_and_names_the_key_source(
    cli: RunCLI, tmp_path: Path
) -> None:
    """--config FILE works like the positional FILE; the report says where the key came from.

    The key's origin is named (inline, the variable's name, the file's path), never the key.
    """
    good, good_env = write(tmp_path, "good.toml", GOOD), write(tmp_path, "env.toml", GOOD_ENV)
    (tmp_path / "llm.key").write_text(CANARY + "\n", encoding="utf-8")
    from_file = write(
        tmp_path,
        "file.toml",
        '[llm]\nendpoint_url = "https://llm.example.com/v1/chat/completions"\n'
        'api_key_file = "llm.key"\n',
    )
    inline, env_json, file_text = await together(
        cli("check-config", "--config", good),
        cli("check-config", "--config", good_env, "--json"),
        cli("check-config", from_file),
    )
    assert (inline.returncode, env_json.returncode, file_text.returncode) == (0, 0, 0)
    assert "key from: inline" in inline.stdout
    assert env_json.json()["api_key_source"] == f"environment variable {KEY_ENV}"
    assert f"key from: file {str(tmp_path / 'llm.key')!r}" in file_text.stdout


async def test_check_config_wants_exactly_one_file(cli: RunCLI, tmp_path: Path) -> None:
    """Neither FILE nor --config, or both: a usage error (exit 2) on stderr."""
    good = write(tmp_path, "good.toml", GOOD)
    neither, both = await together(cli("check-config"), cli("check-config", good, "--config", good))
    assert (neither.returncode, both.returncode) == (2, 2)
    assert "name one configuration file" in neither.stderr
    assert "name one configuration file" in both.stderr


async def test_check_config_warns_about_allow_insecure_http(cli: RunCLI, tmp_path: Path) -> None:
    """allow_insecure_http = true is valid but warned about, on stderr and in the JSON."""
    insecure = write(
        tmp_path,
        "insecure.toml",
        f'[llm]\nendpoint_url = "http://llm.example.com/v1/chat/completions"\n'
        f'api_key_env = "{KEY_ENV}"\nallow_insecure_http = true\n',
    )
    text, data = await together(
        cli("check-config", insecure), cli("check-config", insecure, "--json")
    )
    assert (text.returncode, data.returncode) == (0, 0)
    assert "warning: allow_insecure_http = true" in text.stderr
    assert "warning: allow_insecure_http = true" in data.stderr
    assert data.json()["warnings"] == [
        (
            "allow_insecure_http = true: to a non-loopback http endpoint the key travels "
            "unencrypted; prefer https"
        )
    ]
    assert "warning" not in text.stdout


#: A credential an operator put in the endpoint's query (not the API key).
QUERY_SECRET = "qs-7Hd93kPzQ0vW5mXc"


async def test_check_config_hides_a_credential_in_the_endpoint_url(
    cli: RunCLI, tmp_path: Path
) -> None:
    """The endpoint is shown by the library's one rule, in text and JSON: every credential-
    named query value hidden, the other parameters kept; a URL that does not parse (a
    user-info with no host) is refused without quoting any of it."""
    query = f"api-version=2024-10-21&api-key={QUERY_SECRET}&code={QUERY_SECRET}"
    good = write(
        tmp_path,
        "query.toml",
        f'[llm]\nendpoint_url = "https://llm.example.com/v1/chat/completions?{query}"\n'
        f'api_key_env = "{KEY_ENV}"\n',
    )
    bad = write(
        tmp_path,
        "no-host.toml",
        f'[llm]\nendpoint_url = "https://apikey:{QUERY_SECRET}/v1/chat/completions"\n'
        f'api_key_env = "{KEY_ENV}"\n',
    )
    text, data, refused, refused_json = await together(
        cli("check-config", good),
        cli("check-config", good, "--json"),
        cli("check-config", bad),
        cli("check-config", bad, "--json"),
    )
    assert (text.returncode, data.returncode) == (0, 0)
    assert (refused.returncode, refused_json.returncode) == (2, 2)
    shown = (
        "https://llm.example.com/v1/chat/completions"
        "?api-version=2024-10-21&api-key=[REDACTED]&code=[REDACTED]"
    )
    assert f'endpoint_url = "{shown}"' in text.stdout
    assert data.json()["llm"]["endpoint_url"] == shown
    assert "llm.endpoint_url: is not a valid URL" in refused.stderr
    for result in (text, data, refused, refused_json):
        assert QUERY_SECRET not in result.stdout + result.stderr


def _counting(calls: list[Any], real: Callable[..., Any]) -> Callable[..., Any]:
    def count(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return real(*args, **kwargs)

    return count


@pytest.mark.parametrize("text", [GOOD_ENV, BAD], ids=["valid", "invalid"])
def test_the_config_file_is_read_and_parsed_once(
    text: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One read and one parse of the file give both the secrets to scrub (learnt before
    validation, so an invalid file's key is hidden too) and the configuration."""
    path = write(tmp_path, "agent.toml", text)
    monkeypatch.setenv(KEY_ENV, CANARY)
    opened: list[Any] = []
    parsed: list[Any] = []
    monkeypatch.setattr(os, "open", _counting(opened, os.open))
    monkeypatch.setattr(tomllib, "loads", _counting(parsed, tomllib.loads))
    status = main(["check-config", path, "--json"])
    shown = capsys.readouterr()
    assert ([path], 1) == ([str(p) for p in opened if str(p) == path], len(parsed))
    assert (0 if text == GOOD_ENV else 2) == status
    assert_no_key(shown.out, shown.err)


@pytest.mark.parametrize("case", ["missing", "not TOML", "not UTF-8", "too large"])
def test_a_file_it_cannot_use_is_worded_as_the_library_words_it(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command reads the file itself (once) but reports a file it cannot read or parse
    exactly as ``AgentConfig.from_toml`` does."""
    path = tmp_path / "agent.toml"
    if case == "not TOML":
        path.write_text(f'[llm\napi_key = "{CANARY}"\n', encoding="utf-8")
    elif case == "not UTF-8":
        path.write_bytes(b'[llm]\napi_key = "\xff"\n')
    elif case == "too large":
        path.write_bytes(b"#" * (MAX_CONFIG_FILE_BYTES + 1))
    with pytest.raises(ConfigError) as library:
        AgentConfig.from_toml(path)
    status = main(["check-config", str(path), "--json"])
    shown = json.loads(capsys.readouterr().out)
    expected = [{"key": p.key, "problem": p.problem} for p in library.value.problems]
    assert (2, expected) == (status, shown["problems"])


MCP = f"""
[llm]
endpoint_url = "https://llm.example.com/v1/chat/completions"
api_key_env = "{KEY_ENV}"

[mcp.servers.world]
command = "world-server-that-does-not-exist"
args = ["--region", "plaza"]
env = {{ LOG_LEVEL = "info", WORLD_TOKEN = {{ env = "{KEY_ENV}" }} }}
effects = {{ look = "read_only" }}

[mcp.servers.remote]
url = "https://mcp.example.com/mcp"
headers = {{ Authorization = {{ env = "{KEY_ENV}" }} }}
tool_prefix = "r_"
"""


def test_check_config_shows_mcp_servers_redacted_and_starts_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """[mcp.servers.NAME] tables are accepted and shown (as TOML, in JSON too) with each secret
    redacted and its source named; no server is started (the command does not exist)."""
    path = write(tmp_path, "agent.toml", MCP)
    monkeypatch.setenv(KEY_ENV, CANARY)
    assert main(["check-config", path]) == 0
    out = capsys.readouterr().out
    assert main(["check-config", path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert_no_key(out, json.dumps(data))
    shown = tomllib.loads(out[out.index("[llm]") :].split("# MCP servers")[0])
    secret = f"[REDACTED] (environment variable {KEY_ENV})"
    assert shown["mcp"]["servers"]["world"] == {
        "transport": "stdio",
        "command": "world-server-that-does-not-exist",
        "args": ["--region", "plaza"],
        "env": {"LOG_LEVEL": "info", "WORLD_TOKEN": secret},
        "effects": {"look": "read_only"},
        "startup_timeout_s": 10.0,
    }
    assert shown["mcp"]["servers"]["remote"]["headers"] == {"Authorization": secret}
    assert data["mcp_servers"] == shown["mcp"]["servers"]
    assert "are read, not started" in out
