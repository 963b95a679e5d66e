"""What a counted run of requests measures: the requests, not what its set-up left behind.

``bench_history`` builds 192 sessions of 200 messages before it counts; the one automatic
collection that walked them (about 1.5 million instructions) fell inside the 3N run and
not the N run: 38k instructions "per request" at 200 messages that no request spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from typing import TYPE_CHECKING

from benchmarks.bench_transport import run_requests

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from benchmarks.bench_transport import Once


def test_a_counted_run_keeps_its_set_up_out_of_every_collection() -> None:
    """In a counted process, no object the contender's set-up built is in any generation a
    collection walks while the requests run (gc.freeze after the warm-up)."""
    seen_by_collector: list[bool] = []

    @contextlib.asynccontextmanager
    async def contender(url: str) -> AsyncIterator[Once]:
        setup = [[object()] for _ in range(10)]

        async def once() -> object:
            seen_by_collector.append(any(o is setup for o in gc.get_objects()))
            return None

        yield once

    try:
        asyncio.run(run_requests(contender, "http://127.0.0.1:9/", 2, counted=True))
    finally:
        gc.unfreeze()  # this test's process goes on
    assert seen_by_collector == [False, False]


def test_the_set_up_is_settled_before_the_requests_are_counted() -> None:
    """No object the contender's set-up built is still young when the counted requests
    run: a collection during them never traverses it (it would be counted in one run of
    the N and 3N pair and not the other)."""
    built = [[object()] for _ in range(100)]
    young_during_requests: list[bool] = []

    @contextlib.asynccontextmanager
    async def contender(url: str) -> AsyncIterator[Once]:
        setup = [list(item) for item in built]  # made here, in the youngest generation

        async def once() -> object:
            young = {id(o) for generation in (0, 1) for o in gc.get_objects(generation)}
            young_during_requests.append(id(setup) in young)
            return None

        yield once

    enabled = gc.isenabled()
    gc.enable()
    try:
        asyncio.run(run_requests(contender, "http://127.0.0.1:9/", 3))
    finally:
        if not enabled:
            gc.disable()
    assert young_during_requests == [False, False, False]
