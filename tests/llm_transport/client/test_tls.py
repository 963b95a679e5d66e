"""TLS: certificates are verified, a failed handshake is final, and ca_bundle adds a private CA.

The fake endpoint serves TLS with a certificate from a throwaway trustme CA. The fake only
records a connection once its handshake is done, so handshake attempts are counted on the
server context itself (its SNI callback runs for every ClientHello, with or without a
server name).
"""

from __future__ import annotations

import dataclasses
import datetime
import ssl
from typing import TYPE_CHECKING

import pytest
import trustme

from metacrate_grid_agent import LLMClient, UserMessage
from metacrate_grid_agent.errors import GridAgentError, TLSError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.support import make_config

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from metacrate_grid_agent.testing._fake_wire import Fault
    from tests.llm_transport.conftest import ClientFactory

HELLO = (UserMessage(content="hello"),)


class CountingServer:
    """A TLS server context for one certificate, counting the handshakes it is asked for."""

    def __init__(self, cert: trustme.LeafCert) -> None:
        self.hellos: list[str | None] = []
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(self.context)
        self.context.sni_callback = self._hello

    def _hello(self, _sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        self.hellos.append(name)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """A private CA that no system trust store knows."""
    return trustme.CA()


@pytest.fixture
def bundle(ca: trustme.CA, tmp_path: Path) -> str:
    """The CA certificate written as a PEM file, for ca_bundle."""
    path = tmp_path / "private-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
def server(ca: trustme.CA) -> CountingServer:
    """A server context with a certificate for 127.0.0.1, issued by the private CA."""
    return CountingServer(ca.issue_cert("127.0.0.1"))


async def test_an_untrusted_certificate_is_refused_once(
    client_factory: ClientFactory, server: CountingServer
) -> None:
    """Without the CA, the handshake fails as TLSError: one attempt, never retried, no request."""
    async with FakeEndpoint([Reply.completion("never")], ssl_context=server.context) as ep:
        assert ep.url.startswith("https://127.0.0.1:")
        with pytest.raises(GridAgentError) as caught:
            await client_factory(ep.url, max_retries=3).complete(HELLO)
        await ep.wait_all_closed()
    error = caught.value
    assert type(error) is TLSError
    assert (error.kind, error.retryable, error.attempts) == ("tls", False, 1)
    assert len(server.hellos) == 1
    assert (ep.connections, ep.requests) == ([], [])
    assert ep.pending_replies == 1


async def test_a_certificate_from_the_ca_bundle_is_trusted(
    client_factory: ClientFactory, server: CountingServer, bundle: str
) -> None:
    """With ca_bundle naming the private CA, calls succeed over TLS: one handshake for two calls."""
    async with FakeEndpoint(
        [Reply.completion("secure"), Reply.completion("again")], ssl_context=server.context
    ) as ep:
        client = client_factory(ep.url, ca_bundle=bundle)
        texts = [(await client.complete(HELLO)).text, (await client.complete(HELLO)).text]
    assert texts == ["secure", "again"]
    assert [c.tls for c in ep.connections] == [True]
    assert [r.connection_id for r in ep.requests] == [0, 0]
    assert len(server.hellos) == 1


def _expired(ca: trustme.CA) -> trustme.LeafCert:
    now = datetime.datetime.now(datetime.UTC)
    return ca.issue_cert(
        "127.0.0.1",
        not_before=now - datetime.timedelta(days=2),
        not_after=now - datetime.timedelta(days=1),
    )


BAD_CERTIFICATES: list[object] = [
    pytest.param(lambda ca: ca.issue_cert("localhost"), id="wrong-host"),
    pytest.param(lambda ca: trustme.CA().issue_cert("127.0.0.1"), id="other-ca"),
    pytest.param(_expired, id="expired"),
]


@pytest.mark.parametrize("issue", BAD_CERTIFICATES)
async def test_a_bad_certificate_is_refused_even_with_the_ca_bundle(
    client_factory: ClientFactory,
    ca: trustme.CA,
    bundle: str,
    issue: Callable[[trustme.CA], trustme.LeafCert],
) -> None:
    """ca_bundle adds trust but no leniency: wrong host, other CA and expiry all fail, once."""
    server = CountingServer(issue(ca))
    async with FakeEndpoint(ssl_context=server.context) as ep:
        with pytest.raises(TLSError) as caught:
            await client_factory(ep.url, ca_bundle=bundle, max_retries=3).complete(HELLO)
        await ep.wait_all_closed()
    assert (caught.value.kind, caught.value.retryable, caught.value.attempts) == ("tls", False, 1)
    assert len(server.hellos) == 1
    assert (ep.connections, ep.requests) == ([], [])


async def test_a_ca_bundle_without_certificates_fails_as_a_library_error(
    tmp_path: Path, server: CountingServer
) -> None:
    """A ca_bundle file that holds no certificate is reported as a GridAgentError (a ConfigError
    when the configuration is built, or a TLSError when called), never as a bare ssl.SSLError."""
    path = tmp_path / "not-a-bundle.pem"
    path.write_text("this is not a certificate\n")
    async with FakeEndpoint(ssl_context=server.context) as ep:
        with pytest.raises(GridAgentError):
            async with LLMClient(make_config(ep.url, ca_bundle=str(path))) as client:
                await client.complete(HELLO)
    assert ep.requests == []


@pytest.mark.parametrize("fault", ["close", "reset"])
@pytest.mark.parametrize("at", [5, 120])
async def test_a_fault_mid_reply_reaches_the_client_at_once_under_tls(
    client_factory: ClientFactory, server: CountingServer, bundle: str, fault: Fault, at: int
) -> None:
    """The fake's faults work under TLS as on plain TCP: the bytes before the fault are sent,
    then the connection is cut, while the client still waits for the rest.

    Protects the test kit: the fake once drained each write with a zero high-water mark,
    which asyncio's TLS transport takes as "pause" even with nothing buffered, so a second
    write waited for the client to send something and the client saw only its own timeout.
    """
    reply = dataclasses.replace(Reply.completion("hello " * 40), fault=fault, fault_at=at)
    async with FakeEndpoint([reply], ssl_context=server.context) as ep:
        with pytest.raises(GridAgentError) as caught:
            await client_factory(
                ep.url, ca_bundle=bundle, max_retries=0, request_timeout_s=8.0
            ).complete(HELLO)
        await ep.wait_all_closed()
        [record] = ep.connections
    assert caught.value.kind in ("malformed_response", "connection_lost"), caught.value
    assert (record.bytes_sent, record.closed_by) == (at, "server")
