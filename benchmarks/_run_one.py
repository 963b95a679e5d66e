"""Run one transport contender N times against a URL (the process callgrind counts)."""

from __future__ import annotations

import asyncio
import sys

from benchmarks.bench_transport import CONTENDERS, run_requests

if __name__ == "__main__":
    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    asyncio.run(run_requests(CONTENDERS[name], url, count))
