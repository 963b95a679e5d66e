"""The HTTP side of the MCP adapter reaches one exact URL, with bounded, plain bodies.

The loopback fake endpoint plays a hostile HTTP server: it redirects, sends oversized or
compressed bodies and sets cookies; the tests assert on what it recorded.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import urlsplit

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

import httpx2

from metacrate_grid_agent.errors import ConnectError
from metacrate_grid_agent.mcp import McpLimits, McpServer, McpToolset
from metacrate_grid_agent.mcp._http import MIN_RECONNECT_S, exact_url_client
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply

LIMIT = 64 * 1024
TOKEN = "mcp-secret-7c1d"


def client_for(url: str) -> httpx2.AsyncClient:
    """The adapter's HTTP client for ``url``, with short limits."""
    return exact_url_client(
        url,
        headers={"Authorization": "Bearer mcp-test-token"},
        connect_timeout_s=2.0,
        read_timeout_s=5.0,
        max_response_bytes=LIMIT,
    )


def redirect_elsewhere(request: RecordedRequest) -> Reply:
    """Every request is sent to another path of the same origin."""
    return Reply.redirect(307, "/elsewhere")


async def test_redirects_are_refused_and_only_the_url_is_requested(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server that redirects (even within its origin) cannot start; nothing else is asked.

    Protects: the adapter never follows a redirect (the SDK would, within the origin):
    every request the server received went to the configured path. The start-up error
    names the server but holds no header: no message, repr, log line or exception context
    carries the configured authorization.
    """
    caplog.set_level(logging.DEBUG)
    async with FakeEndpoint(responder=redirect_elsewhere) as ep:
        server = McpServer.http("hostile", ep.url, headers={"Authorization": f"Bearer {TOKEN}"})
        with pytest.raises(ConnectError, match="could not be started") as caught:
            async with McpToolset([server], limits=McpLimits(startup_timeout_s=5.0)):
                pass  # pragma: no cover - start-up fails
        targets = {request.target for request in ep.requests}
    assert ep.requests
    assert targets == {urlsplit(ep.url).path}
    assert ep.requests[0].header("Authorization") == f"Bearer {TOKEN}"
    error = caught.value
    assert error.__context__ is None
    assert error.__cause__ is None
    for text in (str(error), repr(error), repr(server), caplog.text):
        assert TOKEN not in text


async def test_other_urls_are_refused_before_sending() -> None:
    """A request for another path, port or host never leaves the client.

    Protects: the exact-URL rule holds at the transport, whatever the SDK asks for.
    """
    async with FakeEndpoint(responder=lambda _: Reply.json({})) as ep:
        origin = ep.origin
        async with client_for(ep.url) as client:
            for other in (f"{origin}/elsewhere", f"{ep.url}?x=1", "http://127.0.0.2:9/"):
                with pytest.raises(httpx2.UnsupportedProtocol, match="other than the configured"):
                    await client.post(other, json={})
            response = await client.post(ep.url, json={})
    assert response.status_code == 200
    assert len(ep.requests) == 1


async def test_response_bodies_are_capped() -> None:
    """A body past max_response_bytes is an error, not a buffer that grows.

    Protects: a hostile server cannot make the client hold an unbounded body.
    """
    big = Reply(
        headers=(("Content-Type", "application/json"),), body=b'{"x": "' + b"y" * 4 * LIMIT + b'"}'
    )
    async with FakeEndpoint(responder=lambda _: big) as ep, client_for(ep.url) as client:
        with pytest.raises(httpx2.ReadError, match="max_response_bytes"):
            await client.post(ep.url, json={})


async def test_compressed_bodies_are_refused_and_identity_is_asked_for() -> None:
    """The client asks for identity and refuses a Content-Encoding it did not ask for.

    Protects: no body is ever decompressed (a small gzip body can expand past any cap).
    """
    gzip = Reply(headers=(("Content-Encoding", "gzip"),), body=b"\x1f\x8b")
    async with FakeEndpoint(responder=lambda _: gzip) as ep, client_for(ep.url) as client:
        with pytest.raises(httpx2.RemoteProtocolError, match="compressed"):
            await client.post(ep.url, json={})
    assert ep.requests[0].header("Accept-Encoding") == "identity"


async def test_no_cookie_is_kept_and_no_proxy_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Set-Cookie is dropped; proxy variables in the environment are ignored.

    Protects: the adapter's HTTP client carries no state between requests and talks to the
    server directly, like the model transport.
    """
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    cookie = Reply.json({}, headers=(("Set-Cookie", "session=abc; Path=/"),))
    async with FakeEndpoint(responder=lambda _: cookie) as ep, client_for(ep.url) as client:
        first = await client.post(ep.url, json={})
        await client.post(ep.url, json={})
    assert "set-cookie" not in first.headers
    assert len(client.cookies) == 0
    assert [request.header("Cookie") for request in ep.requests] == [None, None]
    assert ep.requests[0].header("Authorization") == "Bearer mcp-test-token"


def test_a_credential_in_the_server_url_is_in_no_repr() -> None:
    """The server's repr shows its URL by the one rule for credentials in a URL: a query
    parameter named like a credential and any user-info are hidden; the rest is shown."""
    server = McpServer.http("s", f"http://127.0.0.1:9/mcp?api-key={TOKEN}&mode=fast")
    shown = repr(server)
    assert TOKEN not in shown
    assert "mode=fast" in shown
    assert shown.startswith("McpServer(label='s', transport='http'")


@pytest.mark.parametrize(
    ("reply", "cause"),
    [
        (Reply(status=401, body=b"no"), "HTTP status 401"),
        (Reply.redirect(307, "/elsewhere"), "HTTP status 307: redirect refused"),
    ],
)
async def test_a_start_up_error_names_its_cause_and_no_header(reply: Reply, cause: str) -> None:
    """A refused or redirected start-up says so (status, "redirect refused"), no header.

    Protects: the operator learns why a server did not start without the configured
    authorization ever reaching a message.
    """
    async with FakeEndpoint(responder=lambda _: reply) as ep:
        server = McpServer.http("hostile", ep.url, headers={"Authorization": f"Bearer {TOKEN}"})
        with pytest.raises(ConnectError) as caught:
            async with McpToolset([server], limits=McpLimits(startup_timeout_s=5.0)):
                pass  # pragma: no cover - start-up fails
    text = str(caught.value)
    assert f"MCP server 'hostile' could not be started ({cause})" == text
    assert TOKEN not in text


async def test_the_background_stream_is_never_opened() -> None:
    """A GET without ``Last-Event-ID`` (the unused background stream) never leaves the client.

    Protects: a server that ends that stream with ``retry: 0`` cannot make the client
    reconnect in a tight loop: the client answers itself 405, as a server without the
    stream would, and the SDK stops after its few attempts. A resumption GET (with
    ``Last-Event-ID``) is still sent.
    """
    async with FakeEndpoint(responder=lambda _: Reply.json({})) as ep:
        async with client_for(ep.url) as client:
            background = await client.get(ep.url, headers={"Accept": "text/event-stream"})
            resumed = await client.get(ep.url, headers={"Last-Event-ID": "7"})
        methods = [(request.method, request.header("Last-Event-ID")) for request in ep.requests]
    assert (background.status_code, resumed.status_code) == (405, 200)
    assert methods == [("GET", "7")]


@pytest.mark.slow
async def test_resumption_gets_back_off_whatever_retry_the_server_sends() -> None:
    """Back-to-back resumption GETs wait a minimum delay that doubles; nothing loops tight.

    Protects: a server ending its streams with ``retry: 0`` cannot drive the client into a
    tight reconnect loop: the exact-URL transport spaces resumption GETs itself.
    """
    async with FakeEndpoint(responder=lambda _: Reply.json({})) as ep:
        async with client_for(ep.url) as client:
            started = time.monotonic()
            for _ in range(3):
                await client.get(ep.url, headers={"Last-Event-ID": "7"})
            elapsed = time.monotonic() - started
        count = len(ep.requests)
    assert count == 3
    # The second waits the minimum, the third twice that (less the timer's resolution).
    assert elapsed >= MIN_RECONNECT_S * (1 + 2) - 0.01
