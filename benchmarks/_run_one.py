"""Run one contender N times against a URL (the process callgrind counts), C at a time.

The contenders of ``bench_transport`` and of ``bench_history``, by name; on uvloop's event
loop when ``GRID_AGENT_EVENT_LOOP=uvloop`` (the ``uvloop`` dependency group), else asyncio's.
"""

from __future__ import annotations

import asyncio
import os
import sys

from benchmarks import bench_history, bench_transport
from benchmarks.bench_transport import run_requests

if __name__ == "__main__":
    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    concurrency = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    contender = {**bench_transport.CONTENDERS, **bench_history.CONTENDERS}[name]
    run = asyncio.run
    if os.environ.get("GRID_AGENT_EVENT_LOOP") == "uvloop":
        import uvloop  # only when asked for: an optional dependency group

        run = uvloop.run
    run(run_requests(contender, url, count, concurrency=concurrency, counted=True))
