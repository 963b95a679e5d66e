"""A long history's bytes are handed to the connection as the encoder keeps them.

The encoder keeps the older messages' bytes joined in one block; the client used to join
the head and every piece into one request per call, copying the whole history once per
request (24 KB at 200 messages). It now hands the pieces to the transport's
``writelines``, which sends them gathered where the event loop does so (uvloop, asyncio
from CPython 3.12) and joins them once where it does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from metacrate_grid_agent import HistoryEncoder, SystemMessage, UserMessage
from metacrate_grid_agent._core._request import MAX_LOOSE_PARTS, encode_request
from metacrate_grid_agent.testing import FakeEndpoint, Reply

if TYPE_CHECKING:
    from metacrate_grid_agent import Message
    from tests.llm_transport.conftest import ClientFactory


class _Spy:
    """The connection's transport (asyncio's or uvloop's), noting what ``writelines`` gets."""

    def __init__(self, transport: Any, written: list[list[bytes]]) -> None:
        self._transport = transport
        self._written = written

    def writelines(self, pieces: Any) -> None:
        self._written.append(list(pieces))
        self._transport.writelines(pieces)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def test_the_history_block_is_written_as_the_encoder_holds_it(
    client_factory: ClientFactory,
) -> None:
    """The second request of a grown history writes the encoder's block of older messages
    as the very object the encoder holds (no copy of it per request), and the bytes the
    endpoint reads are exactly ``encode_request`` of the history."""
    history: list[Message] = [SystemMessage(content="be brief")]
    history += [UserMessage(content=f"message {i}") for i in range(2 * MAX_LOOSE_PARTS)]
    encoder = HistoryEncoder()
    written: list[list[bytes]] = []
    async with FakeEndpoint([Reply.completion("ok")] * 2) as ep:
        client = client_factory(ep.url)
        await client.complete(history, encoder=encoder)
        pool = client._ensure_pool()
        (connection,) = pool._idle  # the one kept-alive connection
        assert connection.transport is not None
        connection.transport = _Spy(connection.transport, written)  # type: ignore[assignment]
        history.append(UserMessage(content="and?"))
        await client.complete(history, encoder=encoder)
    block = encoder._block
    assert len(block) > 0
    (pieces,) = written
    assert any(piece is block for piece in pieces)
    assert ep.requests[1].body == encode_request(history, ())
