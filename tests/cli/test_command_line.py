"""The command line as operators type it: stdin for long texts, --endpoint for run, --help.

``--prompt -`` and ``--goal -`` read the text from stdin (a long goal, or one from a pipe);
``run --endpoint URL --api-key-env NAME`` works as it does for ``probe``; ``--help`` lists
every exit status; and ``run`` without an endpoint says on its first line that it plays the
built-in scripted model.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from metacrate_grid_agent.cli._scripted_model import respond
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import (
    CANARY,
    CHILD_TIMEOUT_S,
    KEY_ENV,
    CLIResult,
    RunCLI,
    child_env,
    finish_child,
    together,
)

if TYPE_CHECKING:
    from pathlib import Path


async def run_with_stdin(pycache: Path, text: str, *args: str) -> CLIResult:
    """Run the CLI with ``text`` on its stdin."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metacrate_grid_agent",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(pycache),
    )
    return await finish_child(process, stdin=text.encode(), timeout_s=CHILD_TIMEOUT_S)


async def test_prompt_dash_reads_the_prompt_from_stdin(pycache: Path) -> None:
    """``probe --prompt -``: the user message is stdin's text, sent as it is."""
    prompt = "Describe the plaza.\nThen list its exits."
    async with FakeEndpoint([Reply.completion("ok")]) as ep:
        result = await run_with_stdin(
            pycache,
            prompt,
            "probe",
            "--endpoint",
            ep.url,
            "--api-key-env",
            KEY_ENV,
            "--prompt",
            "-",
        )
    assert result.returncode == 0, result.stderr
    assert ep.requests[0].json()["messages"] == [{"role": "user", "content": prompt}]


async def test_goal_dash_reads_the_goal_from_stdin(pycache: Path) -> None:
    """``run --goal -``: the goal is stdin's text; an empty stdin is a usage error."""
    done = await run_with_stdin(pycache, "Look around, then say hello.", "run", "--goal", "-")
    empty = await run_with_stdin(pycache, "  \n", "run", "--goal", "-")
    assert done.returncode == 0, done.stderr
    assert "goal: Look around, then say hello." in done.stderr
    assert empty.returncode == 2
    assert "--goal must not be empty" in empty.stderr


async def test_run_takes_endpoint_and_api_key_env_like_probe(cli: RunCLI) -> None:
    """``run --endpoint URL --api-key-env NAME`` plays against that endpoint, key in the header."""
    async with FakeEndpoint(responder=respond) as ep:
        result = await cli(
            "run", "--goal", "Explore.", "--endpoint", ep.url, "--api-key-env", KEY_ENV, "--json"
        )
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert data["model"] == "endpoint"
    assert data["outcome"] == "completed"
    assert len(ep.requests) == data["turns"]
    assert all(r.header("Authorization") == f"Bearer {CANARY}" for r in ep.requests)
    assert "SCRIPTED" not in result.stderr.splitlines()[0]


async def test_run_endpoint_needs_its_key_variable(cli: RunCLI) -> None:
    """--endpoint without --api-key-env, or --api-key-env alone: usage errors, exit 2."""
    url = "http://127.0.0.1:9/v1/chat/completions"
    no_key, no_endpoint = await together(
        cli("run", "--goal", "x", "--endpoint", url),
        cli("run", "--goal", "x", "--api-key-env", KEY_ENV),
    )
    assert (no_key.returncode, no_endpoint.returncode) == (2, 2)
    assert "--endpoint needs --api-key-env NAME" in no_key.stderr
    assert "go with --endpoint" in no_endpoint.stderr


async def test_run_without_an_endpoint_says_so_first(cli: RunCLI) -> None:
    """No --config, no --endpoint: the first line says the scripted model plays; JSON says so."""
    result = await cli("run", "--goal", "Say hello.", "--json")
    assert result.returncode == 0, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("grid-agent: using the built-in SCRIPTED model")
    assert result.json()["model"] == "scripted"


async def test_help_lists_the_exit_statuses(cli: RunCLI) -> None:
    """--help of the command and of each subcommand lists every exit status it can return."""
    top, probe, run, check = await together(
        cli("--help"), cli("probe", "--help"), cli("run", "--help"), cli("check-config", "--help")
    )
    for result in (top, probe, run):
        assert result.returncode == 0
        out = result.stdout
        assert "exit status:" in out
        for line in ("0    success", "1    the endpoint", "2    usage", "130  interrupted", "143"):
            assert line in out, (line, out)
    assert "0    the configuration is valid" in check.stdout
    assert "2    usage error, or the configuration is invalid" in check.stdout
