"""The README's first screen works as written: its Python example against a loopback
endpoint, and its two commands (the demo is run here as the README spells it)."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import CANARY, RunCLI, assert_no_key, child_env

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    """The first Python code block of the README."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match is not None, "the README has no Python example"
    return match.group(1)


async def test_the_readme_example_completes_a_session(tmp_path: Path, pycache: Path) -> None:
    """Docs match code: the example's imports, types and calls are the real API.

    The example reads ``agent.toml`` and the key from ``GRID_AGENT_API_KEY``; here both point
    at a fake endpoint that asks for one move and then summarises.
    """
    script = [
        Reply.completion(tool_calls=[("call_1", "move_to", json.dumps({"x": 3, "y": 4}))]),
        Reply.completion("I walked to (3, 4)."),
    ]
    async with FakeEndpoint(script) as ep:
        (tmp_path / "agent.toml").write_text(
            f'[llm]\nendpoint_url = "{ep.url}"\napi_key_env = "GRID_AGENT_API_KEY"\n',
            encoding="utf-8",
        )
        (tmp_path / "example.py").write_text(readme_example(), encoding="utf-8")
        env = child_env(pycache, {"GRID_AGENT_API_KEY": CANARY, "PYTHONPATH": str(ROOT / "src")})
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "example.py",
            cwd=tmp_path,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        async with asyncio.timeout(30):
            out, err = await process.communicate()

    stdout, stderr = out.decode(), err.decode()
    assert (process.returncode, stderr) == (0, "")
    assert stdout.startswith("completed I walked to (3, 4).")
    assert_no_key(stdout, stderr)
    assert len(ep.requests) == 2
    sent_tools = ep.requests[0].json()["tools"]
    assert [t["function"]["name"] for t in sent_tools] == ["move_to"]
    tool_message = ep.requests[1].json()["messages"][-1]
    assert tool_message == {"role": "tool", "tool_call_id": "call_1", "content": "now at (3, 4)"}


def readme_commands() -> list[str]:
    """The command lines of the README's "Two commands" block, comments left out."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Two commands", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match is not None, "the README's two commands are gone"
    return [line for line in match.group(1).splitlines() if line and not line.startswith("#")]


def uv_run(command: str) -> tuple[list[str], list[str]]:
    """The options of a README line's ``uv run``, and the command it runs."""
    words = shlex.split(command.split("uv run ", 1)[1])
    first = next(i for i, word in enumerate(words) if not word.startswith("--"))
    return words[:first], words[first:]


def test_the_readme_shows_the_demo_and_the_test_command_ci_runs() -> None:
    """The two commands stay exactly these: CI runs the test command as written."""
    assert readme_commands() == [
        "python3 -m pip install uv && uv run --locked --no-default-groups grid-agent demo",
        "python3 -m pip install uv && uv run --locked pytest",
    ]


async def test_the_readme_demo_command_completes_a_session(cli: RunCLI) -> None:
    """The demo command of the README, after ``uv run --locked``, runs a whole session."""
    _, (program, *args) = uv_run(readme_commands()[0])
    assert program == "grid-agent"
    result = await cli(*args)
    assert (result.returncode, "SCRIPTED model" in result.stderr) == (0, True)
    assert "outcome:   completed" in result.stdout


#: Packages of the development groups, none of which running the demo needs.
DEV_ONLY = {"pytest", "mypy", "ruff", "mutmut", "hypothesis", "mcp", "coverage"}
#: uv, found on PATH as the README's commands find it.
UV = shutil.which("uv")
#: Most packages the demo may install: the runtime dependencies and theirs (12 today).
MAX_DEMO_PACKAGES = 16


@pytest.mark.skipif(UV is None, reason="needs uv, as the README does")
def test_the_readme_demo_command_installs_only_what_running_needs() -> None:
    """The demo command's uv options install the runtime dependencies only, not the
    development groups (test runner, linters, the MCP SDK), while the test command, with
    uv's default groups, still gets them all."""
    demo, tests = readme_commands()

    def packages(command: str) -> set[str]:
        options, _ = uv_run(command)
        assert UV is not None
        exported = subprocess.run(  # noqa: S603 - uv itself, with the README's own options
            [UV, "export", *options, "--no-hashes", "--no-emit-project", "--offline"],
            cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        return {line.split("==")[0].split("[")[0] for line in exported.splitlines() if "==" in line}

    running, testing = packages(demo), packages(tests)
    assert (set(), DEV_ONLY) == (running & DEV_ONLY, testing & DEV_ONLY)
    assert len(running) <= MAX_DEMO_PACKAGES, sorted(running)
