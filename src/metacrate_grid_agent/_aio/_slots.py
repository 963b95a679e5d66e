"""The client's bound on requests in flight: a FIFO semaphore cheap to leave."""

from __future__ import annotations

import asyncio
import collections

__all__ = ["Slots"]


class Slots:
    """A FIFO semaphore whose waiters leave in O(1) when cancelled.

    asyncio's ``Semaphore`` removes a cancelled waiter from a deque (O(waiters)) and scans
    every waiter on each release; when thousands of sessions waiting on one client are
    superseded at once, that made each cancellation cost in proportion to the queue. Here
    the waiters are an ordered dict, and a release hands its slot straight to the next
    waiter still waiting.
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: collections.OrderedDict[asyncio.Future[None], None] = (
            collections.OrderedDict()
        )

    def locked(self) -> bool:
        """Whether an acquire would wait."""
        return self._free == 0

    def take_free(self) -> bool:
        """Take a slot if one is free, at once (no coroutine); False when none is."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        """Take a slot, waiting in line for one when none is free."""
        if self._free > 0:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[waiter] = None
        try:
            await waiter
        except BaseException:
            if self._waiters.pop(waiter, False) is False and not waiter.cancelled():
                self.release()  # handed a slot as the cancellation came: pass it on
            raise

    def release(self) -> None:
        """Return a slot: to the longest waiter still waiting, else to the free count."""
        waiters = self._waiters
        while waiters:
            waiter, _ = waiters.popitem(last=False)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
