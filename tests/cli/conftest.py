"""Fixtures of the CLI suite: run ``grid-agent`` as a child process, write configuration files.

The child is started with ``asyncio.create_subprocess_exec`` so the test's own
:class:`~metacrate_grid_agent.testing.FakeEndpoint` keeps serving while the child runs. Every
child gets the API key through an environment variable holding a canary; every run asserts
the canary appears nowhere in the child's stdout or stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from tests.conftest import assert_no_canary

#: The key every child receives; it must never come back in any output.
CANARY = "sk-CANARY-5f0c2e9a7b31d84e"
#: The environment variable carrying it.
KEY_ENV = "GRID_AGENT_TEST_KEY"
#: Bound on one child process: each should finish in well under this on loopback.
CHILD_TIMEOUT_S = 20.0
#: Children of one test that run at once: one per core, so a burst never outruns the
#: machine and a child's time limit measures its own work, not a queue of its siblings.
MAX_CHILDREN = os.cpu_count() or 1

T = TypeVar("T")


@dataclass(frozen=True)
class CLIResult:
    """A finished child: exit status and decoded output."""

    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """stdout as exactly one JSON value (and nothing else)."""
        lines = self.stdout.splitlines()
        assert len(lines) == 1, f"expected one JSON line on stdout, got {self.stdout!r}"
        return json.loads(lines[0])


class RunCLI(Protocol):
    """Run ``grid-agent ARGS`` to completion."""

    def __call__(
        self, *args: str, env: Mapping[str, str] | None = None, timeout_s: float = ...
    ) -> Coroutine[Any, Any, CLIResult]: ...


StartCLI = Callable[..., Awaitable[asyncio.subprocess.Process]]


def child_env(pycache: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ours without credentials, plus the canary key.

    Bytecode goes to ``pycache`` (a session temporary folder, never the repository), so only
    the first child compiles the package and its dependencies: that keeps each child's start
    near 0.3 s instead of 0.8 s when the environment sets PYTHONDONTWRITEBYTECODE.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith(("OPENAI", "GRID_AGENT", "ANTHROPIC"))
        and k != "PYTHONDONTWRITEBYTECODE"
    }
    env[KEY_ENV] = CANARY
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env.update(extra or {})
    return env


def assert_no_key(*texts: str) -> None:
    """The canary (and its distinctive tail) appear in none of ``texts``, nor any shaped one.

    The shaped canaries (``tests.conftest.CANARY_KEYS``) are checked on every run too, for
    the tests that hand the child one of them as its key.
    """
    for text in texts:
        assert CANARY not in text
        assert CANARY[-12:] not in text
    assert_no_canary(*texts)


@pytest.fixture(scope="session")
def pycache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bytecode cache shared by every child of the session."""
    return tmp_path_factory.mktemp("pycache")


async def _spawn(
    *args: str, env: Mapping[str, str] | None, pycache: Path
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metacrate_grid_agent",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(pycache, env),
    )


async def _reap(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def finish_child(
    process: asyncio.subprocess.Process, *, stdin: bytes | None = None, timeout_s: float
) -> CLIResult:
    """Wait for ``process`` (feeding it ``stdin``) within ``timeout_s``, killed and reaped if
    it outlives it; its output, checked for the key."""
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await process.communicate(stdin)
    finally:
        await _reap(process)
    assert process.returncode is not None
    result = CLIResult(process.returncode, out.decode(), err.decode())
    assert_no_key(result.stdout, result.stderr)
    return result


async def together(*runs: Coroutine[Any, Any, T], limit: int = MAX_CHILDREN) -> list[T]:
    """Await ``runs`` side by side, at most ``limit`` at a time, their results in order.

    A run waits its turn before it starts, so whatever it opens (a fake endpoint, a child)
    lives only while it runs, never while it queues. They run in one
    :class:`asyncio.TaskGroup`: the first failure cancels the others, and their children are
    killed and reaped before this returns, so no process or pipe outlives the test; a run
    still waiting for its turn then never starts.
    """
    slots = asyncio.Semaphore(limit)

    async def one(run: Coroutine[Any, Any, T]) -> T:
        try:
            await slots.acquire()
            result = await run
        except BaseException:
            # The slot stays taken: once a run failed (or all are cancelled), no other starts.
            run.close()  # a no-op once it ran; unstarted, it is closed without a warning
            raise
        slots.release()
        return result

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(run)) for run in runs]
    return [task.result() for task in tasks]


@pytest.fixture
async def cli(pycache: Path) -> AsyncIterator[RunCLI]:
    """Run the CLI to completion (bounded), returning its exit status and output.

    At most :data:`MAX_CHILDREN` children of the test run at once; the others wait their turn
    before they start, and their time limit starts with them.
    """
    children: list[asyncio.subprocess.Process] = []
    slots = asyncio.Semaphore(MAX_CHILDREN)

    async def run(
        *args: str, env: Mapping[str, str] | None = None, timeout_s: float = CHILD_TIMEOUT_S
    ) -> CLIResult:
        async with slots:
            process = await _spawn(*args, env=env, pycache=pycache)
            children.append(process)
            try:
                async with asyncio.timeout(timeout_s):
                    out, err = await process.communicate()
            except TimeoutError:
                await _reap(process)
                raise AssertionError(
                    f"grid-agent {args} did not finish within {timeout_s} s"
                ) from None
            except asyncio.CancelledError:
                await _reap(process)  # a sibling failed: this child goes with it
                raise
        assert process.returncode is not None
        result = CLIResult(process.returncode, out.decode(), err.decode())
        assert_no_key(result.stdout, result.stderr)
        return result

    yield run
    for child in children:
        await _reap(child)


@pytest.fixture
async def start_cli(pycache: Path) -> AsyncIterator[StartCLI]:
    """Start the CLI and return the process (killed and reaped at teardown if still alive)."""
    children: list[asyncio.subprocess.Process] = []

    async def start(*args: str, env: Mapping[str, str] | None = None) -> asyncio.subprocess.Process:
        process = await _spawn(*args, env=env, pycache=pycache)
        children.append(process)
        return process

    yield start
    for child in children:
        await _reap(child)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"no TOML form for {value!r}")


WriteConfig = Callable[..., Path]


@pytest.fixture
def write_config(tmp_path: Path) -> WriteConfig:
    """Write a TOML config for ``url`` (key from the canary variable) and return its path.

    ``llm`` and ``tool_loop`` add or override keys of those tables; a key set to None is
    left out.
    """
    count = 0

    def write(
        url: str,
        *,
        llm: Mapping[str, object] | None = None,
        tool_loop: Mapping[str, object] | None = None,
    ) -> Path:
        nonlocal count
        count += 1
        table: dict[str, object] = {"endpoint_url": url, "api_key_env": KEY_ENV}
        table.update(llm or {})
        lines = ["[llm]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None]
        if tool_loop:
            lines += ["", "[tool_loop]"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in tool_loop.items()]
        path = tmp_path / f"config-{count}.toml"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    return write
