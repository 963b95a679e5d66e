"""Running the DBOS tier's worker (tests/dbos/worker.py) as a child process, and killing it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
#: Bound on a worker's start and its session's end (DBOS's launch is most of it).
WORKER_DEADLINE_S: Final = 60.0
#: How often the test looks for the worker's sign that it is inside the effect.
POLL_S: Final = 0.02


def spawn(mode: str, database_url: str, folder: Path, *extra: str) -> subprocess.Popen[str]:
    """The worker in ``mode``, its own process (group), output piped."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(  # noqa: S603 - our own interpreter and worker module
        [sys.executable, "-m", "tests.dbos.worker", mode, database_url, str(folder), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    """The worker's JSON line, once it exits by itself (within the deadline)."""
    try:
        out, err = process.communicate(timeout=WORKER_DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"the worker did not finish:\n{err[-3000:]}") from None
    assert process.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def wait_inside(process: subprocess.Popen[str], folder: Path) -> str:
    """Wait until the worker is inside the effect it was told to hang in (and leave it
    there); return the effect's name."""
    inside = folder / "inside"
    deadline = time.monotonic() + WORKER_DEADLINE_S
    while not inside.exists():
        if process.poll() is not None:
            _, err = process.communicate()
            raise AssertionError(f"the worker exited before the kill point:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise AssertionError("the worker never reached the kill point")
        time.sleep(POLL_S)
    name = inside.read_text()
    inside.unlink()
    return name


def kill_inside(process: subprocess.Popen[str], folder: Path) -> str:
    """Wait until the worker is inside its hanging effect, then SIGKILL its whole process
    group; return the effect's name."""
    name = wait_inside(process, folder)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    return name


def ledger(folder: Path) -> list[str]:
    """Every effect executed, in order, by every process."""
    path = folder / "ledger"
    return path.read_text().split() if path.exists() else []
