"""Hostile endpoints and executors: echoed keys, broken error bodies, odd observations.

Each case here was found by probing the library as an attacker would; each test fails if
the hole reopens.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import traceback
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import LLMClient, Outcome, Success, UserMessage
from metacrate_grid_agent.errors import (
    ContentEncodingError,
    DuplicateCallIdError,
    GridAgentError,
    HTTPStatusError,
    InvalidValueError,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    RecordingExecutor,
    Step,
    call,
    calls_reply,
    make_loop,
    run_loop,
)
from tests.llm_transport.support import CANARY_KEY, head_length, make_config

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

MESSAGES = [UserMessage(content="hello")]


def assert_no_key_anywhere(error: GridAgentError) -> None:
    """The key, in any letter case, is in no text, attribute, pickle or traceback."""
    texts = [
        str(error),
        repr(error),
        repr(vars(error)),
        pickle.dumps(error).decode("latin-1"),
        *library_locals(error),
    ]
    for text in texts:
        assert CANARY_KEY.lower() not in text.lower()


def library_locals(error: BaseException) -> list[str]:
    """The reprs of the local variables of the library's frames in ``error``'s traceback.

    What an error reporter capturing locals would show (the test's own frames, which hold
    the scripted key, are left out).
    """
    return [
        f"{name} = {value!r}"
        for frame, _ in traceback.walk_tb(error.__traceback__)
        if "metacrate_grid_agent" in frame.f_code.co_filename
        for name, value in frame.f_locals.items()
    ]


def _completion_with(**changes: object) -> Reply:
    body = json.loads(Reply.completion(tool_calls=[("c-1", "look", "{}")]).body)
    body["choices"][0]["message"]["tool_calls"][0].update(changes)
    return Reply.json(body)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(_completion_with(type=CANARY_KEY), InvalidValueError, id="tool-call-type"),
        pytest.param(
            Reply.completion(tool_calls=[(CANARY_KEY, "look", "{}"), (CANARY_KEY, "look", "{}")]),
            DuplicateCallIdError,
            id="duplicate-ids",
        ),
        pytest.param(
            dataclasses.replace(Reply.completion("x"), headers=(("Content-Encoding", CANARY_KEY),)),
            ContentEncodingError,
            id="content-encoding",
        ),
        pytest.param(
            Reply(
                status=400,
                headers=(("Content-Type", "application/json"),),
                body=b'{"received": "' + CANARY_KEY.replace("-", "\\u002d").encode() + b'"}',
            ),
            HTTPStatusError,
            id="unicode-escaped-in-error-body",
        ),
    ],
)
async def test_an_echoed_key_never_reaches_an_error(
    client_factory: ClientFactory, reply: Reply, expected: type[GridAgentError]
) -> None:
    """Whatever the endpoint quotes back (ids, types, headers, escaped JSON) is redacted."""
    async with FakeEndpoint([reply]) as ep:
        with pytest.raises(expected) as info:
            await client_factory(ep.url, max_retries=0).complete(MESSAGES)
    assert_no_key_anywhere(info.value)


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(
            Reply.error(401, "bad key", headers=(("Content-Length", "500"),)),
            id="body-shorter-than-content-length",
        ),
        pytest.param(
            dataclasses.replace(Reply.error(400, "bad request"), stall_at=(0, 10.0)),
            id="body-stalls",
        ),
    ],
)
async def test_a_broken_error_body_keeps_the_status_and_is_not_retried(
    client_factory: ClientFactory, reply: Reply
) -> None:
    """A 4xx whose body breaks off or stalls is still that 4xx: never retried as transport.

    Retrying would send the key again to an endpoint that just refused it.
    """
    if reply.stall_at is not None:
        reply = dataclasses.replace(reply, stall_at=(head_length(reply) + 2, 10.0))
    async with FakeEndpoint([reply, reply, reply]) as ep:
        client = client_factory(ep.url, max_retries=2, response_idle_timeout_s=0.3)
        with pytest.raises(HTTPStatusError) as info:
            await client.complete(MESSAGES)
    assert info.value.status == reply.status
    assert info.value.retryable is False
    assert len(ep.requests) == 1


async def test_a_client_holds_its_key_out_of_reach(client_factory: ClientFactory) -> None:
    """No repr of the client's state shows the key, and the client refuses to pickle."""
    client = client_factory("http://127.0.0.1:9/v1/chat/completions")
    assert CANARY_KEY not in repr(client)
    assert CANARY_KEY not in repr(vars(client))
    with pytest.raises(TypeError):
        pickle.dumps(client)


async def test_a_refused_connection_error_has_no_key_in_its_traceback_locals() -> None:
    """Error reporters that capture locals (Sentry, rich) see no key in any frame."""
    async with LLMClient(make_config("http://127.0.0.1:9/v1/chat/completions")) as client:
        with pytest.raises(GridAgentError) as info:
            await client.complete(MESSAGES)
    assert_no_key_anywhere(info.value)


async def test_a_key_echoed_as_a_reused_call_id_is_not_quoted_by_the_loop(
    client_factory: ClientFactory,
) -> None:
    """The loop's own duplicate-id error names positions, never the endpoint's id text."""
    script = [calls_reply(call(CANARY_KEY, "look")), calls_reply(call(CANARY_KEY, "look"))]
    async with FakeEndpoint(script) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), RecordingExecutor()))
    assert run.result.outcome is Outcome.DUPLICATE_CALL_ID
    assert run.result.error is not None
    assert_no_key_anywhere(run.result.error)


@pytest.mark.parametrize(
    ("observation", "expected"),
    [
        pytest.param("seen \ud800 here", "seen ? here", id="lone-surrogate"),
        pytest.param(None, "returned an observation of type NoneType, not str", id="none"),
    ],
)
async def test_an_odd_observation_never_loses_the_result(
    client_factory: ClientFactory, observation: object, expected: str
) -> None:
    """Text a tool decoded leniently, or no text at all, still gives a result and a request."""
    executor = RecordingExecutor({"l-1": Step(outcome=Success(observation))})  # type: ignore[arg-type]
    script = [calls_reply(call("l-1", "look")), Reply.completion("done")]
    async with FakeEndpoint(script) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))
    assert run.result.outcome is Outcome.COMPLETED
    assert expected in run.result.calls[0].observation
    assert (
        ep.requests[1].json()["messages"][-1]["content"].endswith(expected.rsplit(maxsplit=1)[-1])
    )
