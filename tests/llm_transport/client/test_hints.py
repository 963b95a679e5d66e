"""Hints on an HTTP status error: what the operator most likely got wrong, and what was sent.

A 404 or 405 means ``endpoint_url`` is not the complete request URL: the message says so and
shows the method and URL that were sent (query values elided but the API version, never the
key). A 400/404/422 whose error is about the model means the endpoint wants a ``model``
member, which this client never sends: the message points to the README's "Works with"
recipes. Other refusals carry no hint, so a hint is never a guess.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import UserMessage
from metacrate_grid_agent.errors import HTTPStatusError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.support import CANARY_KEY

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

HELLO = (UserMessage(content="hello"),)
URL_HINT = "endpoint_url is the complete request URL, usually ending in /chat/completions"
MODEL_HINT = "the endpoint wants a 'model' member, which this client never sends"
WORKS_WITH = 'see "Works with" in the README'


async def _refusal(
    client_factory: ClientFactory, reply: Reply, path: str = "/v1/chat/completions"
) -> tuple[HTTPStatusError, FakeEndpoint]:
    async with FakeEndpoint([reply], path=path) as ep:
        with pytest.raises(HTTPStatusError) as caught:
            await client_factory(ep.url, max_retries=0).complete(HELLO)
    return caught.value, ep


@pytest.mark.parametrize("status", [404, 405])
async def test_a_wrong_url_says_endpoint_url_is_the_request_url_and_what_was_sent(
    client_factory: ClientFactory, status: int
) -> None:
    """A 404/405 names endpoint_url as the complete request URL and shows method and URL.

    The URL is shown by the library's one rule: ``api-version`` (often the cause of a 404)
    as sent, the value of a credential-named parameter (here the key itself, and a
    signature) hidden; nothing is retried.
    """
    query = f"api-version=2024-10-21&key={CANARY_KEY}&sig=Zx81sigvalue"
    path = f"/openai/deployments/m/chat?{query}"
    error, ep = await _refusal(client_factory, Reply.error(status, "Not Found"), path)
    assert error.status == status
    assert URL_HINT in str(error)
    assert str(error).endswith(
        f"sent: POST {ep.origin}/openai/deployments/m/chat"
        "?api-version=2024-10-21&key=[REDACTED]&sig=[REDACTED])"
    )
    assert "Zx81sigvalue" not in str(error)
    assert MODEL_HINT not in str(error)
    assert CANARY_KEY not in str(error)
    assert CANARY_KEY.encode() not in pickle.dumps(error)
    assert [(r.method, r.target) for r in ep.requests] == [("POST", path)]


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(
            Reply.error(
                400,
                "/chat/completions: Invalid model name passed in model=None. "
                "Call `/v1/models` to view available models for your key.",
                type="invalid_request_error",
                code="400",
            ),
            id="litellm-400",
        ),
        pytest.param(
            Reply.error(400, "you must provide a model parameter", type="invalid_request_error"),
            id="openai-400",
        ),
        pytest.param(
            Reply.json(
                {"detail": [{"loc": ["body", "model"], "msg": "Field required"}]},
                status=422,
            ),
            id="fastapi-422",
        ),
        pytest.param(
            Reply.json({"error": "model 'llama3' not found, try pulling it first"}, status=404),
            id="ollama-404",
        ),
    ],
)
async def test_an_error_about_the_model_points_to_the_works_with_recipes(
    client_factory: ClientFactory, reply: Reply
) -> None:
    """An error about the model says a model member is wanted and never sent, and where to look.

    It replaces the URL hint (the URL reached a server that wants a model), keeps the
    endpoint's own words first, and the request had no ``model`` member indeed.
    """
    error, ep = await _refusal(client_factory, reply)
    message = str(error)
    assert message.startswith(f"the endpoint answered HTTP {reply.status}: ")
    assert MODEL_HINT in message
    assert WORKS_WITH in message
    assert URL_HINT not in message
    assert "model" not in ep.requests[0].json()


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(
            Reply.error(
                400,
                "This model's maximum context length is 4096 tokens. However, you requested "
                "5000 tokens. Please reduce the length of the messages.",
            ),
            id="context-length-mentions-model",
        ),
        pytest.param(Reply.error(400, "messages: Field required"), id="other-400"),
        pytest.param(Reply.error(403, "model access denied"), id="403"),
        pytest.param(Reply.error(500, "model crashed"), id="500"),
    ],
)
async def test_other_refusals_carry_no_hint(client_factory: ClientFactory, reply: Reply) -> None:
    """No hint where none is sure: errors that merely mention a model, other statuses."""
    error, _ = await _refusal(client_factory, reply)
    assert "hint:" not in str(error)


KEY_HINT = "check the key"


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply.error(400, "No connected db."), id="litellm-no-db"),
        pytest.param(Reply.error(401, "Invalid model access key"), id="401-key"),
        pytest.param(
            Reply.error(401, "Authentication Error, Invalid proxy server token passed"),
            id="401-authentication",
        ),
        pytest.param(Reply.error(403, "API key not valid for this route"), id="403-key"),
    ],
)
async def test_a_refusal_about_auth_or_the_gateway_db_hints_at_the_key(
    client_factory: ClientFactory, reply: Reply
) -> None:
    """A 400/401/403 whose body speaks of auth, a key or the gateway's database (LiteLLM
    answers a wrong key with ``No connected db.``) says to check the key and where it came
    from; the endpoint's words come first and the key is never shown."""
    error, _ = await _refusal(client_factory, reply)
    message = str(error)
    assert message.startswith(f"the endpoint answered HTTP {reply.status}: ")
    assert KEY_HINT in message
    assert MODEL_HINT not in message
    assert CANARY_KEY not in message


async def test_a_server_error_naming_a_key_carries_no_key_hint(
    client_factory: ClientFactory,
) -> None:
    """Only a refusal (400, 401, 403) hints at the key: a 500 naming one is the server's own."""
    error, _ = await _refusal(client_factory, Reply.error(500, "cache key collision"))
    assert "hint:" not in str(error)
