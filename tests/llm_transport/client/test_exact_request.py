"""What goes on the wire: the exact URL, header set and body of every request.

The client talks to one configured URL and nothing else, so these tests pin each byte it
controls: the request target (path and query as configured), the complete header set
(nothing added from cookies or the proxy environment), the body members and their JSON
shape for every message type, the deterministic request ids, and the prompt-size ceiling
(checked before any connection exists). Invalid messages fail where they are built.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from metacrate_grid_agent import (
    AssistantMessage,
    ImagePart,
    LLMClient,
    Message,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UserMessage,
    __version__,
)
from metacrate_grid_agent._core import _request
from metacrate_grid_agent.errors import InvalidMessageError, PromptTooLargeError
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply
from tests.llm_transport.support import CANARY_KEY, make_config

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.llm_transport.conftest import ClientFactory

HELLO = (UserMessage(content="hello"),)
PNG_DATA_URL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)


def expected_headers(ep: FakeEndpoint, request: RecordedRequest, request_id: str) -> list[Any]:
    """The complete header set the client must send, as sorted (lowercase name, value) pairs."""
    return sorted(
        {
            "host": f"127.0.0.1:{ep.port}",
            "authorization": f"Bearer {CANARY_KEY}",
            "content-type": "application/json",
            "accept": "application/json",
            "accept-encoding": "identity",
            "user-agent": f"metacrate-grid-agent/{__version__}",
            "x-request-id": request_id,
            "content-length": str(len(request.body)),
        }.items()
    )


def sent_headers(request: RecordedRequest) -> list[tuple[str, str]]:
    """The headers the fake received, as sorted (lowercase name, value) pairs."""
    return sorted((name.lower(), value) for name, value in request.headers)


# --- the URL ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        pytest.param("/v1/chat/completions", id="plain"),
        pytest.param(
            "/custom/deploy/chat?api-version=2024-10-21&x=a%2Fb", id="encoded-slash-in-query"
        ),
        pytest.param("/openai/deployments/a%2Fb/chat/completions", id="encoded-slash-in-path"),
        pytest.param("/chat?sig=a%3Db%26c&q=x+y&s=%20", id="encoded-reserved-in-query"),
        pytest.param("/x/%E2%82%AC/chat?name=%C3%A9", id="encoded-utf8"),
        pytest.param("/a//b/chat", id="double-slash"),
    ],
)
async def test_posts_to_the_exact_configured_target(
    client_factory: ClientFactory, target: str
) -> None:
    """The request line carries POST and the configured path and query, byte for byte."""
    async with FakeEndpoint([Reply.completion("ok")], path=target) as ep:
        await client_factory(ep.url).complete(HELLO)
    [request] = ep.requests
    assert (request.method, request.target, request.http_version) == ("POST", target, "HTTP/1.1")


# --- the headers ------------------------------------------------------------------------------


async def test_sends_exactly_the_expected_header_set(client_factory: ClientFactory) -> None:
    """Host, Authorization, content headers, User-Agent, X-Request-Id, Content-Length: no more."""
    async with FakeEndpoint([Reply.completion("ok")]) as ep:
        await client_factory(ep.url).complete(HELLO, request_id="turn-1")
    [request] = ep.requests
    assert sent_headers(request) == expected_headers(ep, request, "turn-1")
    assert len(request.headers) == 8  # no header is sent twice


async def test_sends_no_cookie_after_the_server_sets_cookies(
    client_factory: ClientFactory,
) -> None:
    """Cookies set by a response are dropped: the next request carries the same header set."""
    cookies = (
        ("Set-Cookie", "session=abc123; Path=/"),
        ("Set-Cookie", "tracker=xyz; Domain=127.0.0.1; Path=/; Max-Age=3600"),
    )
    async with FakeEndpoint(
        [Reply.completion("one", headers=cookies), Reply.completion("two")]
    ) as ep:
        client = client_factory(ep.url)
        await client.complete(HELLO, request_id="r-1")
        await client.complete(HELLO, request_id="r-2")
    first, second = ep.requests
    assert second.header_values("Cookie") == ()
    assert sent_headers(first) == expected_headers(ep, first, "r-1")
    assert sent_headers(second) == expected_headers(ep, second, "r-2")
    assert first.connection_id == second.connection_id  # the same client and connection


PROXY_VARIABLES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)


async def test_ignores_proxy_environment_variables(
    client_factory: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP(S)_PROXY never reroutes the call: the proxy sees nothing, no proxy header is sent."""
    async with FakeEndpoint() as proxy, FakeEndpoint([Reply.completion("ok")]) as ep:
        for name in PROXY_VARIABLES:
            monkeypatch.setenv(name, f"http://user:pass@127.0.0.1:{proxy.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        completion = await client_factory(ep.url).complete(HELLO, request_id="direct-1")
    [request] = ep.requests
    assert completion.text == "ok"
    assert (proxy.connections, proxy.requests) == ([], [])
    assert request.target == "/v1/chat/completions"  # origin form, not a proxy's absolute form
    assert sent_headers(request) == expected_headers(ep, request, "direct-1")


async def test_a_retry_resends_the_same_bytes(client_factory: ClientFactory) -> None:
    """A retried attempt repeats the same target, header set (request id included) and body."""
    async with FakeEndpoint([Reply.error(503, "busy"), Reply.completion("ok")]) as ep:
        await client_factory(ep.url, max_retries=1).complete(HELLO, request_id="again-1")
    first, second = ep.requests
    assert (first.target, sent_headers(first), first.body) == (
        second.target,
        sent_headers(second),
        second.body,
    )
    assert sent_headers(second) == expected_headers(ep, second, "again-1")


# --- the body ---------------------------------------------------------------------------------


async def test_each_request_carries_the_tools_passed_with_it(client_factory: ClientFactory) -> None:
    """Tools serialised once per tuple never go stale: every body has exactly its call's tools.

    The same tuple twice, then a new tuple, then a list, then none: each body is what a
    fresh serialisation of that call's messages and tools gives.
    """
    look = ToolDefinition.create("look", "Look around.", {"type": "object"})
    say = ToolDefinition.create("say", "Say it.", {"type": "object"})
    calls: list[Any] = [(look,), None, (look, say), [say], ()]
    calls[1] = calls[0]  # the very same tuple again
    async with FakeEndpoint([Reply.completion("ok")] * len(calls)) as ep:
        client = client_factory(ep.url)
        for tools in calls:
            await client.complete(HELLO, tools=tools)
    bodies = [request.body for request in ep.requests]
    assert bodies == [_request.encode_request(HELLO, tools) for tools in calls]
    assert [body.count(b'"name":"say"') for body in bodies] == [0, 0, 1, 1, 0]


async def test_body_has_messages_only_when_there_are_no_tools(
    client_factory: ClientFactory,
) -> None:
    """With no tools the body is exactly {"messages": [...]}: no tools, no model, no stream."""
    async with FakeEndpoint([Reply.completion("ok")]) as ep:
        await client_factory(ep.url).complete(HELLO, tools=())
    [request] = ep.requests
    assert request.body == b'{"messages":[{"role":"user","content":"hello"}]}'


async def test_body_has_messages_and_tools_when_there_are_tools(
    client_factory: ClientFactory,
) -> None:
    """With tools the body has exactly the members messages and tools, in that order."""
    tool = ToolDefinition.create("ping", "Check the grid is up", {"type": "object"})
    async with FakeEndpoint([Reply.completion("ok")]) as ep:
        await client_factory(ep.url).complete(HELLO, tools=[tool])
    [request] = ep.requests
    body = request.json()
    assert list(body) == ["messages", "tools"]
    assert "model" not in body
    assert "stream" not in body


MESSAGE_CASES = [
    pytest.param(
        SystemMessage(content="be brief"), {"role": "system", "content": "be brief"}, id="system"
    ),
    pytest.param(
        SystemMessage(content=(TextPart(text="a"), TextPart(text="b"))),
        {
            "role": "system",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        },
        id="system-text-parts",
    ),
    pytest.param(UserMessage(content="hi"), {"role": "user", "content": "hi"}, id="user"),
    pytest.param(
        UserMessage(content='héllo € 😀 "quoted" \\ \n\t\x00'),
        {"role": "user", "content": 'héllo € 😀 "quoted" \\ \n\t\x00'},
        id="user-unicode-and-escapes",
    ),
    pytest.param(
        UserMessage(
            content=(
                TextPart(text="what is this?"),
                ImagePart.of("https://cdn.example.com/shot.png?size=large", detail="high"),
            )
        ),
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {
                    "type": "image_url",
                    "image_url": {
                        "url": "https://cdn.example.com/shot.png?size=large",
                        "detail": "high",
                    },
                },
            ],
        },
        id="user-https-image",
    ),
    pytest.param(
        UserMessage(content=(ImagePart.of(PNG_DATA_URL),)),
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_DATA_URL}}]},
        id="user-data-image",
    ),
    pytest.param(
        AssistantMessage(content="done"), {"role": "assistant", "content": "done"}, id="assistant"
    ),
    pytest.param(
        AssistantMessage(tool_calls=(ToolCall.create("call_1", "move", '{"x": 1}'),)),
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "move", "arguments": '{"x": 1}'},
                }
            ],
        },
        id="assistant-tool-calls",
    ),
    pytest.param(
        AssistantMessage(
            content="moving",
            tool_calls=(
                ToolCall.create("call_1", "move", "{}"),
                ToolCall.create("call_2", "say", '{"text":"hi"}'),
            ),
        ),
        {
            "role": "assistant",
            "content": "moving",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "move", "arguments": "{}"},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "say", "arguments": '{"text":"hi"}'},
                },
            ],
        },
        id="assistant-text-and-tool-calls",
    ),
    pytest.param(
        ToolMessage(tool_call_id="call_1", content="moved"),
        {"role": "tool", "tool_call_id": "call_1", "content": "moved"},
        id="tool",
    ),
    pytest.param(
        ToolMessage(tool_call_id="call_1", content=(TextPart(text="moved"),)),
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "moved"}]},
        id="tool-text-parts",
    ),
]


@pytest.mark.parametrize(("message", "expected"), MESSAGE_CASES)
async def test_serialises_each_message_type(
    client_factory: ClientFactory, message: Message, expected: dict[str, Any]
) -> None:
    """Each message type goes out in the chat-completions wire shape, and nothing more."""
    async with FakeEndpoint([Reply.completion("ok")]) as ep:
        await client_factory(ep.url).complete([message])
    [request] = ep.requests
    assert request.json() == {"messages": [expected]}


async def test_serialises_a_conversation_in_order_as_utf8(client_factory: ClientFactory) -> None:
    """A whole history is sent in order, as UTF-8 JSON whose length is the Content-Length."""
    history: list[Message] = [
        SystemMessage(content="you are a grid agent"),
        UserMessage(content="go to the plaza €"),
        AssistantMessage(tool_calls=(ToolCall.create("c1", "move", '{"to":"plaza"}'),)),
        ToolMessage(tool_call_id="c1", content="arrived"),
    ]
    async with FakeEndpoint([Reply.completion("ok")]) as ep:
        await client_factory(ep.url).complete(history)
    [request] = ep.requests
    assert [m["role"] for m in request.json()["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assert "plaza €".encode() in request.body
    assert request.header("Content-Length") == str(len(request.body))


PARAMETERS = {
    "type": "object",
    "properties": {
        "x": {"type": "number", "minimum": 0},
        "mode": {"type": "string", "enum": ["walk", "fly"]},
    },
    "required": ["x"],
    "additionalProperties": False,
}

TOOL_CASES = [
    pytest.param(
        ToolDefinition.create("move", "Move the avatar", PARAMETERS),
        {
            "type": "function",
            "function": {
                "name": "move",
                "description": "Move the avatar",
                "parameters": PARAMETERS,
            },
        },
        id="full",
    ),
    pytest.param(
        ToolDefinition.create(
            "move",
            "Move the avatar",
            types.MappingProxyType(
                {"type": "object", "properties": types.MappingProxyType({"x": {"type": "number"}})}
            ),
        ),
        {
            "type": "function",
            "function": {
                "name": "move",
                "description": "Move the avatar",
                "parameters": {"type": "object", "properties": {"x": {"type": "number"}}},
            },
        },
        id="read-only-mappings",
    ),
    pytest.param(
        ToolDefinition.create("ping", "", {}),
        {"type": "function", "function": {"name": "ping"}},
        id="no-description-no-parameters",
    ),
]


@pytest.mark.parametrize(("tool", "expected"), TOOL_CASES)
async def test_serialises_tool_definitions(
    client_factory: ClientFactory, tool: ToolDefinition, expected: dict[str, Any]
) -> None:
    """A tool goes out in the standard {"type": "function", "function": {...}} envelope."""
    async with FakeEndpoint([Reply.completion("ok")]) as ep:
        await client_factory(ep.url).complete(HELLO, tools=[tool, tool])
    [request] = ep.requests
    assert request.json() == {
        "messages": [{"role": "user", "content": "hello"}],
        "tools": [expected, expected],
    }


# --- request ids ------------------------------------------------------------------------------


async def test_request_ids_follow_the_correlation_sequence() -> None:
    """Without an explicit id, calls go out as <correlation>-1, -2, -3, in X-Request-Id too."""
    async with (
        FakeEndpoint([Reply.completion("ok")] * 3) as ep,
        LLMClient(make_config(ep.url), correlation_id="agent-7") as client,
    ):
        ids = [(await client.complete(HELLO)).request_id for _ in range(3)]
    assert ids == ["agent-7-1", "agent-7-2", "agent-7-3"]
    assert [r.header("X-Request-Id") for r in ep.requests] == ids


async def test_request_ids_are_the_same_for_every_fresh_client() -> None:
    """The sequence depends on nothing but the correlation id: two clients send the same ids."""
    sent: list[list[str | None]] = []
    for _ in range(2):
        async with (
            FakeEndpoint([Reply.completion("ok")] * 2) as ep,
            LLMClient(make_config(ep.url)) as client,
        ):
            await client.complete(HELLO)
            await client.complete(HELLO)
        sent.append([r.header("X-Request-Id") for r in ep.requests])
    assert sent == [["grid-agent-1", "grid-agent-2"]] * 2


async def test_an_explicit_request_id_goes_out_as_x_request_id(
    client_factory: ClientFactory,
) -> None:
    """A caller's request_id is sent as X-Request-Id and reported on the Completion."""
    async with FakeEndpoint([Reply.completion("ok")]) as ep:
        completion = await client_factory(ep.url).complete(HELLO, request_id="session-9.turn:3")
    [request] = ep.requests
    assert request.header_values("X-Request-Id") == ("session-9.turn:3",)
    assert completion.request_id == "session-9.turn:3"


BAD_REQUEST_IDS = [
    pytest.param("", id="empty"),
    pytest.param("two words", id="space"),
    pytest.param("id\r\nX-Injected: 1", id="header-injection"),
    pytest.param("idé", id="non-ascii"),
    pytest.param("a/b", id="slash"),
    pytest.param("x" * 129, id="too-long"),
]


@pytest.mark.parametrize("request_id", BAD_REQUEST_IDS)
async def test_an_invalid_request_id_is_refused_before_connecting(
    client_factory: ClientFactory, request_id: str
) -> None:
    """A request id that could not travel safely in a header fails before any connection."""
    async with FakeEndpoint() as ep:
        with pytest.raises(InvalidMessageError) as caught:
            await client_factory(ep.url).complete(HELLO, request_id=request_id)
    assert caught.value.kind == "invalid_message"
    assert ep.connections == []


@pytest.mark.parametrize("correlation_id", BAD_REQUEST_IDS)
def test_an_invalid_correlation_id_is_refused_when_the_client_is_built(
    correlation_id: str,
) -> None:
    """The correlation id prefixes every X-Request-Id, so it is checked in the constructor."""
    with pytest.raises(InvalidMessageError):
        LLMClient(make_config("http://127.0.0.1:9/v1"), correlation_id=correlation_id)


# --- prompt size ------------------------------------------------------------------------------


def user_body(text: str) -> bytes:
    """The exact body the client sends for one user message."""
    return msgspec.json.encode({"messages": [{"role": "user", "content": text}]})


async def test_an_oversized_prompt_fails_before_any_connection(
    client_factory: ClientFactory,
) -> None:
    """A body over max_prompt_bytes raises PromptTooLargeError and opens no connection."""
    text = "x" * 2000
    async with FakeEndpoint() as ep:
        client = client_factory(ep.url, max_prompt_bytes=1024, max_retries=3)
        with pytest.raises(PromptTooLargeError) as caught:
            await client.complete([UserMessage(content=text)], request_id="big-1")
    error = caught.value
    assert (error.kind, error.retryable, error.size, error.limit) == (
        "prompt_too_large",
        False,
        len(user_body(text)),
        1024,
    )
    assert (error.request_id, error.attempts) == ("big-1", 0)
    assert ep.connections == []


async def test_a_prompt_of_exactly_max_prompt_bytes_is_sent(client_factory: ClientFactory) -> None:
    """The limit counts the serialised body: a body of exactly the limit goes out."""
    text = "y" * 500
    body = user_body(text)
    async with FakeEndpoint([Reply.completion("ok")]) as ep:
        client = client_factory(ep.url, max_prompt_bytes=len(body))
        await client.complete([UserMessage(content=text)])
        with pytest.raises(PromptTooLargeError) as caught:
            await client.complete([UserMessage(content=text + "y")])
    [request] = ep.requests
    assert request.body == body
    assert (caught.value.size, caught.value.limit) == (len(body) + 1, len(body))


async def test_a_large_image_counts_toward_max_prompt_bytes(client_factory: ClientFactory) -> None:
    """Images travel inside the body as data: URLs, so they count toward the limit too."""
    image = ImagePart.of("data:image/png;base64," + "A" * 4096)
    async with FakeEndpoint() as ep:
        client = client_factory(ep.url, max_prompt_bytes=4096)
        with pytest.raises(PromptTooLargeError):
            await client.complete([UserMessage(content=(TextPart(text="look"), image))])
    assert ep.connections == []


# --- invalid messages fail where they are built -----------------------------------------------

HTTPS_IMAGE = "https://cdn.example.com/a.png"

INVALID_MESSAGES: list[Any] = [
    pytest.param(lambda: ImagePart.of("http://cdn.example.com/a.png"), id="image-http-scheme"),
    pytest.param(lambda: ImagePart.of("ftp://cdn.example.com/a.png"), id="image-ftp-scheme"),
    pytest.param(lambda: ImagePart.of("file:///etc/passwd"), id="image-file-scheme"),
    pytest.param(lambda: ImagePart.of("javascript:alert(1)"), id="image-javascript-scheme"),
    pytest.param(lambda: ImagePart.of("https://"), id="image-https-without-host"),
    pytest.param(lambda: ImagePart.of("https://cdn.example.com/a b.png"), id="image-space"),
    pytest.param(lambda: ImagePart.of("data:text/html;base64,PGI+"), id="image-data-not-image"),
    pytest.param(lambda: ImagePart.of("data:image/png,rawbytes"), id="image-data-not-base64"),
    pytest.param(lambda: ImagePart.of(HTTPS_IMAGE, detail="ultra"), id="image-bad-detail"),
    pytest.param(
        lambda: SystemMessage(content=(ImagePart.of(HTTPS_IMAGE),)),  # type: ignore[arg-type]
        id="image-in-system-message",
    ),
    pytest.param(
        lambda: AssistantMessage(content=(ImagePart.of(HTTPS_IMAGE),)),  # type: ignore[arg-type]
        id="image-in-assistant-message",
    ),
    pytest.param(
        lambda: ToolMessage(
            tool_call_id="c1",
            content=(ImagePart.of(HTTPS_IMAGE),),  # type: ignore[arg-type]
        ),
        id="image-in-tool-message",
    ),
    pytest.param(lambda: ToolCall.create("", "move", "{}"), id="empty-tool-call-id"),
    pytest.param(lambda: ToolCall.create("c" * 1025, "move", "{}"), id="tool-call-id-too-long"),
    pytest.param(lambda: ToolCall.create("c1", "", "{}"), id="empty-tool-call-name"),
    pytest.param(
        lambda: ToolCall.create("c1", "move", {"x": 1}),  # type: ignore[arg-type]
        id="tool-call-arguments-not-text",
    ),
    pytest.param(lambda: ToolMessage(tool_call_id="", content="ok"), id="empty-tool-message-id"),
    pytest.param(AssistantMessage, id="assistant-without-content-or-calls"),
    pytest.param(
        lambda: AssistantMessage(tool_calls=[ToolCall.create("c1", "m", "{}")]),  # type: ignore[arg-type]
        id="assistant-tool-calls-not-a-tuple",
    ),
    pytest.param(lambda: UserMessage(content=["hi"]), id="content-list-not-tuple"),  # type: ignore[arg-type]
    pytest.param(lambda: UserMessage(content=None), id="user-content-none"),  # type: ignore[arg-type]
    pytest.param(lambda: UserMessage(content=("hi",)), id="bare-string-part"),  # type: ignore[arg-type]
    pytest.param(lambda: TextPart(text=1), id="text-part-not-text"),  # type: ignore[arg-type]
    pytest.param(lambda: ToolDefinition.create("move avatar", "d", {}), id="tool-name-space"),
    pytest.param(lambda: ToolDefinition.create("", "d", {}), id="tool-name-empty"),
    pytest.param(lambda: ToolDefinition.create("m" * 65, "d", {}), id="tool-name-too-long"),
    pytest.param(
        lambda: ToolDefinition.create("move", "d", [1]),  # type: ignore[arg-type]
        id="tool-parameters-not-an-object",
    ),
]


@pytest.mark.parametrize("build", INVALID_MESSAGES)
def test_invalid_messages_fail_when_built(build: Callable[[], object]) -> None:
    """An invalid message, part, call or tool raises InvalidMessageError at construction."""
    with pytest.raises(InvalidMessageError) as caught:
        build()
    assert caught.value.kind == "invalid_message"
