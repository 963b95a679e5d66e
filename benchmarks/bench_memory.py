"""Memory under an endless body: what the client holds while it reads up to its cap.

The endpoint (its own process, loopback) streams a body that never ends. The client must
stop at ``max_response_bytes`` and close the connection. Python allocations are traced
(``tracemalloc``) during the call; the report is the peak above the cap, which should stay
near the socket read size (64 KiB), whatever the cap.

Run: ``uv run --locked python -m benchmarks.bench_memory``.
"""

from __future__ import annotations

import asyncio
import tracemalloc

from benchmarks._server import serve
from metacrate_grid_agent import LLMClient, LLMConfig, Secret, UserMessage
from metacrate_grid_agent.errors import ResponseTooLargeError

CAPS = (256 * 1024, 1024 * 1024, 8 * 1024 * 1024)


async def _one(url: str, cap: int) -> int:
    config = LLMConfig(
        endpoint_url=url, api_key=Secret("sk-bench"), max_response_bytes=cap, max_retries=0
    )
    async with LLMClient(config) as client:
        tracemalloc.start()
        tracemalloc.reset_peak()
        try:
            await client.complete([UserMessage(content="hello")])
        except ResponseTooLargeError:
            pass
        else:
            raise AssertionError("the endless body was not stopped at the cap")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def main() -> None:
    """Measure the peak for several caps; print the overhead above each cap."""
    with serve() as origin:
        url = origin + "/endless"
        print(f"{'cap':>12}{'peak traced':>14}{'above cap':>12}")
        for cap in CAPS:
            peak = asyncio.run(_one(url, cap))
            print(f"{cap:>12}{peak:>14}{peak - cap:>12}")


if __name__ == "__main__":
    main()
