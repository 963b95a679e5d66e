"""What ``McpServer`` refuses when built, before any server is started."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

from metacrate_grid_agent.errors import ConfigError
from metacrate_grid_agent.mcp import McpServer

BEARER = {"Authorization": "Bearer mcp-secret-0c1d"}


def test_cleartext_http_with_a_credential_to_a_remote_host_is_refused() -> None:
    """An ``http://`` URL to a non-loopback host with an Authorization header is refused.

    Protects: the same rule as ``LLMConfig``: a credential never crosses the network in
    cleartext unless the operator opts in (``allow_insecure_http=True``); the problem names
    the field and the way out, and quotes neither the URL nor the header.
    """
    with pytest.raises(ConfigError) as caught:
        McpServer.http("market", "http://market.example.net/mcp", headers=BEARER)
    text = str(caught.value)
    assert "mcp.market.url" in text
    assert "allow_insecure_http" in text
    assert "mcp-secret" not in text
    assert "example.net" not in text
    allowed = McpServer.http(
        "market", "http://market.example.net/mcp", headers=BEARER, allow_insecure_http=True
    )
    assert allowed.allow_insecure_http is True
    for url in ("http://127.0.0.1:8080/mcp", "http://localhost/mcp", "https://m.example.net/"):
        assert McpServer.http("market", url, headers=BEARER).url == url
    assert McpServer.http("market", "http://market.example.net/mcp").headers is None
