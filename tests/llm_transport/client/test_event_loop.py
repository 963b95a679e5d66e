"""The client tier runs on the event loop it is asked for (asyncio's, or uvloop's).

``GRID_AGENT_EVENT_LOOP=uvloop`` (read by tests/conftest.py) runs every async test on
uvloop, whose transports are not ``asyncio.Transport`` subclasses; CI runs this tier so.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import UserMessage
from metacrate_grid_agent._aio import _http
from metacrate_grid_agent.errors import ResponseTooLargeError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.conftest import ON_UVLOOP

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

HELLO = (UserMessage(content="hello"),)
MiB = 1024 * 1024


async def test_the_tests_run_on_the_loop_asked_for() -> None:
    """A run asked to use uvloop runs on it (not silently on asyncio's), and by default on
    asyncio's own loop: otherwise the uvloop tier would prove nothing."""
    module = type(asyncio.get_running_loop()).__module__
    if ON_UVLOOP:
        assert module.startswith("uvloop"), module
    else:
        assert module.startswith("asyncio"), module


async def test_a_kept_alive_connection_carries_calls_on_this_loop(
    client_factory: ClientFactory,
) -> None:
    """On whichever loop runs the tier, the first call connects and the second reuses the
    connection: the protocol takes the loop's transport, asyncio's or uvloop's."""
    async with FakeEndpoint([Reply.completion("one"), Reply.completion("two")]) as ep:
        client = client_factory(ep.url)
        texts = [(await client.complete(HELLO)).text, (await client.complete(HELLO)).text]
    assert texts == ["one", "two"]
    assert [r.connection_id for r in ep.requests] == [0, 0]


def _count_deliveries(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the reads the loop delivers into the connection's buffer: on a plain
    TCP connection, every byte the loop read from the socket (a buffered protocol)."""
    sizes: list[int] = []
    delivered = _http._Connection.buffer_updated

    def counted(self: _http._Connection, nbytes: int) -> None:
        sizes.append(nbytes)
        delivered(self, nbytes)

    monkeypatch.setattr(_http._Connection, "buffer_updated", counted)
    return sizes


@pytest.mark.parametrize("chunked", [False, True], ids=["close-delimited", "chunked"])
async def test_an_endless_body_is_read_no_further_than_64_kib_past_the_cap_on_this_loop(
    client_factory: ClientFactory, monkeypatch: pytest.MonkeyPatch, chunked: bool
) -> None:
    """On this loop too, the client reads at most the cap plus 64 KiB of an endless body, in
    reads of at most 16 KiB: the loop reads into the protocol's own buffer (uvloop's
    transports do not go through the socket module, where test_responses.py counts)."""
    sizes = _count_deliveries(monkeypatch)
    cap = 256 * 1024
    async with FakeEndpoint([Reply(endless=True, chunked=chunked)]) as ep:
        with pytest.raises(ResponseTooLargeError):
            await client_factory(ep.url, max_response_bytes=cap, max_retries=0).complete(HELLO)
        await ep.wait_closed(0)
    assert cap < sum(sizes) <= cap + 64 * 1024
    assert max(sizes) <= _http.READ_SIZE


async def test_a_declared_length_over_the_cap_is_refused_within_one_read_on_this_loop(
    client_factory: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On this loop too, a Content-Length over the cap ends the call on the head: at most
    one 16 KiB read of the 4 MiB body that is all there to be read."""
    sizes = _count_deliveries(monkeypatch)
    async with FakeEndpoint([Reply(body=b"x" * (4 * MiB))]) as ep:
        with pytest.raises(ResponseTooLargeError):
            await client_factory(ep.url, max_response_bytes=MiB, max_retries=0).complete(HELLO)
        await ep.wait_closed(0)
    assert 0 < sum(sizes) <= _http.READ_SIZE
