"""Tests of the loopback fake endpoint itself, driven by raw asyncio streams (no library client).

Every other transport test trusts what this fake sends and records, so these pin its bytes,
its faults, its bounds and its loud failure mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from typing import TYPE_CHECKING

import msgspec
import pytest
import trustme

from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

TARGET = "/v1/chat/completions"
SHORT_S = 0.2
"""A client-side limit, always set against a server-side stall of `LONG_S`."""
LONG_S = 5.0
BOUND_S = 3.0
"""Upper bound on anything that should happen at once on loopback."""

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclasses.dataclass(frozen=True)
class Response:
    """A response as a minimal raw-stream client parsed it."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        """Decode the body as JSON."""
        return msgspec.json.decode(self.body)


def request_bytes(
    body: bytes = b"{}",
    *,
    method: str = "POST",
    target: str = TARGET,
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """A raw HTTP/1.1 request with a Content-Length body."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def read_response(reader: asyncio.StreamReader) -> Response:
    """Read one response: Content-Length, chunked, or delimited by the connection closing."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *lines = head.removesuffix("\r\n\r\n").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        parts = []
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            parts.append((await reader.readexactly(size + 2))[:-2])
        await reader.readuntil(b"\r\n")
        body = b"".join(parts)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = await reader.read()
    return Response(int(status_line.split(" ")[1]), headers, body)


@contextlib.asynccontextmanager
async def connect(ep: FakeEndpoint, *, tls: ssl.SSLContext | None = None) -> AsyncIterator[Streams]:
    """Open a raw connection to `ep` and always close it, tolerating a reset."""
    reader, writer = await asyncio.open_connection(ep.host, ep.port, ssl=tls)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def exchange(ep: FakeEndpoint, raw: bytes | None = None) -> Response:
    """Send one request on a fresh connection and read the response."""
    async with connect(ep) as (reader, writer):
        writer.write(raw if raw is not None else request_bytes())
        async with asyncio.timeout(BOUND_S):
            return await read_response(reader)


async def test_records_method_target_headers_and_body() -> None:
    """A request is recorded exactly: method, target with query, headers in order and case."""
    body = b'{"messages":[{"role":"user","content":"ping"}]}'
    async with FakeEndpoint([Reply.completion("pong")]) as ep:
        raw = request_bytes(
            body, target=TARGET + "?api-version=2", headers=(("X-Trace-ID", "abc"),)
        )
        response = await exchange(ep, raw)
    assert ep.url == f"http://127.0.0.1:{ep.port}{TARGET}"
    assert ep.origin == f"http://127.0.0.1:{ep.port}"
    [request] = ep.requests
    assert request.method == "POST"
    assert request.target == TARGET + "?api-version=2"
    assert request.headers == (
        ("Host", "127.0.0.1"),
        ("X-Trace-ID", "abc"),
        ("Content-Length", str(len(body))),
    )
    assert request.header("x-trace-id") == "abc"
    assert request.header("missing") is None
    assert request.body == body
    assert request.json() == {"messages": [{"role": "user", "content": "ping"}]}
    assert (request.connection_id, request.index) == (0, 0)
    assert response.status == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == msgspec.json.decode(Reply.completion("pong").body)


async def test_responder_builds_reply_from_request_body() -> None:
    """A responder sees the recorded request, so a scripted model can echo the prompt."""

    def echo(request: RecordedRequest) -> Reply:
        return Reply.completion(request.json()["messages"][-1]["content"].upper())

    async with FakeEndpoint(responder=echo) as ep:
        response = await exchange(ep, request_bytes(b'{"messages":[{"content":"hi"}]}'))
    assert response.json() == msgspec.json.decode(Reply.completion("HI").body)


async def test_keep_alive_serves_two_requests_on_one_connection() -> None:
    """HTTP/1.1 keep-alive: two requests in sequence share one connection and its record."""
    async with FakeEndpoint([Reply.json({"n": 1}), Reply.json({"n": 2})]) as ep:
        async with connect(ep) as (reader, writer):
            responses = []
            for _ in range(2):
                writer.write(request_bytes())
                async with asyncio.timeout(BOUND_S):
                    responses.append(await read_response(reader))
        record = await ep.wait_closed(0)
    assert [r.json() for r in responses] == [{"n": 1}, {"n": 2}]
    assert [(r.connection_id, r.index) for r in ep.requests] == [(0, 0), (0, 1)]
    assert (record.requests, record.closed_by, len(ep.connections)) == (2, "client", 1)


@pytest.mark.parametrize(
    ("split_at", "drip_bytes", "writes"),
    [((), None, 1), ((5, 20), None, 3), ((48,), None, 2), ((), 10, 6)],
    ids=["whole", "inside-headers", "inside-utf8", "drip"],
)
async def test_split_writes_deliver_the_same_bytes(
    split_at: tuple[int, ...], drip_bytes: int | None, writes: int
) -> None:
    """split_at and drip_bytes cut the raw response into separately drained writes, bytes intact."""
    body = '{"t":"é€"}'.encode()  # offset 48 lies inside the three-byte euro sign
    expected = b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n" + body
    reply = Reply(body=body, split_at=split_at, drip_bytes=drip_bytes)
    async with FakeEndpoint([reply]) as ep:
        async with connect(ep) as (reader, writer):
            writer.write(request_bytes())
            async with asyncio.timeout(BOUND_S):
                received = await reader.readexactly(len(expected))
        record = await ep.wait_closed(0)
    assert received == expected
    assert (record.writes, record.bytes_sent) == (writes, len(expected))


async def test_content_length_false_closes_after_the_body() -> None:
    """content_length=False sends no length, announces Connection: close and closes after."""
    async with FakeEndpoint([Reply(body=b"until close", content_length=False)]) as ep:
        response = await exchange(ep)
        record = await ep.wait_closed(0)
    assert "content-length" not in response.headers
    assert response.headers["connection"] == "close"
    assert response.body == b"until close"
    assert record.closed_by == "server"


async def test_chunked_response_and_lying_content_length() -> None:
    """chunked=True frames the body; an int content_length is sent as given, even when false."""
    script = [Reply(body=b"hello" * 5000, chunked=True), Reply(body=b"abc", content_length=2)]
    async with FakeEndpoint(script) as ep:
        chunked = await exchange(ep)
        async with connect(ep) as (reader, writer):
            writer.write(request_bytes())
            async with asyncio.timeout(BOUND_S):
                head = await reader.readuntil(b"\r\n\r\n")
                rest = await reader.readexactly(3)
    assert chunked.headers["transfer-encoding"] == "chunked"
    assert chunked.body == b"hello" * 5000
    assert b"Content-Length: 2\r\n" in head
    assert rest == b"abc"


async def test_chunked_request_body_is_decoded() -> None:
    """A chunked request body (with an extension and a trailer) is recorded de-chunked."""
    raw = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    async with FakeEndpoint([Reply.json({})]) as ep:
        response = await exchange(ep, raw)
    assert response.status == 200
    assert ep.requests[0].body == b"hello, world"


async def test_expect_100_continue_gets_an_interim_response() -> None:
    """A client that sends Expect: 100-continue gets the interim response before its body."""
    head = request_bytes(b"{}", headers=(("Expect", "100-continue"),)).removesuffix(b"{}")
    async with FakeEndpoint([Reply.json({"ok": True})]) as ep, connect(ep) as (reader, writer):
        writer.write(head)
        async with asyncio.timeout(BOUND_S):
            interim = await reader.readuntil(b"\r\n\r\n")
            writer.write(b"{}")
            response = await read_response(reader)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert (response.status, ep.requests[0].body) == (200, b"{}")


async def test_client_connection_close_is_honoured() -> None:
    """A request with Connection: close gets Connection: close back, then the fake closes."""
    async with FakeEndpoint([Reply.json({})]) as ep:
        response = await exchange(ep, request_bytes(headers=(("Connection", "close"),)))
        record = await ep.wait_closed(0)
    assert response.headers["connection"] == "close"
    assert record.closed_by == "server"


async def test_reset_fault_gives_connection_reset_at_the_client() -> None:
    """fault="reset" aborts with SO_LINGER 0: the client sees ConnectionResetError, not EOF."""
    async with FakeEndpoint([dataclasses.replace(Reply.completion("never"), fault="reset")]) as ep:
        async with connect(ep) as (reader, writer):
            writer.write(request_bytes())
            with pytest.raises(ConnectionResetError):
                async with asyncio.timeout(BOUND_S):
                    await reader.read(100)
        record = await ep.wait_closed(0)
    assert (record.bytes_sent, record.closed_by) == (0, "server")


async def test_close_fault_mid_body_sends_exactly_fault_at_bytes() -> None:
    """fault="close" at an offset sends exactly that many bytes, then a clean FIN."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
    reply = Reply(body=b"x" * 100, fault="close", fault_at=len(head) + 10)
    async with FakeEndpoint([reply]) as ep:
        async with connect(ep) as (reader, writer):
            writer.write(request_bytes())
            async with asyncio.timeout(BOUND_S):
                received = await reader.read()
        record = await ep.wait_closed(0)
    assert received == head + b"x" * 10
    assert record.closed_by == "server"


async def test_stall_before_headers_ends_when_the_client_gives_up() -> None:
    """A long stall is cut short by the client's deadline, and the fake sees the client leave."""
    async with FakeEndpoint([Reply(body=b"late", stall_before_headers_s=LONG_S)]) as ep:
        async with connect(ep) as (reader, writer):
            writer.write(request_bytes())
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(SHORT_S):
                    await reader.read(1)
        record = await ep.wait_closed(0, timeout_s=BOUND_S)
    assert (record.bytes_sent, record.closed_by) == (0, "client")


async def test_stall_at_offset_pauses_after_exactly_that_many_bytes() -> None:
    """stall_at=(n, s) delivers n bytes, then nothing while the stall lasts."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
    reply = Reply(body=b"0123456789", stall_at=(len(head) + 4, LONG_S))
    async with FakeEndpoint([reply]) as ep:
        async with connect(ep) as (reader, writer):
            writer.write(request_bytes())
            async with asyncio.timeout(BOUND_S):
                received = await reader.readexactly(len(head) + 4)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(SHORT_S):
                    await reader.read(1)
        record = await ep.wait_closed(0, timeout_s=BOUND_S)
    assert received == head + b"0123"
    assert record.closed_by == "client"


async def test_endless_body_stops_when_the_client_closes() -> None:
    """An endless body streams until the client leaves; the fake notices and stops writing."""
    async with FakeEndpoint([Reply(endless=True)]) as ep:
        async with connect(ep) as (reader, writer):
            writer.write(request_bytes())
            async with asyncio.timeout(BOUND_S):
                await reader.readuntil(b"\r\n\r\n")
                opening = await reader.readexactly(200_000)
        record = await ep.wait_closed(0, timeout_s=BOUND_S)
    assert opening.startswith(b'{"x":"aaaa')
    assert record.closed_by == "client"
    assert record.bytes_sent > 200_000


async def test_endless_body_is_bounded_by_max_bytes_sent_per_response() -> None:
    """An endless body stops at max_bytes_sent_per_response and records a failure."""
    ep = FakeEndpoint([Reply(endless=True)], max_bytes_sent_per_response=100_000, strict=False)
    async with ep, connect(ep) as (reader, writer):
        writer.write(request_bytes())
        async with asyncio.timeout(BOUND_S):
            received = await reader.read()
    assert len(received) == 100_000
    assert ep.connections[0].bytes_sent == 100_000
    [failure] = ep.failures
    assert "max_bytes_sent_per_response=100000" in failure


async def test_script_exhaustion_fails_the_test_on_exit() -> None:
    """A request beyond the script gets a 500 JSON error, and leaving the block raises."""
    responses = []
    with pytest.raises(AssertionError, match="script exhausted"):
        async with FakeEndpoint([]) as ep:
            responses.append(await exchange(ep))
    assert responses[0].status == 500
    assert responses[0].json() == {
        "error": {
            "message": "fake endpoint: script exhausted",
            "type": "fake_endpoint_error",
            "param": None,
            "code": None,
        }
    }


async def test_responder_error_is_answered_and_chained_on_exit() -> None:
    """A responder that raises yields a 500, and the exit AssertionError is caused by it."""

    def broken(request: RecordedRequest) -> Reply:
        raise ValueError("bug in the scripted model")

    responses = []
    with pytest.raises(AssertionError, match="responder raised ValueError") as caught:
        async with FakeEndpoint(responder=broken) as ep:
            responses.append(await exchange(ep))
    assert responses[0].status == 500
    assert isinstance(caught.value.__cause__, ValueError)


async def test_failures_are_noted_on_an_error_already_propagating() -> None:
    """When the test body fails on its own, the fake's failures ride along as a note."""

    async def failing_test_body() -> None:
        async with FakeEndpoint([]) as ep:
            await exchange(ep)
            raise RuntimeError("the test's own error")

    with pytest.raises(RuntimeError, match="the test's own error") as caught:
        await failing_test_body()
    assert "script exhausted" in caught.value.__notes__[0]


async def test_wait_helpers_time_out_with_a_message() -> None:
    """The wait_* helpers are bounded and say what never happened."""
    async with FakeEndpoint([]) as ep:
        with pytest.raises(TimeoutError, match="no request #0 within"):
            await ep.wait_for_request(0, timeout_s=0.05)


async def test_unparseable_request_is_answered_and_recorded() -> None:
    """A malformed request line gets a 500 and a recorded failure, not a silent drop."""
    async with FakeEndpoint([], strict=False) as ep:
        response = await exchange(ep, b"NOT HTTP AT ALL\r\n\r\n")
    assert response.status == 500
    assert ep.requests == []
    assert ["unparseable request" in f for f in ep.failures] == [True]


async def test_oversized_body_gets_413_and_a_failure() -> None:
    """A body over max_request_bytes is refused with 413 before it is read, and recorded."""
    async with FakeEndpoint([Reply()], max_request_bytes=10, strict=False) as ep:
        response = await exchange(ep, request_bytes(b"x" * 11))
    assert response.status == 413
    assert ep.requests == []
    assert len(ep.failures) == 1


async def test_requests_past_max_requests_are_refused() -> None:
    """Past max_requests the fake answers 500, closes, and records a failure."""
    async with FakeEndpoint([Reply(), Reply()], max_requests=1, strict=False) as ep:
        first = await exchange(ep)
        second = await exchange(ep)
    assert (first.status, second.status, len(ep.requests)) == (200, 500, 1)
    assert ["max_requests=1" in f for f in ep.failures] == [True]


async def test_tls_endpoint_with_trustme_certificate() -> None:
    """With an ssl_context the fake speaks TLS and its URL says https."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    async with FakeEndpoint([Reply.completion("secure")], ssl_context=server_ctx) as ep:
        async with connect(ep, tls=client_ctx) as (reader, writer):
            writer.write(request_bytes())
            async with asyncio.timeout(BOUND_S):
                response = await read_response(reader)
        record = await ep.wait_closed(0, timeout_s=BOUND_S)
    assert ep.url == f"https://127.0.0.1:{ep.port}{TARGET}"
    assert response.json() == msgspec.json.decode(Reply.completion("secure").body)
    assert record.tls
    assert record.closed_by == "client"


async def test_high_water_marks_of_concurrent_connections_and_requests() -> None:
    """Three clients held at once are counted as 3 concurrent connections and requests."""
    arrived = 0
    all_arrived = asyncio.Event()

    async def hold_until_all_arrive(request: RecordedRequest) -> Reply:
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            all_arrived.set()
        await all_arrived.wait()
        return Reply.json({"index": request.index})

    async with FakeEndpoint(responder=hold_until_all_arrive) as ep:
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(connect(ep)) for _ in range(3)]
            for _, writer in clients:
                writer.write(request_bytes())
            async with asyncio.timeout(BOUND_S):
                statuses = [(await read_response(reader)).status for reader, _ in clients]
        await ep.wait_all_closed()
        assert ep.open_connections == 0
    assert statuses == [200, 200, 200]
    assert (ep.max_concurrent_connections, ep.max_concurrent_requests) == (3, 3)


async def test_connections_past_max_connections_are_closed_at_once() -> None:
    """Past max_connections a new connection is closed immediately and a failure recorded."""
    ep = FakeEndpoint([Reply()], max_connections=1, strict=False)
    async with ep, connect(ep) as (reader, writer):
        writer.write(request_bytes())
        async with asyncio.timeout(BOUND_S):
            await read_response(reader)
        async with connect(ep) as (refused_reader, _), asyncio.timeout(BOUND_S):
            assert await refused_reader.read() == b""
    assert (ep.refused_connections, len(ep.connections), len(ep.failures)) == (1, 1, 1)


async def test_lifetime_bound_stops_the_server() -> None:
    """After lifetime_s the fake closes its connections and listener, and records why."""
    ep = FakeEndpoint([], lifetime_s=SHORT_S, strict=False)
    async with ep:
        async with connect(ep) as (reader, _):
            async with asyncio.timeout(BOUND_S):
                assert await reader.read() == b""
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(ep.host, ep.port)
    assert ep.connections[0].closed_by == "server"
    assert ["lifetime_s=0.2" in f for f in ep.failures] == [True]


async def test_empty_script_with_no_requests_exits_cleanly() -> None:
    """A listener that must receive nothing (cross-origin redirect target) exits cleanly."""
    async with FakeEndpoint([], path="/v1/chat/completions?api-version=1") as ep:
        assert ep.url.endswith(":" + str(ep.port) + "/v1/chat/completions?api-version=1")
    assert (ep.requests, ep.connections, ep.failures) == ([], [], [])


async def test_push_extends_the_script_while_running() -> None:
    """push() appends replies to a running endpoint's script."""
    async with FakeEndpoint([]) as ep:
        ep.push(Reply.redirect(307, "/elsewhere"), Reply.error(429, "slow down", code="rate"))
        moved = await exchange(ep)
        limited = await exchange(ep)
        assert ep.pending_replies == 0
    assert (moved.status, moved.headers["location"]) == (307, "/elsewhere")
    assert limited.json() == {
        "error": {"message": "slow down", "type": None, "param": None, "code": "rate"}
    }


def test_completion_reply_has_the_openai_shape() -> None:
    """Reply.completion builds a standard chat completion, tool calls and usage included."""
    reply = Reply.completion(tool_calls=[("call_1", "look", '{"at":"sky"}')], usage=(3, 4))
    assert msgspec.json.decode(reply.body) == {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "look", "arguments": '{"at":"sky"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }


def test_invalid_reply_reports_every_problem() -> None:
    """Reply validation lists all problems at once, each named by its field."""
    with pytest.raises(ValueError, match="invalid Reply") as caught:
        Reply(status=42, drip_bytes=0, fault_at=3)
    message = str(caught.value)
    assert all(field in message for field in ("status:", "drip_bytes:", "fault_at:"))
