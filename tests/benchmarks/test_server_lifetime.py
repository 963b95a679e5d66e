"""The benchmarks' loopback server lives exactly as long as the run that started it.

A fixed lifetime once ended a slow full run midway; the server now stops when its parent
closes the pipe, explicitly or by dying, and at no time of its own.
"""

from __future__ import annotations

import inspect
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import _server

ROOT = Path(__file__).resolve().parents[2]
#: Far longer than the server needs to notice its pipe closed (milliseconds).
STOP_WITHIN_S = 20.0
_PARENT = """
import sys, time
from benchmarks._server import serve
with serve() as origin:
    print(origin, flush=True)
    time.sleep(600)
"""


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _stops(port: int) -> bool:
    deadline = time.monotonic() + STOP_WITHIN_S
    while time.monotonic() < deadline:
        if not _answers(port):
            return True
        time.sleep(0.05)
    return False


def test_the_server_stops_when_its_parent_dies() -> None:
    """A run killed outright (no ``finally``) leaves no server behind: the pipe closes."""
    parent = subprocess.Popen(  # noqa: S603 - our own interpreter, fixed code
        [sys.executable, "-c", _PARENT], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        port = int(parent.stdout.readline().rsplit(":", 1)[1])
        assert _answers(port)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    assert _stops(port), "the server outlived the run that started it"


def test_the_server_stops_when_the_run_ends_and_has_no_clock_of_its_own() -> None:
    """Leaving ``serve()`` stops the server; nothing else bounds its life (no lifetime)."""
    with _server.serve() as origin:
        port = int(origin.rsplit(":", 1)[1])
        assert _answers(port)
    assert not _answers(port)
    assert "lifetime" not in inspect.signature(_server.serve).parameters
    assert "lifetime" not in inspect.getsource(_server)
