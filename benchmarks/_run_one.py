"""Run one contender of the transport benchmark N times against a URL (for callgrind)."""

from __future__ import annotations

import asyncio
import sys

from benchmarks.bench_transport import ours, raw_aiohttp

CONTENDERS = {"raw": raw_aiohttp, "ours": ours}

if __name__ == "__main__":
    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    asyncio.run(CONTENDERS[name](url, count))
