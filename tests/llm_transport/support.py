"""Shared helpers for the loopback suite: a canary key and configurations for a fake endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import LLMConfig, Secret
from metacrate_grid_agent.testing._fake_wire import render_reply

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from metacrate_grid_agent.testing import Reply

#: The key every test uses; it must never appear anywhere but the Authorization header.
CANARY_KEY = "sk-CANARY-7f3a9c1e5b2d4086a1b3c5d7e9f20468"

#: Short but not tiny limits: tests use them against much longer stalls, never near them.
FAST: dict[str, Any] = {
    "connect_timeout_s": 2.0,
    "request_timeout_s": 5.0,
    "response_idle_timeout_s": 5.0,
    "total_timeout_s": 10.0,
    "max_retry_delay_s": 0.05,
}


def make_config(url: str, **overrides: Any) -> LLMConfig:
    """A configuration for ``url`` with the canary key and fast limits, overridable."""
    settings: dict[str, Any] = {**FAST, **overrides}
    return LLMConfig(endpoint_url=url, api_key=Secret(CANARY_KEY), **settings)


def head_length(reply: Reply) -> int:
    """Bytes of `reply` before its body: the status line and the headers."""
    return len(render_reply(reply, client_wants_close=False).raw) - len(reply.body)


PROBE_S = 0.3
"""How long a filler connection may stay unanswered before the accept queue counts as full."""
MAX_FILLERS = 16
"""Bound on the connections opened to fill the accept queue (listen(0) holds one or two)."""


@contextlib.asynccontextmanager
async def unanswered_listener() -> AsyncIterator[str]:
    """Yield a loopback URL whose SYNs get no answer, so a connect can only time out.

    The socket listens with a backlog of 0 and never accepts; filler connections complete
    until the accept queue is full, which shows as a filler left unanswered for `PROBE_S`.
    From then on the kernel drops every SYN to the port (no RST: the connect just hangs).
    """
    loop = asyncio.get_running_loop()
    sockets: list[socket.socket] = []
    try:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sockets.append(listener)
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        for _ in range(MAX_FILLERS):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(filler)
            filler.setblocking(False)
            try:
                async with asyncio.timeout(PROBE_S):
                    await loop.sock_connect(filler, address)
            except TimeoutError:
                break
        else:
            pytest.skip(
                reason=f"this kernel answered {MAX_FILLERS} connections to a listen(0) socket that "
                "never accepts; the connect-timeout mapping is still pinned by "
                "test_translate_maps_the_http_layers_timeouts"
            )
        yield f"http://127.0.0.1:{address[1]}/v1/chat/completions"
    finally:
        for sock in sockets:
            sock.close()
