"""Keys of every shape, echoed by a hostile endpoint in every form, never leave the client.

Each test runs once per canary key (``canary_key``: 64 hex, a JWT, keys with a backslash,
quotes, angle brackets, a percent sign), none of which a credential pattern recognises, so
only the redaction of the configured key hides them. The suite-wide guard fails a test
whose log records show one; :func:`assert_error_clean` checks the error's str, repr,
attributes, pickle and the locals of every library frame of its traceback.
"""

from __future__ import annotations

import dataclasses
import html
import json
import urllib.parse
from collections.abc import Callable

import pytest

from metacrate_grid_agent import LLMClient, LLMConfig, Outcome, Secret, UserMessage
from metacrate_grid_agent.errors import (
    ChoiceError,
    ContentEncodingError,
    DuplicateCallIdError,
    GridAgentError,
    HTTPStatusError,
    InvalidValueError,
    MalformedResponseError,
    RedirectRefusedError,
    ResponseError,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.conftest import assert_error_clean, assert_no_canary
from tests.llm_transport.loop_support import RecordingExecutor, make_loop, run_loop
from tests.llm_transport.support import FAST

HELLO = (UserMessage(content="hello"),)
#: Deep enough that str() of the nesting overflows the interpreter's stack.
DEEP = 988


def config_for(url: str, key: str, **overrides: object) -> LLMConfig:
    """Fast limits, no retries, and this key."""
    settings: dict[str, object] = {**FAST, "max_retries": 0, **overrides}
    return LLMConfig(endpoint_url=url, api_key=Secret(key), **settings)  # type: ignore[arg-type]


def nested(depth: int, key: str) -> bytes:
    """FastAPI's detail list: the key in its message, its ``loc`` nested ``depth`` deep.

    Written as text: Python's own json module cannot encode or decode such depth.
    """
    loc = "[" * depth + "]" * depth
    message, quoted = json.dumps(f"bad key {key}"), json.dumps(key)
    return f'{{"detail":[{{"msg":{message},"loc":["header",{quoted},{loc}]}}]}}'.encode()


def deep_reply(status: int, key: str, *, wrap: bool = False) -> Reply:
    """A JSON reply whose body is :func:`nested`, under an ``error`` member if ``wrap``."""
    body = nested(DEEP, key)
    if wrap:
        body = b'{"error":' + body + b"}"
    return Reply(status=status, headers=(("Content-Type", "application/json"),), body=body)


def _completion_with_call(**changes: object) -> Reply:
    body = json.loads(Reply.completion(tool_calls=[("c-1", "look", "{}")]).body)
    body["choices"][0]["message"]["tool_calls"][0].update(changes)
    return Reply.json(body)


def _head(line: str) -> bytes:
    return (line + "\r\nContent-Length: 0\r\n\r\n").encode("latin-1")


Script = Callable[[str], Reply]
ECHOES: list[tuple[str, Script, type[GridAgentError]]] = [
    ("401-json-message", lambda k: Reply.error(401, f"Incorrect API key {k}."), HTTPStatusError),
    ("400-type-and-code", lambda k: Reply.error(400, "x", type=k, code=k), HTTPStatusError),
    ("401-reason", lambda k: Reply(status=401, reason=f"bad {k}"), HTTPStatusError),
    ("400-deep-detail", lambda k: deep_reply(400, k), HTTPStatusError),
    ("200-deep-error", lambda k: deep_reply(200, k, wrap=True), ResponseError),
    (
        "500-html",
        lambda k: Reply(
            status=500,
            headers=(("Content-Type", "text/html"),),
            body=f"<p>key {k}</p><p>{html.escape(k)}</p><p>{k[:7]}<b>{k[7:]}</b></p>".encode(),
        ),
        HTTPStatusError,
    ),
    (
        "400-split-and-escaped",
        lambda k: Reply.error(
            400, "\u200b".join(k) + " " + k[:9] + "\n" + k[9:] + " " + repr(k) + json.dumps(k)
        ),
        HTTPStatusError,
    ),
    (
        "redirect-location",
        lambda k: Reply.redirect(302, "https://x.example/?k=" + urllib.parse.quote(k, safe="")),
        RedirectRefusedError,
    ),
    (
        "malformed-status-line",
        lambda k: Reply(head=_head(f"HTTP/1.1 2x0 {k}")),
        MalformedResponseError,
    ),
    ("tool-call-type", lambda k: _completion_with_call(type=k), InvalidValueError),
    (
        "duplicate-call-ids",
        lambda k: Reply.completion(tool_calls=[(k, "look", "{}"), (k, "look", "{}")]),
        DuplicateCallIdError,
    ),
    (
        "content-encoding",
        lambda k: dataclasses.replace(Reply.completion("x"), headers=(("Content-Encoding", k),)),
        ContentEncodingError,
    ),
]


@pytest.mark.parametrize(("script", "expected"), [pytest.param(s, e, id=n) for n, s, e in ECHOES])
async def test_an_echoed_canary_never_leaves_the_client(
    canary_key: str, script: Script, expected: type[GridAgentError]
) -> None:
    """Whatever the endpoint echoes, in whatever form, the error raised shows no slice of it."""
    async with (
        FakeEndpoint([script(canary_key)]) as ep,
        LLMClient(config_for(ep.url, canary_key)) as client,
    ):
        with pytest.raises(GridAgentError) as info:
            await client.complete(HELLO)
    assert isinstance(info.value, expected)
    assert_error_clean(info.value)


def _at_stack_depth(frames: int, client: LLMClient) -> object:
    if frames == 0:
        return client.complete(HELLO)
    return _at_stack_depth(frames - 1, client)


@pytest.mark.parametrize(
    ("status", "wrap", "expected"),
    [
        pytest.param(400, False, HTTPStatusError, id="400"),
        pytest.param(200, True, ResponseError, id="200-error"),
    ],
)
async def test_a_deeply_nested_error_body_is_a_typed_error_at_any_depth(
    canary_key: str,
    status: int,
    wrap: bool,
    expected: type[GridAgentError],
) -> None:
    """However deep the body and the caller's stack, complete raises our typed error only.

    The overflow window of the audit moved with stack depth, so the call is made from a
    range of depths (the deepest make the decoder itself give up: invalid_value).
    """
    replies = [deep_reply(status, canary_key, wrap=wrap)] * 10
    async with (
        FakeEndpoint(replies) as ep,
        LLMClient(config_for(ep.url, canary_key)) as client,
    ):
        for frames in range(0, 100, 10):
            with pytest.raises(GridAgentError) as info:
                await _at_stack_depth(frames, client)  # type: ignore[misc]
            assert isinstance(info.value, expected)
            assert_error_clean(info.value)


async def test_a_deeply_nested_error_body_ends_the_loop_with_an_http_status_outcome(
    canary_key: str,
) -> None:
    """ToolLoop.run returns http_status for it, with an error that shows no key."""
    reply = deep_reply(400, canary_key)
    async with (
        FakeEndpoint([reply]) as ep,
        LLMClient(config_for(ep.url, canary_key)) as client,
    ):
        run = await run_loop(make_loop(client, RecordingExecutor()))
    assert run.result.outcome is Outcome.HTTP_STATUS
    assert isinstance(run.result.error, HTTPStatusError)
    assert_error_clean(run.result.error)
    assert_no_canary(repr(run.result), *(repr(event) for event in run.events))


async def test_the_client_exit_redacts_whatever_a_lower_layer_let_through(
    canary_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """complete()'s one exit redacts the key from any error, in any letter case.

    Defence in depth: a lower layer that forgot to redact (here, a decoder quoting the reply
    raw) must still not leak the key through the error the caller gets.
    """
    from metacrate_grid_agent._core import _wire

    def careless(body: bytes, *args: object, **kwargs: object) -> object:
        raise ChoiceError(f"the reply says {canary_key} / {canary_key.upper()}", path="$")

    monkeypatch.setattr(_wire, "decode_reply", careless)
    async with (
        FakeEndpoint([Reply.completion("x")]) as ep,
        LLMClient(config_for(ep.url, canary_key)) as client,
    ):
        with pytest.raises(ChoiceError) as info:
            await client.complete(HELLO)
    assert "[REDACTED]" in str(info.value)
    assert_error_clean(info.value)
