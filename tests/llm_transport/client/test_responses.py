"""What the client makes of a response, through the real client and the loopback fake.

Fragmentation never changes the result; every malformed or oversized reply is its own
typed error with a kind and a JSON path, raised once (never retried); size caps hold
while reading, before anything is decoded; nothing is decompressed; error bodies become
parsed fields or a short excerpt; reasoning text never reaches the Completion; and a
connection goes back to the pool only after a complete 2xx body.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import pickle
import socket
from typing import TYPE_CHECKING, Any

import hypothesis
import hypothesis.strategies as st
import pytest

from metacrate_grid_agent import Completion, LLMClient, ToolCall, Usage, UserMessage
from metacrate_grid_agent.errors import (
    ChoiceError,
    ContentEncodingError,
    DuplicateCallIdError,
    EmptyChoicesError,
    GridAgentError,
    HTTPStatusError,
    InvalidValueError,
    MalformedJSONError,
    MissingCallIdError,
    MissingMemberError,
    OversizedValueError,
    RedirectRefusedError,
    ResponseError,
    ResponseTooLargeError,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.conftest import counts_socket_reads
from tests.llm_transport.support import make_config

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

HELLO = (UserMessage(content="hello"),)
JSON = (("Content-Type", "application/json"),)
#: A server-side stall far longer than any client limit or test bound it is set against.
LONG_STALL_S = 20.0
MiB = 1024 * 1024

# --- fragmentation ----------------------------------------------------------------------------

TEXT = "héllo → wörld 😀"
REFERENCE = Reply.completion(TEXT, tool_calls=[("call_1", "move", '{"to":"plazá"}')], usage=(5, 7))
EXPECTED = (
    TEXT,
    (ToolCall.create("call_1", "move", '{"to":"plazá"}'),),
    Usage(prompt_tokens=5, completion_tokens=7, total_tokens=12),
    "tool_calls",
)


def head_of(
    body: bytes | None, *headers: tuple[str, str], status: str = "200 OK", content_type: bool = True
) -> bytes:
    """A status line and header block, so tests know its length; with a Content-Length for
    `body` (None: chunked framing)."""
    given = (*(JSON if content_type else ()), *headers)
    lines = [f"HTTP/1.1 {status}", *(f"{n}: {v}" for n, v in given)]
    lines.append("Transfer-Encoding: chunked" if body is None else f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


HEAD = head_of(REFERENCE.body)
STATUS_LINE_END = HEAD.index(b"\r\n")
E_ACUTE = len(HEAD) + REFERENCE.body.index("é".encode())
EMOJI = len(HEAD) + REFERENCE.body.index("😀".encode())
EXPLICIT = Reply(head=HEAD, body=REFERENCE.body)


def outcome(completion: Completion) -> tuple[Any, ...]:
    """The parts of a Completion that come from the response body."""
    return (completion.text, completion.tool_calls, completion.usage, completion.finish_reason)


FRAGMENTED = [
    pytest.param(EXPLICIT, id="whole"),
    pytest.param(dataclasses.replace(EXPLICIT, split_at=(4,)), id="split-in-http-version"),
    pytest.param(dataclasses.replace(EXPLICIT, split_at=(10,)), id="split-in-status-code"),
    pytest.param(
        dataclasses.replace(EXPLICIT, split_at=(STATUS_LINE_END + 1,)), id="split-in-crlf"
    ),
    pytest.param(
        dataclasses.replace(EXPLICIT, split_at=(STATUS_LINE_END + 6,)), id="split-in-header-name"
    ),
    pytest.param(
        dataclasses.replace(EXPLICIT, split_at=(HEAD.index(b"json") + 2,)),
        id="split-in-header-value",
    ),
    pytest.param(
        dataclasses.replace(EXPLICIT, split_at=(len(HEAD) - 2,)), id="split-in-blank-line"
    ),
    pytest.param(dataclasses.replace(EXPLICIT, split_at=(len(HEAD),)), id="split-after-head"),
    pytest.param(dataclasses.replace(EXPLICIT, split_at=(E_ACUTE + 1,)), id="split-in-2-byte-utf8"),
    pytest.param(
        dataclasses.replace(EXPLICIT, split_at=(EMOJI + 1, EMOJI + 2, EMOJI + 3)),
        id="splits-in-4-byte-utf8",
    ),
    pytest.param(
        dataclasses.replace(EXPLICIT, split_at=(3, STATUS_LINE_END + 6, E_ACUTE + 1, EMOJI + 2)),
        id="split-everywhere",
    ),
    pytest.param(
        dataclasses.replace(EXPLICIT, drip_bytes=1, drip_interval_s=0.0001), id="drip-1-byte"
    ),
    pytest.param(dataclasses.replace(REFERENCE, chunked=True), id="chunked"),
    pytest.param(
        dataclasses.replace(REFERENCE, chunked=True, drip_bytes=3, drip_interval_s=0.0001),
        id="chunked-drip-3-bytes",
    ),
    pytest.param(dataclasses.replace(REFERENCE, content_length=False), id="close-delimited"),
]


@pytest.mark.parametrize("reply", FRAGMENTED)
async def test_fragmented_responses_decode_to_the_same_completion(
    client_factory: ClientFactory, reply: Reply
) -> None:
    """However the bytes are cut into writes, the Completion is the same."""
    async with FakeEndpoint([reply]) as ep:
        completion = await client_factory(ep.url).complete(HELLO)
    assert outcome(completion) == EXPECTED
    assert ep.connections[0].writes >= 1 + len(reply.split_at)  # the fake really split it


async def test_multi_chunk_body_with_split_characters_decodes_whole(
    client_factory: ClientFactory,
) -> None:
    """A chunked body of many chunks, cut inside multi-byte characters, decodes whole."""
    text = "é😀" * 12_000  # 72 000 bytes: several 16 KiB chunks, boundaries inside characters
    reply = dataclasses.replace(Reply.completion(text), chunked=True, split_at=(100, 16_500))
    async with FakeEndpoint([reply]) as ep:
        completion = await client_factory(ep.url).complete(HELLO)
    assert completion.text == text


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
    cuts=st.lists(
        st.integers(min_value=1, max_value=len(HEAD) + len(REFERENCE.body) - 1), max_size=6
    )
)
def test_any_split_of_the_response_decodes_the_same(cuts: list[int]) -> None:
    """Property: for any set of cut points, the response decodes to the same Completion."""

    async def run() -> Completion:
        reply = dataclasses.replace(EXPLICIT, split_at=tuple(cuts))
        async with FakeEndpoint([reply]) as ep, LLMClient(make_config(ep.url)) as client:
            return await client.complete(HELLO)

    assert outcome(asyncio.run(run())) == EXPECTED


# --- malformed and oversized replies ----------------------------------------------------------

MESSAGE = "$.choices[0].message"
CALLS = f"{MESSAGE}.tool_calls"


def call_without_id(name: str = "move") -> dict[str, Any]:
    """A tool call with no id member at all."""
    return {"type": "function", "function": {"name": name, "arguments": "{}"}}


MALFORMED = [
    pytest.param(
        Reply(headers=JSON, body=b'{"choices": [{"message": '), {}, MalformedJSONError, "$",
        id="bad-json",
    ),
    pytest.param(
        Reply(headers=JSON, body=b'{"choices":[{"message":{"content":"caf\xe9"}}]}'),
        {}, MalformedJSONError, "$", id="not-utf8",
    ),
    pytest.param(Reply(headers=JSON, body=b""), {}, MalformedJSONError, "$", id="empty-body"),
    pytest.param(
        Reply.json({"choices": []}), {}, EmptyChoicesError, "$.choices", id="empty-choices"
    ),
    pytest.param(
        Reply.json({"id": "x", "object": "chat.completion"}), {}, MissingMemberError, "$.choices",
        id="missing-choices",
    ),
    pytest.param(
        Reply.json({"choices": {"0": {}}}), {}, InvalidValueError, "$.choices",
        id="choices-not-an-array",
    ),
    pytest.param(
        Reply.json({"choices": [{"index": 0, "finish_reason": "stop"}]}), {}, MissingMemberError,
        MESSAGE, id="missing-message",
    ),
    pytest.param(
        Reply.completion(None, extra_message={"content": 42}), {}, InvalidValueError,
        f"{MESSAGE}.content", id="content-not-text",
    ),
    pytest.param(
        Reply.completion("é" * 9), {"max_text_bytes": 16}, OversizedValueError,
        f"{MESSAGE}.content", id="text-over-max_text_bytes",
    ),
    pytest.param(
        Reply.completion(tool_calls=[(f"c{i}", "move", "{}") for i in range(3)]),
        {"max_tool_calls": 2}, OversizedValueError, CALLS, id="too-many-tool-calls",
    ),
    pytest.param(
        Reply.completion(tool_calls=[("call_123456789", "move", "{}")]), {"max_id_length": 8},
        OversizedValueError, f"{CALLS}[0].id", id="id-too-long",
    ),
    pytest.param(
        Reply.completion(tool_calls=[("c1", "move_far", "{}")]), {"max_name_length": 4},
        OversizedValueError, f"{CALLS}[0].function.name", id="name-too-long",
    ),
    pytest.param(
        Reply.completion(
            tool_calls=[("c1", "move", "{}"), ("c2", "say", "{}"), ("c1", "go", "{}")]
        ),
        {}, DuplicateCallIdError, f"{CALLS}[2].id", id="duplicate-ids",
    ),
    pytest.param(
        Reply.completion(tool_calls=[("c1", "move", "{}"), call_without_id()]), {},
        MissingCallIdError, f"{CALLS}[1].id", id="missing-id",
    ),
    pytest.param(
        Reply.completion(tool_calls=[("", "move", "{}")]), {}, MissingCallIdError,
        f"{CALLS}[0].id", id="empty-id",
    ),
    pytest.param(
        Reply.completion(
            tool_calls=[
                {"id": "c1", "type": "retrieval", "function": {"name": "m", "arguments": ""}}
            ]
        ),
        {}, InvalidValueError, f"{CALLS}[0].type", id="tool-type-not-function",
    ),
    pytest.param(
        Reply.completion(tool_calls=[("c1", "", "{}")]), {}, InvalidValueError,
        f"{CALLS}[0].function.name", id="empty-tool-name",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("reply", "overrides", "error", "path"), MALFORMED)
async def test_malformed_and_oversized_replies_raise_their_typed_error_once(
    client_factory: ClientFactory,
    reply: Reply,
    overrides: dict[str, Any],
    error: type[ResponseError],
    path: str,
) -> None:
    """Each bad reply is its own ResponseError with kind and JSON path, and is not retried."""
    async with FakeEndpoint([reply]) as ep:
        client = client_factory(ep.url, max_retries=3, **overrides)
        with pytest.raises(GridAgentError) as caught:
            await client.complete(HELLO, request_id="bad-1")
    raised = caught.value
    assert isinstance(raised, ResponseError)
    assert (type(raised), raised.kind, raised.path) == (error, error.kind, path)
    assert (raised.retryable, raised.request_id, raised.attempts) == (False, "bad-1", 1)
    assert len(ep.requests) == 1


async def test_a_missing_call_id_error_names_the_switch(client_factory: ClientFactory) -> None:
    """The error for a call without id tells the operator about mint_missing_call_ids."""
    async with FakeEndpoint([Reply.completion(tool_calls=[call_without_id()])]) as ep:
        with pytest.raises(MissingCallIdError) as caught:
            await client_factory(ep.url).complete(HELLO)
    assert "mint_missing_call_ids" in str(caught.value)


# --- minted call ids --------------------------------------------------------------------------

MINTABLE = Reply.completion(
    tool_calls=[call_without_id("move"), ("call_given", "say", "{}"), call_without_id("look")]
)


async def mint(request_id: str) -> Completion:
    """One call, on a fresh endpoint and client, whose reply has two calls without ids."""
    async with (
        FakeEndpoint([MINTABLE]) as ep,
        LLMClient(make_config(ep.url, mint_missing_call_ids=True)) as client,
    ):
        return await client.complete(HELLO, request_id=request_id)


async def test_minted_call_ids_are_deterministic_per_request_id() -> None:
    """With the switch on, calls without ids get ids derived from the request id alone."""
    first, again, other = await mint("turn-5"), await mint("turn-5"), await mint("turn-6")
    ids = [call.id for call in first.tool_calls]
    assert [call.name for call in first.tool_calls] == ["move", "say", "look"]
    assert ids[1] == "call_given"
    assert [i.startswith("minted-") for i in ids] == [True, False, True]
    assert first.minted_call_ids == frozenset({ids[0], ids[2]})
    assert len(set(ids)) == 3
    assert [call.id for call in again.tool_calls] == ids
    assert {c.id for c in other.tool_calls}.isdisjoint(first.minted_call_ids)


# --- size caps while reading ------------------------------------------------------------------


@pytest.mark.parametrize(
    "declared", [pytest.param(1025, id="cap+1"), pytest.param(10**12, id="1TB")]
)
async def test_a_content_length_over_the_cap_fails_before_reading(
    client_factory: ClientFactory, declared: int
) -> None:
    """A declared length over max_response_bytes fails on the head alone; the body is never awaited.

    The fake stalls right after the head: the client must close without waiting for a body.
    """
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    )
    reply = Reply(head=head.encode(), stall_at=(len(head), LONG_STALL_S), content_length=False)
    async with FakeEndpoint([reply]) as ep:
        with pytest.raises(ResponseTooLargeError) as caught:
            await client_factory(ep.url, max_response_bytes=1024, max_retries=3).complete(HELLO)
        record = await ep.wait_closed(0)
    assert (caught.value.kind, caught.value.retryable) == ("response_too_large", False)
    assert (record.closed_by, record.bytes_sent, len(ep.requests)) == ("client", len(head), 1)


@pytest.mark.parametrize(
    "chunked", [pytest.param(False, id="close-delimited"), pytest.param(True, id="chunked")]
)
async def test_an_endless_body_stops_at_the_cap(
    client_factory: ClientFactory, chunked: bool
) -> None:
    """An endless body is cut off at max_response_bytes: the client closes the connection.

    The fake paces its 16 KiB pieces, so what it manages to send reflects the client's
    reading, not how much the kernel's socket buffers absorb in one go.
    """
    cap = 256 * 1024
    reply = Reply(endless=True, chunked=chunked, drip_bytes=16 * 1024, drip_interval_s=0.0001)
    async with FakeEndpoint([reply]) as ep:
        with pytest.raises(ResponseTooLargeError) as caught:
            await client_factory(ep.url, max_response_bytes=cap, max_retries=3).complete(HELLO)
        record = await ep.wait_closed(0)
    assert caught.value.kind == "response_too_large"
    assert (record.closed_by, len(ep.requests)) == ("client", 1)
    assert cap < record.bytes_sent < cap + MiB


@pytest.mark.parametrize(
    "chunked", [pytest.param(False, id="close-delimited"), pytest.param(True, id="chunked")]
)
@pytest.mark.parametrize("cap", [256 * 1024, 4 * MiB])
@counts_socket_reads
async def test_an_endless_body_is_read_no_further_than_64_kib_past_the_cap(
    client_factory: ClientFactory, monkeypatch: pytest.MonkeyPatch, chunked: bool, cap: int
) -> None:
    """The client reads at most the cap plus 64 KiB of an endless body from its socket.

    The fake sends as fast as the socket takes it, so the kernel's buffers are full and
    every read the client makes is as large as it asks for: what bounds the bytes read is
    the client's read size near the cap, counted here at the client socket's ``recv`` and
    ``recv_into`` (a buffered protocol reads into its own buffer).
    """
    received = 0
    recv = socket.socket.recv
    recv_into = socket.socket.recv_into

    def counted(self: socket.socket, *args: Any) -> bytes:
        nonlocal received
        data = recv(self, *args)
        if self.getpeername()[1] == port:  # the client's end, not the fake's
            received += len(data)
        return data

    def counted_into(self: socket.socket, *args: Any) -> int:
        nonlocal received
        size = recv_into(self, *args)
        if self.getpeername()[1] == port:
            received += size
        return size

    monkeypatch.setattr(socket.socket, "recv", counted)
    monkeypatch.setattr(socket.socket, "recv_into", counted_into)
    reply = Reply(endless=True, chunked=chunked)
    async with FakeEndpoint([reply]) as ep:
        port = ep.port
        with pytest.raises(ResponseTooLargeError):
            await client_factory(ep.url, max_response_bytes=cap, max_retries=0).complete(HELLO)
        await ep.wait_closed(0)
    assert cap < received <= cap + 64 * 1024


# --- content encoding -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "encoding", ["gzip", "x-gzip", "deflate", "br", "zstd", "GZIP", "gzip, identity"]
)
async def test_an_encoded_body_is_refused_and_never_decompressed(
    client_factory: ClientFactory, encoding: str
) -> None:
    """A Content-Encoding other than identity fails at the head: no body read, nothing inflated.

    The body is a gzip bomb (8 MiB of zeros) far over the cap, and the fake stalls after
    the head: decompressing it would need the body, which the client never waits for.
    """
    bomb = gzip.compress(b"0" * (8 * MiB), compresslevel=1)
    head = head_of(bomb, ("Content-Encoding", encoding))
    reply = Reply(head=head, body=bomb, stall_at=(len(head), LONG_STALL_S))
    async with FakeEndpoint([reply]) as ep:
        client = client_factory(ep.url, max_response_bytes=64 * 1024, max_retries=3)
        with pytest.raises(ContentEncodingError) as caught:
            await client.complete(HELLO)
        record = await ep.wait_closed(0)
    assert (caught.value.kind, caught.value.retryable) == ("content_encoding", False)
    assert (record.closed_by, record.bytes_sent, len(ep.requests)) == ("client", len(head), 1)


async def test_an_identity_content_encoding_is_accepted(client_factory: ClientFactory) -> None:
    """Content-Encoding: identity is the absence of an encoding and decodes normally."""
    reply = Reply.completion("plain", headers=[("Content-Encoding", "identity")])
    async with FakeEndpoint([reply]) as ep:
        completion = await client_factory(ep.url).complete(HELLO)
    assert completion.text == "plain"


# --- non-2xx statuses -------------------------------------------------------------------------

STATUSES = [
    pytest.param(
        Reply.error(400, "This model's maximum context length is 8192 tokens",
                    type="invalid_request_error", code="context_length_exceeded"),
        ("This model's maximum context length is 8192 tokens", "invalid_request_error",
         "context_length_exceeded"),
        False, id="400-openai-shape",
    ),
    pytest.param(
        Reply.error(401, "Incorrect API key", type="authentication_error", code=401),
        ("Incorrect API key", "authentication_error", "401"), False, id="401-integer-code",
    ),
    pytest.param(
        Reply.json({"error": "model not found"}, status=404), ("model not found", None, None),
        False, id="404-error-string",
    ),
    pytest.param(
        Reply.json({"object": "error", "message": "forbidden", "type": "BadRequestError",
                    "code": 403}, status=403),
        ("forbidden", "BadRequestError", "403"), False, id="403-top-level-message",
    ),
    pytest.param(
        Reply.json({"detail": [{"loc": ["body", "messages"], "msg": "field required",
                                "type": "value_error.missing"}]}, status=422),
        ("body.messages: field required", None, None), False, id="422-fastapi-detail",
    ),
    pytest.param(
        Reply.json([{"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}],
                   status=503),
        ("overloaded", "UNAVAILABLE", "503"), True, id="503-google-array",
    ),
    pytest.param(
        Reply.error(429, "slow down", type="rate_limit", headers=[("Retry-After", "7")]),
        ("slow down", "rate_limit", None), True, id="429-rate-limited",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("reply", "fields", "retryable"), STATUSES)
async def test_a_non_2xx_status_is_parsed_into_http_status_error(
    client_factory: ClientFactory,
    reply: Reply,
    fields: tuple[str | None, str | None, str | None],
    retryable: bool,
) -> None:
    """Status, error message, type and code come from the JSON body; no excerpt is needed."""
    async with FakeEndpoint([reply]) as ep:
        with pytest.raises(GridAgentError) as caught:
            await client_factory(ep.url, max_retries=0).complete(HELLO)
    error = caught.value
    assert isinstance(error, HTTPStatusError)
    assert (type(error), error.kind, error.status, error.retryable) == (
        HTTPStatusError,
        "http_status",
        reply.status,
        retryable,
    )
    assert (error.error_message, error.error_type, error.error_code) == fields
    assert error.excerpt is None
    assert len(ep.requests) == 1


async def test_a_retry_after_hint_is_kept_on_the_error(client_factory: ClientFactory) -> None:
    """A 429's Retry-After travels on the error, for callers that schedule their own retry."""
    reply = Reply.error(429, "slow down", headers=[("Retry-After", "7")])
    async with FakeEndpoint([reply]) as ep:
        with pytest.raises(HTTPStatusError) as caught:
            await client_factory(ep.url, max_retries=0).complete(HELLO)
    assert caught.value.retry_after_s == 7.0


async def test_an_html_error_page_becomes_a_short_scrubbed_excerpt(
    client_factory: ClientFactory,
) -> None:
    """An HTML page gives no message but a short excerpt of visible text, scrubbed of tokens."""
    page = (
        "<!DOCTYPE html><html><head><title>502 Bad Gateway</title>"
        "<style>body { color: red }</style><script>var t = 'x';</script></head>"
        "<body><h1>502 Bad Gateway</h1><p>upstream said: Bearer abcdefghijklmnop1234</p>"
        + "<p>more filler text</p>\n" * 20_000
        + "</body></html>"
    ).encode()
    reply = Reply(status=502, headers=(("Content-Type", "text/html; charset=utf-8"),), body=page)
    async with FakeEndpoint([reply]) as ep:
        with pytest.raises(HTTPStatusError) as caught:
            await client_factory(ep.url, max_retries=0).complete(HELLO)
    error = caught.value
    assert (error.status, error.error_message, error.error_type, error.error_code) == (
        502,
        None,
        None,
        None,
    )
    assert error.excerpt is not None
    assert error.excerpt.startswith(
        "502 Bad Gateway 502 Bad Gateway upstream said: Bearer [REDACTED]"
    )
    assert len(error.excerpt) <= 200
    assert (
        "<" in error.excerpt,
        "color: red" in error.excerpt,
        "abcdefghijklmnop1234" in str(error),
    ) == (
        False,
        False,
        False,
    )


# --- errors inside a 2xx reply ----------------------------------------------------------------

CHOICE_ERRORS = [
    pytest.param(
        Reply.completion(None, extra_choice={"error": {"message": "content filtered"}}),
        "$.choices[0].error", "content filtered", id="choice-error-member",
    ),
    pytest.param(
        Reply.completion("partial", finish_reason="error"), "$.choices[0].finish_reason", None,
        id="finish-reason-error",
    ),
    pytest.param(
        Reply.json({"error": {"message": "upstream failed", "type": "server_error"}}), "$.error",
        "upstream failed", id="top-level-error-member",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("reply", "path", "says"), CHOICE_ERRORS)
async def test_a_choice_error_is_raised_once_and_not_retried(
    client_factory: ClientFactory, reply: Reply, path: str, says: str | None
) -> None:
    """An error reported inside a 2xx body is ChoiceError, never retried: exactly one request."""
    async with FakeEndpoint([reply]) as ep:
        with pytest.raises(ChoiceError) as caught:
            await client_factory(ep.url, max_retries=3).complete(HELLO)
    error = caught.value
    assert (error.kind, error.path, error.retryable, error.attempts) == (
        "choice_error",
        path,
        False,
        1,
    )
    assert says is None or says in str(error)
    assert len(ep.requests) == 1


# --- reasoning is never kept ------------------------------------------------------------------

REASONING = "REASONING-CANARY-4d1f"

REASONING_REPLIES = [
    pytest.param(
        Reply.completion("visible answer", extra_message={"reasoning_content": REASONING}),
        id="reasoning_content",
    ),
    pytest.param(
        Reply.completion(
            "visible answer",
            extra_message={"reasoning": REASONING, "thinking": REASONING,
                           "reasoning_details": [{"type": "reasoning.text", "text": REASONING}]},
            extra_choice={"logprobs": {"content": [{"token": REASONING}]}},
            extra_top={"reasoning": REASONING, "system_fingerprint": REASONING},
        ),
        id="reasoning-members-everywhere",
    ),
    pytest.param(
        Reply.completion(f"<think>{REASONING}</think>\n\nvisible answer"), id="think-block"
    ),
    pytest.param(
        Reply.completion(
            None,
            extra_message={"content": [{"type": "reasoning", "text": REASONING},
                                       {"type": "text", "text": "visible answer"}]},
        ),
        id="reasoning-content-part",
    ),
]  # fmt: skip


@pytest.mark.parametrize("reply", REASONING_REPLIES)
async def test_reasoning_text_never_reaches_the_completion(
    client_factory: ClientFactory, reply: Reply
) -> None:
    """Reasoning sent by the provider appears in no field, repr, message or pickle of the result."""
    async with FakeEndpoint([reply]) as ep:
        completion = await client_factory(ep.url).complete(HELLO)
    assert completion.text == "visible answer"
    shown = [repr(completion), str(completion), repr(completion.to_message())]
    shown += [repr(getattr(completion, name)) for name in completion.__struct_fields__]
    assert [text for text in shown if REASONING in text] == []
    assert REASONING.encode() not in pickle.dumps(completion)


# --- connection reuse -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(Reply.completion("one"), id="content-length"),
        pytest.param(dataclasses.replace(Reply.completion("one"), chunked=True), id="chunked"),
    ],
)
async def test_the_connection_is_reused_after_a_complete_2xx_body(
    client_factory: ClientFactory, first: Reply
) -> None:
    """After a whole 2xx body the connection is kept alive: the next call uses the same one."""
    async with FakeEndpoint([first, Reply.completion("two")]) as ep:
        client = client_factory(ep.url)
        texts = [(await client.complete(HELLO)).text, (await client.complete(HELLO)).text]
    assert texts == ["one", "two"]
    assert [r.connection_id for r in ep.requests] == [0, 0]
    assert len(ep.connections) == 1


def stalled(head: bytes, body: bytes, *, after_body_bytes: int, chunked: bool = False) -> Reply:
    """A reply that sends `head` and the first body bytes, then stalls far beyond any limit."""
    return Reply(
        head=head, body=body, chunked=chunked, stall_at=(len(head) + after_body_bytes, LONG_STALL_S)
    )


BIG_REPLY = Reply.completion("x" * 8000).body
GZIPPED = gzip.compress(Reply.completion("zipped").body)
ERROR_PAGE = b"e" * (100 * 1024)
MOVED = b"moved" * 100

HALF_READ = [
    pytest.param(
        stalled(head_of(None), BIG_REPLY, after_body_bytes=2000, chunked=True),
        {"max_response_bytes": 1024}, ResponseTooLargeError, id="oversized-chunked-body",
    ),
    pytest.param(
        stalled(head_of(BIG_REPLY), BIG_REPLY, after_body_bytes=2000),
        {"max_response_bytes": 1024}, ResponseTooLargeError, id="oversized-declared-body",
    ),
    pytest.param(
        stalled(head_of(GZIPPED, ("Content-Encoding", "gzip")), GZIPPED, after_body_bytes=0),
        {}, ContentEncodingError, id="encoded-body-left-unread",
    ),
    pytest.param(
        stalled(
            head_of(ERROR_PAGE, ("Content-Type", "text/plain"), status="500 Internal Server Error",
                    content_type=False),
            ERROR_PAGE, after_body_bytes=80 * 1024,
        ),
        {"max_retries": 0}, HTTPStatusError, id="error-body-over-64KiB",
    ),
    pytest.param(
        stalled(head_of(MOVED, ("Location", "/elsewhere"), status="302 Found"), MOVED,
                after_body_bytes=10),
        {}, RedirectRefusedError, id="redirect-with-body",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("bad", "overrides", "error"), HALF_READ)
async def test_a_connection_with_a_half_read_body_is_closed_not_reused(
    client_factory: ClientFactory,
    bad: Reply,
    overrides: dict[str, Any],
    error: type[GridAgentError],
) -> None:
    """After an error with the body not yet all received, the client closes the connection.

    The fake stalls inside the body, so the connection is mid-message when the error is
    raised: reusing it would mix two responses. The next call opens a new connection.
    """
    async with FakeEndpoint([bad, Reply.completion("fresh")]) as ep:
        client = client_factory(ep.url, **overrides)
        with pytest.raises(error):
            await client.complete(HELLO)
        record = await ep.wait_closed(0)
        completion = await client.complete(HELLO)
    assert completion.text == "fresh"
    assert (record.closed_by, record.requests) == ("client", 1)
    assert [r.connection_id for r in ep.requests] == [0, 1]
