"""The one reading of a URL: what the check, `shown_url`, the client and tracing share.

`parse_url` is pure; every user reads the same parts from it, so the URL the check accepts
is the URL the client connects to and the request-target it sends, byte for byte.
"""

from __future__ import annotations

from typing import Final

import pytest

from metacrate_grid_agent._settings import URLParts, parse_url
from metacrate_grid_agent.config import INVALID_URL, shown_url

CASES: Final = [
    pytest.param(
        "https://api.example.com/v1/chat/completions",
        URLParts("https", "api.example.com", 443, False, "/v1/chat/completions",
                 "api.example.com", False, False),
        id="https-default-port",
    ),
    pytest.param(
        "http://127.0.0.1:8080/v1/chat/completions?api-version=1&x=a%2Fb",
        URLParts("http", "127.0.0.1", 8080, True, "/v1/chat/completions?api-version=1&x=a%2Fb",
                 "127.0.0.1:8080", False, False),
        id="explicit-port-and-query",
    ),
    pytest.param(
        "https://Host.Example:443",
        URLParts("https", "host.example", 443, True, "/", "host.example", False, False),
        id="empty-path-and-default-port-given",
    ),
    pytest.param(
        "http://[::1]:9/a//b?",
        URLParts("http", "::1", 9, True, "/a//b?", "[::1]:9", False, False),
        id="ipv6-double-slash-empty-query",
    ),
    pytest.param(
        "https://user:pw@h.example/x/%E2%82%AC#frag",
        URLParts("https", "h.example", 443, False, "/x/%E2%82%AC", "h.example", True, True),
        id="userinfo-and-fragment",
    ),
    pytest.param(
        "https://bücher.example/é",
        URLParts("https", "bücher.example", 443, False, "/%C3%A9", "xn--bcher-kva.example",
                 False, False),
        id="idna-host-and-non-ascii-path",
    ),
    pytest.param(
        "ftp://files.example/x",
        URLParts("ftp", "files.example", None, False, "/x", "files.example", False, False),
        id="another-scheme",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("url", "expected"), CASES)
def test_a_url_is_read_into_its_parts(url: str, expected: URLParts) -> None:
    """Scheme, host, port (explicit or the scheme's), the exact request-target (only
    non-ASCII percent-encoded), the Host value, and whether user-info or a fragment is there."""
    assert parse_url(url) == expected


@pytest.mark.parametrize(
    "url", ["http://h.example:port/x", "http://h.example:99999/x", "http://[::1/x"]
)
def test_a_url_that_does_not_parse_raises_and_is_never_shown(url: str) -> None:
    """A bad port or host raises ValueError, and the display rule, which reads the URL the
    same way, shows none of it."""
    with pytest.raises(ValueError, match=r".*"):
        parse_url(url)
    assert shown_url(url) == INVALID_URL
