"""Run one contender N times against a URL (the process callgrind counts), C at a time.

The contenders of ``bench_transport`` and of ``bench_history``, by name.
"""

from __future__ import annotations

import asyncio
import sys

from benchmarks import bench_history, bench_transport
from benchmarks.bench_transport import run_requests

if __name__ == "__main__":
    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    concurrency = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    contender = {**bench_transport.CONTENDERS, **bench_history.CONTENDERS}[name]
    asyncio.run(run_requests(contender, url, count, concurrency=concurrency))
