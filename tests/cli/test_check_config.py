"""``grid-agent check-config``: effective settings with the key redacted, or every problem.

The files here hold the canary key inline or name its environment variable; it must never
be printed, whether the file is valid or not.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.cli.conftest import CANARY, KEY_ENV, RunCLI

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
    text, data, env_text = await asyncio.gather(
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


async def test_invalid_config_lists_every_problem(cli: RunCLI, tmp_path: Path) -> None:
    """An invalid file: exit 2 and every problem with its key path, never the inline key."""
    bad = write(tmp_path, "bad.toml", BAD)
    text, data = await asyncio.gather(cli("check-config", bad), cli("check-config", bad, "--json"))
    assert (text.returncode, data.returncode) == (2, 2)
    assert "invalid configuration (5 problems)" in text.stdout
    for key in BAD_KEYS:
        assert f"  {key}: " in text.stdout
    report = data.json()
    assert report["valid"] is False
    assert sorted(p["key"] for p in report["problems"]) == sorted(BAD_KEYS)
    assert all(p["problem"] for p in report["problems"])


async def test_unreadable_or_malformed_file_exits_2(cli: RunCLI, tmp_path: Path) -> None:
    """A missing file, a file that is not TOML, and a file without [llm]: exit 2 each."""
    not_toml = write(tmp_path, "x.toml", f'[llm\napi_key = "{CANARY}"\n')
    no_llm = write(tmp_path, "y.toml", "[tool_loop]\nmax_turns = 3\n")
    missing, malformed, empty = await asyncio.gather(
        cli("check-config", str(tmp_path / "missing.toml")),
        cli("check-config", not_toml),
        cli("check-config", no_llm, "--json"),
    )
    assert (missing.returncode, malformed.returncode, empty.returncode) == (2, 2, 2)
    assert "cannot read" in missing.stdout
    assert "not valid TOML" in malformed.stdout
    assert [p["key"] for p in empty.json()["problems"]] == ["llm"]
