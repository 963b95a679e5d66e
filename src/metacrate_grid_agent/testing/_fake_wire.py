"""Wire types of the loopback fake endpoint: what it records, what it sends, and the bytes between.

Sans-I/O, like h11: nothing here awaits, reads the clock or touches a socket.
`_fake_endpoint` does the I/O and asks this module three questions:

- `parse_request_head` and `parse_chunk_size`: what did the client send?
- `render_reply`: which bytes does a :class:`Reply` become (status line, headers, framed body)?
- `iter_pieces`: where do those bytes split into separate writes?

The public types (:class:`Reply`, :class:`RecordedRequest`) are re-exported by
`metacrate_grid_agent.testing`.
"""

from __future__ import annotations

import bisect
import dataclasses
import http
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Literal, TypeAlias

import msgspec

Fault: TypeAlias = Literal["reset", "close"]
"""How a reply breaks the connection: ``"reset"`` sends a TCP RST, ``"close"`` a clean FIN."""

ClosedBy: TypeAlias = Literal["client", "server"]
"""Which side closed a connection."""

ToolCallSpec: TypeAlias = tuple[str, str, str] | Mapping[str, Any]
"""A tool call for `Reply.completion`: ``(id, name, arguments_json)`` or a dict sent verbatim."""

RESPONSE_CHUNK_BYTES: Final = 16_384
"""Largest chunk when a body is sent with chunked framing (several chunks, as real servers do)."""
ENDLESS_PREFIX: Final = b'{"x":"'
"""Opening of an endless body: valid JSON so far, so only a size cap can stop a decoder."""
ENDLESS_PIECE: Final = b"a" * 16_384
"""Repeated forever after `ENDLESS_PREFIX` in an endless body."""
MAX_HEADER_BYTES: Final = 64 * 1024
"""Largest request header block (and trailer line); the endpoint answers 431 beyond."""
MAX_CHUNK_LINE_BYTES: Final = 1024
"""Largest chunk-size line (size plus extensions) in a chunked request body."""
MAX_HEADER_COUNT: Final = 256
"""Most header (or trailer) lines accepted in one request; real clients send about ten."""
MAX_CONTENT_LENGTH_DIGITS: Final = 18
"""A Content-Length longer than this is refused before `int()` (fits in 63 bits)."""
FAKE_MODEL: Final = "fake-model"
"""The `model` field of every scripted completion."""
FAKE_COMPLETION_ID: Final = "chatcmpl-fake"
"""The default `id` field of scripted completions (override with `extra_top`)."""
FAKE_ERROR_TYPE: Final = "fake_endpoint_error"
"""The `error.type` of every error the fake sends about its own failures."""
CONTINUE_RESPONSE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
"""Interim response sent before reading a body announced with ``Expect: 100-continue``."""

_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTENT_LENGTH: Final = re.compile(rf"[0-9]{{1,{MAX_CONTENT_LENGTH_DIGITS}}}")
_CHUNK_SIZE: Final = re.compile(r"[0-9A-Fa-f]{1,15}")
_CRLF: Final = "\r\n"


def _header_values(headers: Iterable[tuple[str, str]], name: str) -> tuple[str, ...]:
    wanted = name.lower()
    return tuple(value for key, value in headers if key.lower() == wanted)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordedRequest:
    """One request as the fake endpoint received it, in arrival order.

    `target` is the request-target exactly as on the request line (path and query), `headers`
    keep their received order and original case, and `body` is the decoded body (chunked framing
    removed). `index` counts requests across the endpoint from 0; `connection_id` is the
    `ConnectionRecord.id` of the connection that carried it.
    """

    method: str
    target: str
    http_version: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    connection_id: int
    index: int

    def header(self, name: str) -> str | None:
        """Return the first value of header `name` (case-insensitive), or None if absent."""
        values = _header_values(self.headers, name)
        return values[0] if values else None

    def header_values(self, name: str) -> tuple[str, ...]:
        """Return every value of header `name` (case-insensitive), in received order."""
        return _header_values(self.headers, name)

    def json(self) -> Any:
        """Decode the body as JSON (raises `msgspec.DecodeError` if it is not JSON)."""
        return msgspec.json.decode(self.body)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reply:
    """One scripted HTTP/1.1 response, and the faults to inject while sending it.

    Offsets (`split_at`, `stall_at`, `fault_at`) count bytes of the complete raw response: status
    line, headers and framed body. Faults apply in this order at each offset: stall, then fault.

    - `reason`: None means the standard phrase for `status` (or ``"Unknown"``).
    - `headers`: sent verbatim, in order. The framing headers (Content-Length,
      Transfer-Encoding, Connection) are added only when `headers` does not name them already.
    - `head`: if given, these bytes replace the generated status line and headers (for
      malformed-response tests); the body is framed as usual.
    - `content_length`: True sends the correct length; an int sends that value (lies allowed);
      False sends none and closes the connection after the body (HTTP/1.0 style).
    - `chunked`: frame the body with Transfer-Encoding: chunked.
    - `split_at`: write the response in separate, separately drained pieces cut at these offsets.
    - `drip_bytes` / `drip_interval_s`: cut it further into pieces of at most this size;
      `drip_interval_s` is the pause between any two consecutive pieces (split or drip).
    - `stall_before_headers_s`: wait before writing anything.
    - `stall_at`: ``(offset, seconds)``: after writing `offset` bytes, pause `seconds`.
    - `fault` / `fault_at`: after `fault_at` bytes (0: before any byte, after reading the
      request; past the end: after the complete response), reset or close the connection.
    - `endless`: after the headers, send `ENDLESS_PREFIX` then `ENDLESS_PIECE` forever, until the
      client goes away or the endpoint's `max_bytes_sent_per_response` is reached (a failure).
      Framing: chunked if `chunked`, a Content-Length if `content_length` is an int, else none.
    - `keep_alive`: False adds ``Connection: close`` and closes after the response.
    - `before_body`: answer as soon as the request head is in, before reading the request
      body (a script item only, not a responder's reply; the request is recorded with an
      empty body). Then the body is read and discarded, as a server that refuses a body
      does before it closes, and the connection is closed (``Connection: close`` is sent).

    Every pause ends early when the client closes the connection. Build common replies with
    `Reply.json`, `Reply.completion`, `Reply.error` and `Reply.redirect`, and add faults with
    `dataclasses.replace(reply, split_at=(7,))`. Invalid combinations raise ValueError listing
    every problem at once.
    """

    status: int = 200
    reason: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    head: bytes | None = None
    content_length: bool | int = True
    chunked: bool = False
    split_at: tuple[int, ...] = ()
    drip_bytes: int | None = None
    drip_interval_s: float = 0.0
    stall_before_headers_s: float = 0.0
    stall_at: tuple[int, float] | None = None
    fault: Fault | None = None
    fault_at: int = 0
    endless: bool = False
    keep_alive: bool = True
    before_body: bool = False

    def __post_init__(self) -> None:
        """Normalize the tuples and reject invalid settings, reporting all problems at once."""
        object.__setattr__(self, "headers", tuple((str(n), str(v)) for n, v in self.headers))
        object.__setattr__(self, "split_at", tuple(sorted(set(self.split_at))))
        problems = list(self._problems())
        if problems:
            raise ValueError("invalid Reply: " + "; ".join(problems))

    def _problems(self) -> Iterator[str]:
        if not 100 <= self.status <= 999:
            yield f"status: {self.status} is not a three-digit code"
        if self.reason is not None and not _is_header_text(self.reason):
            yield "reason: must be latin-1 text without CR or LF"
        for name, value in self.headers:
            if not _TOKEN.fullmatch(name):
                yield f"headers: {name!r} is not a valid header name"
            if not _is_header_text(value):
                yield f"headers: value of {name!r} must be latin-1 text without CR or LF"
        if not isinstance(self.content_length, bool) and self.content_length < 0:
            yield "content_length: must be True, False or a non-negative int"
        if any(offset < 0 for offset in self.split_at):
            yield "split_at: offsets must be >= 0"
        if self.drip_bytes is not None and self.drip_bytes < 1:
            yield "drip_bytes: must be None or >= 1"
        if not _is_duration(self.drip_interval_s):
            yield "drip_interval_s: must be a finite number >= 0"
        if not _is_duration(self.stall_before_headers_s):
            yield "stall_before_headers_s: must be a finite number >= 0"
        if self.stall_at is not None and (
            self.stall_at[0] < 0 or not _is_duration(self.stall_at[1])
        ):
            yield "stall_at: must be (offset >= 0, finite seconds >= 0)"
        if self.fault not in (None, "reset", "close"):
            yield f"fault: {self.fault!r} is not 'reset', 'close' or None"
        if self.fault_at < 0:
            yield "fault_at: must be >= 0"
        if self.fault is None and self.fault_at != 0:
            yield "fault_at: needs a fault"
        if self.endless and self.body:
            yield "body: an endless reply writes its own body; leave body empty"

    @classmethod
    def json(
        cls, obj: object, *, status: int = 200, headers: Iterable[tuple[str, str]] = ()
    ) -> Reply:
        """A reply whose body is `obj` encoded as compact JSON, with Content-Type set."""
        return cls(
            status=status,
            headers=(("Content-Type", "application/json"), *headers),
            body=msgspec.json.encode(obj),
        )

    @classmethod
    def completion(
        cls,
        text: str | None = None,
        *,
        tool_calls: Iterable[ToolCallSpec] = (),
        usage: tuple[int, int] | Mapping[str, Any] | None = None,
        finish_reason: str | None = None,
        extra_message: Mapping[str, Any] | None = None,
        extra_choice: Mapping[str, Any] | None = None,
        extra_top: Mapping[str, Any] | None = None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> Reply:
        """A 200 reply carrying a standard OpenAI chat completion with one choice.

        `tool_calls` are ``(id, name, arguments_json)`` tuples or dicts sent verbatim.
        `finish_reason` defaults to ``"tool_calls"`` when there are tool calls, else ``"stop"``.
        `usage` is ``(prompt_tokens, completion_tokens)`` or a dict sent verbatim; None omits it.
        The `extra_*` mappings are merged last into the message, the choice and the top-level
        object, so they can add fields or overwrite any of the above (even with invalid values).
        """
        message: dict[str, Any] = {"role": "assistant", "content": text}
        calls = [_tool_call(call) for call in tool_calls]
        if calls:
            message["tool_calls"] = calls
        message.update(extra_message or {})
        if finish_reason is None:
            finish_reason = "tool_calls" if calls else "stop"
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason}
        choice.update(extra_choice or {})
        top: dict[str, Any] = {
            "id": FAKE_COMPLETION_ID,
            "object": "chat.completion",
            "created": 0,
            "model": FAKE_MODEL,
            "choices": [choice],
        }
        if isinstance(usage, tuple):
            prompt, completion = usage
            top["usage"] = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
        elif usage is not None:
            top["usage"] = dict(usage)
        top.update(extra_top or {})
        return cls.json(top, headers=headers)

    @classmethod
    def error(
        cls,
        status: int,
        message: str,
        *,
        type: str | None = None,  # noqa: A002 - the error body's own member name
        code: str | int | None = None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> Reply:
        """A reply in the OpenAI error shape ``{"error": {"message", "type", "param", "code"}}``."""
        error = {"message": message, "type": type, "param": None, "code": code}
        return cls.json({"error": error}, status=status, headers=headers)

    @classmethod
    def redirect(
        cls, status: int, location: str, *, headers: Iterable[tuple[str, str]] = ()
    ) -> Reply:
        """A 3xx reply pointing at `location` (absolute URL or path), with an empty body."""
        if not 300 <= status <= 399:
            raise ValueError(f"invalid Reply: redirect status {status} is not 3xx")
        return cls(status=status, headers=(("Location", location), *headers))


Responder: TypeAlias = Callable[[RecordedRequest], Reply | Awaitable[Reply]]
"""Builds the reply to one request; may be sync or async."""
ScriptItem: TypeAlias = Reply | Responder
"""One step of a script: a fixed reply, or a responder called with the request."""


def _is_header_text(text: str) -> bool:
    return "\r" not in text and "\n" not in text and all(ord(ch) < 256 for ch in text)


def _is_duration(seconds: float) -> bool:
    return math.isfinite(seconds) and seconds >= 0


def _tool_call(call: ToolCallSpec) -> dict[str, Any]:
    if isinstance(call, tuple):
        call_id, name, arguments = call
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
    return dict(call)


@dataclasses.dataclass(frozen=True)
class RenderedReply:
    """The bytes of a reply: `raw`, then (if endless) `repeat` again and again."""

    raw: bytes
    repeat: bytes | None
    close_after: bool


def render_reply(reply: Reply, *, client_wants_close: bool) -> RenderedReply:
    """Turn `reply` into bytes; `close_after` says whether the connection ends after it."""
    close_after = (
        not reply.keep_alive
        or reply.content_length is False
        or reply.endless
        or reply.before_body
        or client_wants_close
    )
    given = {name.lower() for name, _ in reply.headers}
    framing: list[tuple[str, str]] = []
    if reply.chunked:
        framing.append(("Transfer-Encoding", "chunked"))
    if not isinstance(reply.content_length, bool):
        framing.append(("Content-Length", str(reply.content_length)))
    elif reply.content_length and not reply.chunked and not reply.endless:
        framing.append(("Content-Length", str(len(reply.body))))
    if close_after:
        framing.append(("Connection", "close"))
    if reply.head is not None:
        head = reply.head
    else:
        reason = reply.reason if reply.reason is not None else _default_reason(reply.status)
        lines = [f"HTTP/1.1 {reply.status} {reason}"]
        lines += [f"{name}: {value}" for name, value in reply.headers]
        lines += [f"{name}: {value}" for name, value in framing if name.lower() not in given]
        head = (_CRLF.join(lines) + _CRLF + _CRLF).encode("latin-1")
    if reply.endless:
        prefix, piece = ENDLESS_PREFIX, ENDLESS_PIECE
        if reply.chunked:
            prefix, piece = _chunk(prefix), _chunk(piece)
        return RenderedReply(head + prefix, piece, close_after)
    body = reply.body
    if reply.chunked:
        chunks = (
            body[i : i + RESPONSE_CHUNK_BYTES] for i in range(0, len(body), RESPONSE_CHUNK_BYTES)
        )
        body = b"".join(map(_chunk, chunks)) + b"0\r\n\r\n"
    return RenderedReply(head + body, None, close_after)


def _default_reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def iter_pieces(
    rendered: RenderedReply, *, cuts: Iterable[int], drip_bytes: int | None
) -> Iterator[bytes]:
    """Yield the reply's bytes as separate writes, cut at every offset in `cuts`.

    Pieces are also at most `drip_bytes` long. For an endless reply this never ends: the caller
    bounds it (the endpoint stops at `max_bytes_sent_per_response`).
    """
    points = sorted(set(cuts))
    offset = 0
    segment: bytes | None = rendered.raw
    while segment is not None:  # bounded by the caller's byte budget when endless
        start = 0
        while start < len(segment):
            end = len(segment)
            if drip_bytes is not None:
                end = min(end, start + drip_bytes)
            following = bisect.bisect_right(points, offset)
            if following < len(points):
                end = min(end, start + points[following] - offset)
            yield segment[start:end]
            offset += end - start
            start = end
        segment = rendered.repeat


@dataclasses.dataclass(kw_only=True)
class ConnectionRecord:
    """One accepted connection, updated by the endpoint while it is open.

    `closed_by` is ``"client"`` when the client closed or reset the connection (or left
    mid-request), ``"server"`` when the fake closed it (a fault, ``Connection: close``, a bound,
    shutdown). `writes` counts separately drained writes, so tests can check that `split_at` and
    `drip_bytes` really split the reply. Wait for the close with `FakeEndpoint.wait_closed`.
    """

    id: int
    tls: bool
    bytes_received: int = 0
    bytes_sent: int = 0
    writes: int = 0
    requests: int = 0
    closed: bool = False
    closed_by: ClosedBy | None = None


class RequestError(Exception):
    """The request could not be parsed; the endpoint answers 500 and records a failure."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestHead:
    """A parsed request line and header block, with the body framing it announces."""

    method: str
    target: str
    http_version: str
    headers: tuple[tuple[str, str], ...]
    chunked: bool
    content_length: int
    wants_close: bool
    expects_continue: bool


def parse_request_head(block: bytes) -> RequestHead:
    """Parse a header block ending in CRLF CRLF; raise RequestError on anything malformed."""
    lines = block.decode("latin-1").removesuffix(_CRLF + _CRLF).split(_CRLF)
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise RequestError(f"malformed request line {lines[0][:80]!r}")
    method, target, version = parts
    if not _TOKEN.fullmatch(method) or not target or version not in ("HTTP/1.1", "HTTP/1.0"):
        raise RequestError(f"malformed request line {lines[0][:80]!r}")
    if len(lines) - 1 > MAX_HEADER_COUNT:
        raise RequestError(f"more than {MAX_HEADER_COUNT} header lines")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise RequestError(f"malformed header line {line[:80]!r}")
        headers.append((name, value.strip(" \t")))
    codings = [
        c.strip().lower()
        for v in _header_values(headers, "transfer-encoding")
        for c in v.split(",")
    ]
    lengths = set(_header_values(headers, "content-length"))
    if codings and codings[-1] != "chunked":
        raise RequestError(f"unsupported transfer-encoding {codings!r}")
    if codings and lengths:
        raise RequestError("both transfer-encoding and content-length")
    if len(lengths) > 1 or not all(_CONTENT_LENGTH.fullmatch(v) for v in lengths):
        raise RequestError(f"invalid content-length {sorted(lengths)!r}")
    connection = {
        t.strip().lower() for v in _header_values(headers, "connection") for t in v.split(",")
    }
    wants_close = "close" in connection or (
        version == "HTTP/1.0" and "keep-alive" not in connection
    )
    expect = {v.strip().lower() for v in _header_values(headers, "expect")}
    return RequestHead(
        method=method,
        target=target,
        http_version=version,
        headers=tuple(headers),
        chunked=bool(codings),
        content_length=int(lengths.pop()) if lengths else 0,
        wants_close=wants_close,
        expects_continue="100-continue" in expect,
    )


def parse_chunk_size(line: bytes) -> int:
    """Parse a chunk-size line (``1a;ext=x\\r\\n``); raise RequestError if malformed."""
    size = line.removesuffix(b"\r\n").split(b";", 1)[0].strip(b" \t").decode("latin-1")
    if not _CHUNK_SIZE.fullmatch(size):
        raise RequestError(f"malformed chunk size line {line[:40]!r}")
    return int(size, 16)
