"""Fixtures for the loopback suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from metacrate_grid_agent import LLMClient
from tests.llm_transport.support import make_config

ClientFactory = Callable[..., LLMClient]


@pytest.fixture
async def client_factory() -> AsyncIterator[ClientFactory]:
    """Build clients for a URL (closing each at the end of the test)."""
    clients: list[LLMClient] = []

    def build(url: str, **overrides: Any) -> LLMClient:
        client = LLMClient(make_config(url, **overrides))
        clients.append(client)
        return client

    yield build
    for client in clients:
        await client.aclose()
