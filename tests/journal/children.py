"""The crash tests' child processes, seen from the test: start one, wait (bounded) for its end.

A child is ``python -m MODULE ARGS`` from the project's root (``tests/journal/child.py``,
``tests/journal/random_child.py``, ``tests/dbos/matrix_child.py``); it prints its session's
shape as one JSON line, or dies of the SIGKILL it sends itself on cue.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Final, NamedTuple

ROOT: Final = Path(__file__).resolve().parents[2]
#: Bound on one child: it finishes in well under a second on loopback.
CHILD_TIMEOUT_S: Final = 30.0


class ChildEnd(NamedTuple):
    """How a child ended: its status, the JSON line it printed last (None unless it exited
    0 and printed one), its standard error's tail."""

    status: int
    shape: dict[str, Any] | None
    err: str


async def start(module: str, *args: str) -> asyncio.subprocess.Process:
    """Start ``python -m module args`` from the project's root, its output piped."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
    )  # fmt: skip


async def finish(
    process: asyncio.subprocess.Process, timeout_s: float = CHILD_TIMEOUT_S
) -> ChildEnd:
    """Wait for the child, killed if it outlives ``timeout_s``; how it ended."""
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    lines = out.decode().splitlines()
    shape = json.loads(lines[-1]) if process.returncode == 0 and lines else None
    return ChildEnd(process.returncode, shape, err.decode()[-2000:])


def killed_or_shape(end: ChildEnd) -> tuple[int, dict[str, Any] | None]:
    """The matrices' rule: a child either printed its shape (status 0) or died of its own
    SIGKILL (then no shape); anything else fails with its standard error."""
    if end.status != 0:
        assert end.status == -signal.SIGKILL, end.err
        return end.status, None
    assert end.shape is not None, end.err
    return 0, end.shape
