"""``grid-agent run --approve``: the operator answers on a terminal before each mutating call.

The child's stdin is a pseudo-terminal the test types into; its stdout and stderr are pipes.
The built-in scripted model plays the session: ``look_around`` (read-only, never asked),
an invalid ``move_to`` (rejected by validation, never asked), a valid ``move_to`` and a
``say`` (both mutating, both asked). The last tests run the terminal approver in this
process, on a pseudo-terminal, inside a tool loop whose executor records what it receives.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import pty
import signal
import sys
from typing import TYPE_CHECKING, Final

import msgspec
import pytest

from metacrate_grid_agent import (
    CancelToken,
    Effect,
    LLMClient,
    LLMConfig,
    Outcome,
    Secret,
    SessionGeneration,
    Success,
    Tool,
    ToolLoop,
    ToolLoopConfig,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent.cli._approve import MAX_SHOWN_ARGUMENTS, TerminalApprover
from metacrate_grid_agent.cli._output import Console, Redactor
from metacrate_grid_agent.cli._sandbox import SandboxWorld
from metacrate_grid_agent.cli._scripted_model import respond
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import CHILD_TIMEOUT_S, RunCLI, WriteConfig, assert_no_key, child_env

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

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


@pytest.mark.slow
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
    assert '  arguments:   {"x":' in err
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


@pytest.mark.slow
async def test_a_question_left_unanswered_says_so_even_with_quiet(
    pycache: Path, write_config: WriteConfig
) -> None:
    """No answer within ``approval_timeout_s``: the call is refused, and stderr says so.

    Protects: the question tells the operator how long they have, and the timeout is
    reported on stderr with ``-q`` too (which silences only progress lines), so a refusal
    nobody typed is never silent. The session goes on and completes.
    """
    async with FakeEndpoint(responder=respond) as ep:
        config = write_config(ep.url, tool_loop={"approval_timeout_s": 0.3})
        args = ("run", "--goal", GOAL, "--config", str(config), "--approve", "--json", "-q")
        async with on_a_terminal(pycache, *args) as (child, _):
            async with asyncio.timeout(CHILD_TIMEOUT_S):
                out, err = await child.communicate()
    stderr = err.decode()
    assert_no_key(out.decode(), stderr)
    assert child.returncode == 0, stderr
    lines = stderr.splitlines()
    assert (
        lines.count(f"{QUESTION}; n and a reason (or just Enter) to refuse it (you have 0.3 s):")
        == 2
    )
    timed_out = "grid-agent: no answer within 0.3 s: the approval timed out; the call is refused"
    assert lines.count(timed_out) == 2
    assert "[turn" not in stderr
    result = json.loads(out.decode())
    assert [(c["name"], c["status"]) for c in result["calls"]][-2:] == [
        ("move_to", "denied"),
        ("say", "denied"),
    ]


# --- the approver in this process -----------------------------------------------------------

SAY: Final = Tool(
    "say",
    "Say a line in local chat.",
    {"type": "object", "properties": {"text": {"type": "string"}, "volume": {"type": "number"}}},
    Effect.MUTATING,
)
ARGUMENTS_LINE: Final = "  arguments:   "


class RecordingExecutor:
    """An executor that records every call it is given and succeeds."""

    def __init__(self) -> None:
        self.calls: list[ValidatedCall] = []

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Record the call; report success."""
        self.calls.append(call)
        return Success("said")


class Operator(io.StringIO):
    """The approver's stderr: keeps what is shown, and types ``answer`` at each question."""

    def __init__(self, terminal: int, answer: bytes) -> None:
        super().__init__()
        self.terminal = terminal
        self.answer = answer

    def write(self, text: str) -> int:
        """Keep the text; answer on the terminal once a question has been shown."""
        written = super().write(text)
        if QUESTION in text:
            os.write(self.terminal, self.answer)
        return written


@contextlib.contextmanager
def terminal_approver(answer: bytes) -> Iterator[tuple[TerminalApprover, Operator]]:
    """A TerminalApprover reading a pseudo-terminal that ``answer`` is typed into."""
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "r", encoding="utf-8", closefd=False) as stdin:
            operator = Operator(master, answer)
            console = Console(Redactor(), stdout=io.StringIO(), stderr=operator)
            yield TerminalApprover(console, stdin), operator
    finally:
        os.close(slave)
        os.close(master)


async def run_say(
    arguments: str, approver: TerminalApprover
) -> tuple[RecordingExecutor, list[Outcome | str]]:
    """One session: the model asks for ``say`` with ``arguments``, then finishes."""
    executor = RecordingExecutor()
    replies = [
        Reply.completion(None, tool_calls=[("s-1", "say", arguments)]),
        Reply.completion("ok"),
    ]
    async with FakeEndpoint(replies) as ep:
        llm = LLMConfig(endpoint_url=ep.url, api_key=Secret("sk-test-approval-0123456789"))
        async with LLMClient(llm) as client:
            loop = ToolLoop(client, [SAY], executor, config=ToolLoopConfig(), approver=approver)
            result = await loop.run("greet", generation=SessionGeneration("s"))
    return executor, [result.outcome, *(c.observation for c in result.calls)]


async def test_the_arguments_line_shown_is_the_bytes_the_executor_receives() -> None:
    """What the operator approves is byte for byte the JSON of what the executor runs.

    Protects: the model's spacing, escapes and number spelling never reach the screen; the
    line is the executor's value encoded once, so no text that reads differently is shown.
    """
    raw = '{ "text" : "hello  there,\\u0020friend at 12:30", "volume":  1.50E0 }'
    with terminal_approver(b"y\n") as (approver, operator):
        executor, outcome = await run_say(raw, approver)
    assert outcome == [Outcome.COMPLETED, "said"]
    (received,) = executor.calls
    (shown,) = [
        line for line in operator.getvalue().splitlines() if line.startswith(ARGUMENTS_LINE)
    ]
    assert shown[len(ARGUMENTS_LINE) :].encode("utf-8") == msgspec.json.encode(received.arguments)
    assert shown == ARGUMENTS_LINE + '{"text":"hello  there, friend at 12:30","volume":1.5}'


async def test_arguments_too_long_to_show_whole_are_refused_without_a_question() -> None:
    """Arguments that do not fit a question whole are refused, never approved on a cut view.

    Protects: nobody is asked (an operator typing "y" at once would otherwise approve a
    part), stderr says why, the executor never runs the call and the model reads the reason.
    """
    text = "a" * MAX_SHOWN_ARGUMENTS
    with terminal_approver(b"y\n") as (approver, operator):
        executor, outcome = await run_say(msgspec.json.encode({"text": text}).decode(), approver)
    reason = (
        f"too long to approve: the arguments are {MAX_SHOWN_ARGUMENTS + 11} characters once "
        f"escaped, more than the {MAX_SHOWN_ARGUMENTS} a question shows whole"
    )
    assert executor.calls == []
    assert outcome == [Outcome.COMPLETED, f"not run: the operator denied this call ({reason})"]
    shown = operator.getvalue()
    assert QUESTION not in shown
    assert f"grid-agent: {reason}; the call is refused\n" in shown
    assert text not in shown
