"""Redirects are refused, never followed, so the key goes to the configured URL and nowhere else.

A second loopback endpoint with an empty script stands in for the redirect target: if the
client followed a Location it would connect there (and the empty script would also fail
the test loudly). Retries are enabled throughout, to show that a redirect is not a
transient failure that a retry could "follow" either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import UserMessage
from metacrate_grid_agent.errors import GridAgentError, HTTPStatusError, RedirectRefusedError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.support import CANARY_KEY

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

HELLO = (UserMessage(content="hello"),)
STATUSES = [pytest.param(status, id=str(status)) for status in (301, 302, 303, 307, 308)]


async def refused(client_factory: ClientFactory, url: str) -> RedirectRefusedError:
    """Call `url` with retries on; the call must fail with RedirectRefusedError."""
    client = client_factory(url, max_retries=3)
    with pytest.raises(GridAgentError) as caught:
        await client.complete(HELLO, request_id="redirect-1")
    assert type(caught.value) is RedirectRefusedError
    return caught.value


@pytest.mark.parametrize("status", STATUSES)
async def test_a_cross_origin_redirect_is_refused_and_never_followed(
    client_factory: ClientFactory, status: int
) -> None:
    """A Location on another origin is not contacted: no connection, no request, no key there."""
    async with FakeEndpoint() as target:
        location = target.url + "?moved=1"
        async with FakeEndpoint([Reply.redirect(status, location)]) as ep:
            error = await refused(client_factory, ep.url)
    assert (error.kind, error.status, error.retryable) == ("redirect_refused", status, False)
    assert (error.request_id, error.attempts, error.location) == ("redirect-1", 1, location)
    assert len(ep.requests) == 1
    assert (target.connections, target.requests) == ([], [])


@pytest.mark.parametrize("status", STATUSES)
async def test_a_same_origin_redirect_is_refused_and_never_followed(
    client_factory: ClientFactory, status: int
) -> None:
    """A Location on the same endpoint (another path) is not requested: one request in all."""
    async with FakeEndpoint([Reply.redirect(status, "/v2/chat/completions")]) as ep:
        error = await refused(client_factory, ep.url)
    assert (error.kind, error.status, error.retryable) == ("redirect_refused", status, False)
    assert error.location == "/v2/chat/completions"
    assert [r.target for r in ep.requests] == ["/v1/chat/completions"]


@pytest.mark.parametrize(
    "location",
    [
        pytest.param("same-url", id="loop-to-itself"),
        pytest.param("", id="empty-location"),
        pytest.param("http://[::1", id="unparseable-location"),
    ],
)
async def test_odd_locations_are_refused_without_a_second_request(
    client_factory: ClientFactory, location: str
) -> None:
    """A redirect to the same URL, or with a broken Location, is refused after one request."""
    async with FakeEndpoint(responder=lambda _: Reply.redirect(307, given)) as ep:
        given = ep.url if location == "same-url" else location
        error = await refused(client_factory, ep.url)
    assert (error.status, error.retryable) == (307, False)
    assert len(ep.requests) == 1


async def test_a_redirect_without_location_is_refused(client_factory: ClientFactory) -> None:
    """A 3xx without a Location header is refused the same way, with no location kept."""
    async with FakeEndpoint([Reply(status=302)]) as ep:
        error = await refused(client_factory, ep.url)
    assert (error.status, error.location) == (302, None)
    assert len(ep.requests) == 1


async def test_a_refused_redirect_keeps_a_scrubbed_short_location(
    client_factory: ClientFactory,
) -> None:
    """The kept Location is cut short and has the key (echoed in its query) redacted."""
    location = f"https://elsewhere.example/v1?key={CANARY_KEY}&pad=" + "p" * 1000
    async with FakeEndpoint([Reply.redirect(302, location)]) as ep:
        error = await refused(client_factory, ep.url)
    assert error.location is not None
    assert error.location.startswith("https://elsewhere.example/v1?key=[REDACTED]&pad=ppp")
    assert len(error.location) <= 200
    assert CANARY_KEY not in repr(error)
    assert len(ep.requests) == 1


async def test_a_refused_redirect_shows_its_location_by_the_one_url_rule(
    client_factory: ClientFactory,
) -> None:
    """A Location that repeats the operator's query credential (``code=``, a user-info) has
    them hidden like every URL the library shows; its other parameters are kept."""
    secret = "qs-7Hd93kPzQ0vW5mXc"
    location = f"https://u:{secret}@elsewhere.example/v1/?code={secret}&route=eu"
    async with FakeEndpoint([Reply.redirect(301, location)]) as ep:
        error = await refused(client_factory, ep.url)
    expected = "https://[REDACTED]@elsewhere.example/v1/?code=[REDACTED]&route=eu"
    assert error.location == expected
    assert secret not in str(error) + repr(error)


async def test_a_304_is_not_called_a_redirect(client_factory: ClientFactory) -> None:
    """A 304 Not Modified answers a conditional request, which this client never sends: it
    is refused once as an HTTP status (not retried, body never read) and described as what
    it is, with the likely cause (a cache or proxy answering), never as "a redirect"."""
    async with FakeEndpoint([Reply(status=304)] * 4) as ep:
        client = client_factory(ep.url, max_retries=3)
        with pytest.raises(GridAgentError) as caught:
            await client.complete(HELLO)
    error = caught.value
    assert type(error) is HTTPStatusError
    assert (error.kind, error.status, error.retryable, error.attempts) == (
        "http_status",
        304,
        False,
        1,
    )
    assert "redirect" not in str(error)
    assert "304 Not Modified" in str(error)
    assert "conditional request" in str(error)
    assert len(ep.requests) == 1
