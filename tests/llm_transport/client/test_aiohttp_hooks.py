"""The client's hooks into aiohttp's and asyncio's private parts sit behind one version gate.

Both hooks (the response protocol that tells a cut-off head from a connection that never
answered, and the smaller socket reads while a body is read) are installed on the aiohttp
this project locks, and neither on an aiohttp version they were not checked against. What
the hooks do is covered where it matters: ``test_partial_head.py`` and the endless-body
tests of ``test_responses.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Final, cast

import aiohttp

from metacrate_grid_agent._aio._aiohttp_hooks import checked, limit_read_size, watch

if TYPE_CHECKING:
    import pytest

#: asyncio's own read size (its selector transport's ``max_size``), and a smaller one.
ASYNCIO_READ: Final = 256 * 1024
SMALL_READ: Final = 16 * 1024
#: A version outside the range the hooks were checked against.
UNCHECKED_VERSION: Final = "4.0.0"


def _response_on(transport: object) -> aiohttp.ClientResponse:
    """A stand-in for a response whose connection runs on ``transport`` (all the hook reads)."""
    return cast(
        "aiohttp.ClientResponse", SimpleNamespace(connection=SimpleNamespace(transport=transport))
    )


async def test_the_hook_is_active_on_this_aiohttp_and_refuses_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The protocol hook is installed on the aiohttp this project locks, and on an aiohttp
    version it was not checked against it changes nothing.

    Protects: an aiohttp upgrade that moves the hook's footing fails here by name, and an
    unknown version keeps aiohttp's own protocol (a cut-off head then stays retryable,
    the behaviour before the hook) rather than running an unchecked subclass.
    """
    connector = aiohttp.TCPConnector()
    try:
        assert watch(connector) is True
        monkeypatch.setattr(aiohttp, "__version__", UNCHECKED_VERSION)
        other = aiohttp.TCPConnector()
        try:
            before = other._factory
            assert watch(other) is False
            assert other._factory is before
        finally:
            await other.close()
    finally:
        await connector.close()


def test_the_read_size_hook_is_behind_the_same_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read size is lowered on the aiohttp this project locks, and left at asyncio's on
    an aiohttp version the hooks were not checked against.

    Protects: one gate covers every private part the client touches, so an unchecked
    aiohttp runs with none of them.
    """
    checked_transport = SimpleNamespace(max_size=ASYNCIO_READ)
    limit_read_size(_response_on(checked_transport), SMALL_READ)
    monkeypatch.setattr(aiohttp, "__version__", UNCHECKED_VERSION)
    unchecked_transport = SimpleNamespace(max_size=ASYNCIO_READ)
    limit_read_size(_response_on(unchecked_transport), SMALL_READ)

    assert checked_transport.max_size == SMALL_READ
    assert checked() is False
    assert unchecked_transport.max_size == ASYNCIO_READ


def test_a_transport_without_a_read_size_is_left_alone() -> None:
    """A transport that has no ``max_size`` (TLS, another event loop's) gets none.

    Protects: the hook never adds an attribute that nothing reads, and never fails.
    """
    transport = SimpleNamespace()
    limit_read_size(_response_on(transport), SMALL_READ)

    assert vars(transport) == {}
