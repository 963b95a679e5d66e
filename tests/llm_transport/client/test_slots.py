"""The client's slots: a free slot is taken without a coroutine, and the line stays FIFO."""

from __future__ import annotations

import asyncio

from metacrate_grid_agent._aio._slots import Slots


def test_a_free_slot_is_taken_at_once_and_none_past_the_limit() -> None:
    """take_free() takes a slot when one is free, and never more than the limit."""
    slots = Slots(2)
    assert slots.take_free()
    assert slots.take_free()
    assert not slots.take_free()
    assert slots.locked()
    slots.release()
    assert slots.take_free()


async def test_a_released_slot_goes_to_the_waiter_not_to_take_free() -> None:
    """A slot released while a request waits is that request's: take_free() finds none."""
    slots = Slots(1)
    assert slots.take_free()
    waiting = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    slots.release()
    assert not slots.take_free()
    await asyncio.wait_for(waiting, 1.0)
    slots.release()
    assert slots.take_free()
