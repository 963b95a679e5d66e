"""TLS: certificates are verified, a failed handshake is final, and ca_bundle adds a private CA.

The fake endpoint serves TLS with a certificate from a throwaway trustme CA. The fake only
records a connection once its handshake is done, so handshake attempts are counted on the
server context itself (its SNI callback runs for every ClientHello, with or without a
server name).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import shutil
import socket
import ssl
import struct
import subprocess
import warnings
from typing import TYPE_CHECKING, Final

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


class HandshakeCutter:
    """A TCP server that takes each ClientHello's first bytes, then drops the connection
    without a TLS alert (closed, or reset): a TLS server refusing the client's versions that
    way, or a port that is no TLS server at all. It counts the connections it accepted."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault
        self.hellos = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._cut, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"https://127.0.0.1:{port}/v1/chat/completions"

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _cut(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await reader.read(5):  # a TLS record header: the ClientHello began
            self.hellos += 1
        if self.fault == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()


@pytest.mark.parametrize("fault", ["close", "reset"])
async def test_a_handshake_cut_without_an_alert_says_so(
    client_factory: ClientFactory, fault: Fault
) -> None:
    """A server that takes the ClientHello and drops the connection without a TLS alert is a
    ``tls`` error saying that the TLS handshake was cut, never ``connect`` with "check that
    the server is up" (it is up: it took the connection). Nothing of the request was sent,
    so it is retried like any transport failure before the request, within max_retries."""
    cutter = HandshakeCutter(fault)
    async with cutter as url:
        with pytest.raises(GridAgentError) as caught:
            await client_factory(url, max_retries=2, max_retry_delay_s=0.01).complete(HELLO)
    error = caught.value
    assert type(error) is TLSError
    assert (error.kind, error.retryable, error.attempts) == ("tls", True, 3)
    assert "TLS handshake" in str(error)
    assert "without a TLS alert" in str(error)
    assert "server is up" not in str(error)
    assert cutter.hellos == 3


async def test_a_tls_1_0_only_server_is_a_tls_error(
    client_factory: ClientFactory, ca: trustme.CA, bundle: str
) -> None:
    """A real TLS server that speaks only TLS 1.0 (this client asks for 1.2 at least) is a
    ``tls`` error about the handshake, never ``connect`` with "check that the server is up":
    OpenSSL's server drops such a ClientHello without an alert, or answers with one."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    with warnings.catch_warnings():  # TLS 1.0 is deprecated: that is the point here
        warnings.simplefilter("ignore", DeprecationWarning)
        server.minimum_version = server.maximum_version = ssl.TLSVersion.TLSv1
    async with FakeEndpoint([Reply.completion("never")], ssl_context=server) as ep:
        with pytest.raises(GridAgentError) as caught:
            await client_factory(ep.url, ca_bundle=bundle, max_retries=0).complete(HELLO)
        await ep.wait_all_closed()
    error = caught.value
    assert (type(error), error.kind) == (TLSError, "tls")
    assert "TLS handshake" in str(error)
    assert "server is up" not in str(error)
    assert ep.requests == []


# --- what the environment can change ------------------------------------------------------------

#: The variables other HTTP clients read for their trust or their route; ours reads none
#: (only OpenSSL's own SSL_CERT_FILE and SSL_CERT_DIR, with ca_bundle unset).
IGNORED_TRUST_VARIABLES: Final = ("PYTHONHTTPSVERIFY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
PROXY_VARIABLES: Final = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
)
OPENSSL_VARIABLES: Final = ("SSL_CERT_FILE", "SSL_CERT_DIR")
#: SSL_CERT_DIR holds each CA under its subject hash, which the openssl command computes.
HAVE_OPENSSL: Final = shutil.which("openssl") is not None
needs_openssl = pytest.mark.skipif(
    not HAVE_OPENSSL, reason="needs the openssl command to hash the CA's name"
)


@pytest.fixture
def bare_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No variable that any TLS or HTTP stack reads is set; each test sets its own."""
    for name in (*OPENSSL_VARIABLES, *IGNORED_TRUST_VARIABLES, *PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _hashed_directory(ca: trustme.CA, folder: Path) -> str:
    """``folder`` as OpenSSL's SSL_CERT_DIR wants it: the CA under its subject hash."""
    pem = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    openssl = shutil.which("openssl")
    assert openssl is not None
    found = subprocess.run(  # noqa: S603 - the system's openssl on a file of ours
        [openssl, "x509", "-subject_hash", "-noout", "-in", str(pem)],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    pem.rename(folder / f"{found.stdout.strip()}.0")
    return str(folder)


async def test_ssl_cert_file_chooses_the_trusted_cas_when_ca_bundle_is_unset(
    client_factory: ClientFactory,
    server: CountingServer,
    bundle: str,
    bare_environment: pytest.MonkeyPatch,
) -> None:
    """With ca_bundle unset, SSL_CERT_FILE (OpenSSL's default) names the trusted CAs: the
    private CA it names is trusted, read when the client makes its first connection."""
    bare_environment.setenv("SSL_CERT_FILE", bundle)
    async with FakeEndpoint([Reply.completion("trusted")], ssl_context=server.context) as ep:
        client = client_factory(ep.url)
        assert (await client.complete(HELLO)).text == "trusted"
    assert [c.tls for c in ep.connections] == [True]


@needs_openssl
async def test_ssl_cert_dir_chooses_the_trusted_cas_when_ca_bundle_is_unset(
    client_factory: ClientFactory,
    ca: trustme.CA,
    server: CountingServer,
    tmp_path: Path,
    bare_environment: pytest.MonkeyPatch,
) -> None:
    """With ca_bundle unset, SSL_CERT_DIR (OpenSSL's default) adds a folder of trusted CAs,
    each under its subject hash: the private CA there is trusted."""
    bare_environment.setenv("SSL_CERT_DIR", _hashed_directory(ca, tmp_path))
    async with FakeEndpoint([Reply.completion("trusted")], ssl_context=server.context) as ep:
        client = client_factory(ep.url)
        assert (await client.complete(HELLO)).text == "trusted"
    assert [c.tls for c in ep.connections] == [True]


@pytest.mark.parametrize("name", OPENSSL_VARIABLES)
async def test_openssl_variables_never_turn_verification_off(
    client_factory: ClientFactory,
    server: CountingServer,
    tmp_path: Path,
    bare_environment: pytest.MonkeyPatch,
    name: str,
) -> None:
    """SSL_CERT_FILE or SSL_CERT_DIR naming nothing usable (an empty file, an empty folder)
    trusts nothing more: the private CA's certificate is still refused, once, as ``tls``."""
    empty = tmp_path / "empty"
    if name == "SSL_CERT_FILE":
        empty.write_text("", encoding="utf-8")
    else:
        empty.mkdir()
    bare_environment.setenv(name, str(empty))
    async with FakeEndpoint([Reply.completion("never")], ssl_context=server.context) as ep:
        with pytest.raises(TLSError) as caught:
            await client_factory(ep.url, max_retries=2).complete(HELLO)
        await ep.wait_all_closed()
    assert (caught.value.kind, caught.value.retryable, caught.value.attempts) == ("tls", False, 1)
    assert (ep.connections, ep.requests) == ([], [])


@pytest.mark.parametrize("name", OPENSSL_VARIABLES)
async def test_ca_bundle_set_is_the_only_trust_whatever_the_openssl_variables(
    client_factory: ClientFactory,
    ca: trustme.CA,
    server: CountingServer,
    bundle: str,
    tmp_path: Path,
    *,
    bare_environment: pytest.MonkeyPatch,
    name: str,
) -> None:
    """With ca_bundle set (to another CA), the OpenSSL variables naming the right CA change
    nothing: ca_bundle alone is trusted, and the certificate is refused."""
    if name == "SSL_CERT_FILE":
        bare_environment.setenv(name, bundle)
    else:
        if not HAVE_OPENSSL:
            pytest.skip(reason="needs the openssl command to hash the CA's name")
        bare_environment.setenv(name, _hashed_directory(ca, tmp_path))
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    async with FakeEndpoint([Reply.completion("never")], ssl_context=server.context) as ep:
        with pytest.raises(TLSError):
            await client_factory(ep.url, ca_bundle=str(other), max_retries=0).complete(HELLO)
        await ep.wait_all_closed()
    assert ep.requests == []


@pytest.mark.parametrize("name", IGNORED_TRUST_VARIABLES)
async def test_other_clients_trust_variables_change_nothing(
    client_factory: ClientFactory,
    server: CountingServer,
    bundle: str,
    bare_environment: pytest.MonkeyPatch,
    name: str,
) -> None:
    """PYTHONHTTPSVERIFY=0 turns no verification off, and REQUESTS_CA_BUNDLE or
    CURL_CA_BUNDLE naming the private CA trusts nothing: the certificate is refused once."""
    bare_environment.setenv(name, "0" if name == "PYTHONHTTPSVERIFY" else bundle)
    async with FakeEndpoint([Reply.completion("never")], ssl_context=server.context) as ep:
        with pytest.raises(TLSError) as caught:
            await client_factory(ep.url, max_retries=2).complete(HELLO)
        await ep.wait_all_closed()
    assert (caught.value.kind, caught.value.attempts) == ("tls", 1)
    assert (ep.connections, ep.requests) == ([], [])


@pytest.mark.parametrize("name", PROXY_VARIABLES)
async def test_proxy_variables_change_nothing_under_tls(
    client_factory: ClientFactory,
    server: CountingServer,
    bundle: str,
    bare_environment: pytest.MonkeyPatch,
    name: str,
) -> None:
    """A proxy variable (or NO_PROXY) naming a proxy on loopback reroutes nothing: the call
    goes straight to the TLS endpoint, and the proxy sees no connection."""
    async with FakeEndpoint() as proxy:
        bare_environment.setenv(name, f"http://127.0.0.1:{proxy.port}")
        async with FakeEndpoint([Reply.completion("direct")], ssl_context=server.context) as ep:
            completion = await client_factory(ep.url, ca_bundle=bundle).complete(HELLO)
    assert completion.text == "direct"
    assert [c.tls for c in ep.connections] == [True]
    assert (proxy.connections, proxy.requests) == ([], [])
