"""``grid-agent run --approve``: the operator answers on a terminal before each mutating call.

The child's stdin is a pseudo-terminal the test types into; its stdout and stderr are pipes.
The built-in scripted model plays the session: ``look_around`` (read-only, never asked),
an invalid ``move_to`` (rejected by validation, never asked), a valid ``move_to`` and a
``say`` (both mutating, both asked).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from metacrate_grid_agent.cli._sandbox import SandboxWorld
from tests.cli.conftest import CHILD_TIMEOUT_S, RunCLI, assert_no_key, child_env

GOAL = "Walk to the sign and greet whoever is there."
QUESTION = "Run it? Type y to run it"


@contextlib.asynccontextmanager
async def on_a_terminal(
    pycache: Path, *args: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """``grid-agent ARGS`` with a pseudo-terminal as stdin; yields the child and the master."""
    master, slave = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metacrate_grid_agent",
        *args,
        stdin=slave,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(pycache),
    )
    os.close(slave)
    try:
        yield process, master
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        os.close(master)


async def read_until(stream: asyncio.StreamReader, marker: str, seen: list[str]) -> None:
    """Read stderr lines into ``seen`` until one contains ``marker``."""
    async with asyncio.timeout(CHILD_TIMEOUT_S):
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError(f"stderr ended before {marker!r}: {''.join(seen)}")
            seen.append(line)
            if marker in line:
                return


async def test_approve_asks_for_each_mutating_call_and_obeys_the_answers(pycache: Path) -> None:
    """The prompt shows tool, effect and arguments; "y" runs the call, "n reason" refuses it.

    Protects: only valid mutating calls are asked about (not the read-only look, not the
    invalid move), an approved move changes the world, a refused line of chat is never said
    and the model reads the operator's reason.
    """
    async with on_a_terminal(pycache, "run", "--goal", GOAL, "--approve", "--json") as (child, tty):
        assert child.stderr is not None
        assert child.stdout is not None
        seen: list[str] = []
        await read_until(child.stderr, QUESTION, seen)
        os.write(tty, b"y\n")
        await read_until(child.stderr, QUESTION, seen)
        os.write(tty, b"n too loud here\n")
        async with asyncio.timeout(CHILD_TIMEOUT_S):
            out, rest = await child.communicate()
    err = "".join(seen) + rest.decode()
    stdout = out.decode()
    assert_no_key(stdout, err)
    assert child.returncode == 0, err
    asked = [line for line in err.splitlines() if line.startswith("  tool:")]
    assert asked == [
        "  tool:        move_to (mutating)",
        "  tool:        say (mutating)",
    ]
    assert '  arguments:   {"x": ' in err
    assert "grid-agent: approved" in err
    assert "grid-agent: refused: too loud here" in err
    result = json.loads(stdout)
    assert result["outcome"] == "completed"
    assert [(c["name"], c["status"]) for c in result["calls"]] == [
        ("look_around", "ok"),
        ("move_to", "rejected"),
        ("move_to", "ok"),
        ("say", "denied"),
    ]
    assert result["calls"][3]["observation"] == (
        "not run: the operator denied this call (too loud here)"
    )
    assert result["world"]["chat"] == []
    start = SandboxWorld()
    assert result["world"]["position"] != [start.x, start.y]


async def test_approve_without_a_terminal_is_refused_before_anything_runs(cli: RunCLI) -> None:
    """``--approve`` with stdin not a terminal: exit 2 and a clear error, no session at all.

    Protects: a mutating call is never run unasked because nobody could answer.
    """
    result = await cli("run", "--goal", GOAL, "--approve")
    assert result.returncode == 2
    assert "stdin is not a terminal" in result.stderr
    assert "[turn 1]" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("answer", [b"\n", b"maybe\n"])
async def test_anything_but_yes_refuses(pycache: Path, answer: bytes) -> None:
    """An empty line or an unclear answer refuses the call (the default is no)."""
    async with on_a_terminal(pycache, "run", "--goal", GOAL, "--approve", "--json") as (child, tty):
        assert child.stderr is not None
        seen: list[str] = []
        for _ in range(2):
            await read_until(child.stderr, QUESTION, seen)
            os.write(tty, answer)
        async with asyncio.timeout(CHILD_TIMEOUT_S):
            out, _ = await child.communicate()
    calls = json.loads(out.decode())["calls"]
    assert [c["status"] for c in calls] == ["ok", "rejected", "denied", "denied"]


async def test_ctrl_c_while_the_question_is_open_cancels_without_running_the_call(
    pycache: Path,
) -> None:
    """Ctrl-C at the prompt ends the session as cancelled ("operator"), exit 130.

    Protects: the open question is abandoned, the move is never run (the avatar has not
    moved) and the call is recorded "not run", never ambiguous.
    """
    async with on_a_terminal(pycache, "run", "--goal", GOAL, "--approve", "--json") as (child, _):
        assert child.stderr is not None
        seen: list[str] = []
        await read_until(child.stderr, QUESTION, seen)
        child.send_signal(signal.SIGINT)
        async with asyncio.timeout(CHILD_TIMEOUT_S):
            out, _ = await child.communicate()
    assert child.returncode == 130
    result = json.loads(out.decode())
    assert (result["outcome"], result["cancel_reason"]) == ("cancelled", "operator")
    assert result["ambiguous_call"] is None
    assert [(c["name"], c["status"]) for c in result["calls"]][-1] == ("move_to", "cancelled")
    start = SandboxWorld()
    assert result["world"]["position"] == [start.x, start.y]
