"""The README's first screen works as written: its Python example against a loopback
endpoint, and its two commands (the demo is run here as the README spells it)."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import sys
from pathlib import Path

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


def test_the_readme_shows_the_demo_and_the_test_command_ci_runs() -> None:
    """The two commands stay exactly these: CI runs the test command as written."""
    assert readme_commands() == [
        "python3 -m pip install uv && uv run --locked grid-agent demo",
        "python3 -m pip install uv && uv run --locked pytest",
    ]


async def test_the_readme_demo_command_completes_a_session(cli: RunCLI) -> None:
    """The demo command of the README, after ``uv run --locked``, runs a whole session."""
    demo = readme_commands()[0].split("uv run --locked ", 1)[1]
    program, *args = shlex.split(demo)
    assert program == "grid-agent"
    result = await cli(*args)
    assert (result.returncode, "SCRIPTED model" in result.stderr) == (0, True)
    assert "outcome:   completed" in result.stdout
