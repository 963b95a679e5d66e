"""The hostile endpoint as a property: any response, mutated, cut into any reads, closed anywhere.

Hypothesis builds a valid response (a status, a body, its framing: Content-Length, chunked
or delimited by the close) and mutates it as a hostile endpoint would: interim heads, some
with a body; a status outside 100-599; chunk extensions, short or far past the per-line
bound; leading zeros; trailers that name a content coding; bytes after the response. Each is
delivered to the connection protocol (a stub transport, as in ``protocol_support``) cut into
random reads, and closed at a random byte or not at all. For every example:

* it settles as a response or as one of the HTTP layer's typed failures, and the same way
  however the reads are cut;
* the bytes read for the response are at most the cap plus ``MAX_RESPONSE_OVERHEAD_BYTES``;
* a complete 2xx response carries the body the endpoint framed, never another (an interim
  body, a trailer, bytes after it); a body delimited by the close and cut early is the one
  exception HTTP/1.1 leaves (it reads as what arrived; the JSON decode refuses it);
* a valid response delivered whole is read whole, and the connection goes back to the
  pool only after such a response, with nothing after it.

A second, smaller property measures memory (tracemalloc) for random chunk and extension
sizes. The fast tier runs a few hundred examples; ``HYPOTHESIS_PROFILE=long`` runs
:data:`tests.proof_profiles.LONG_EXAMPLES` (see docs/proof.md).
"""

from __future__ import annotations

import asyncio
import tracemalloc
from dataclasses import dataclass
from typing import Final

import hypothesis
import hypothesis.strategies as st
import pytest

from metacrate_grid_agent._aio import _response
from metacrate_grid_agent._aio._http import (
    MAX_FRAMING_BYTES,
    MAX_HEAD_BYTES,
    MAX_RESPONSE_OVERHEAD_BYTES,
)
from tests.llm_transport.client.protocol_support import exchange
from tests.proof_profiles import examples

#: The body cap (and error-body cap) of these exchanges.
CAP: Final = 2048
#: What the connection refuses past, once the final head has ended: cap + head + framing.
TOTAL_BOUND: Final = CAP + MAX_HEAD_BYTES + MAX_FRAMING_BYTES
#: The HTTP layer's typed failures: every exception an exchange may settle with.
TYPED: Final = {
    name
    for name, value in vars(_response).items()
    if isinstance(value, type) and issubclass(value, _response.HTTPLayerError)
}
#: Extension lengths: well within the per-line bound, or well past it (between the two,
#: where a run passes the bound depends on how the reads cut it, is not drawn).
SHORT_EXTENSION: Final = st.one_of(st.integers(0, 64), st.integers(1000, 40_000))
LONG_EXTENSION: Final = st.integers(100_000, 150_000)
INTERIM_BODY: Final = b'{"choices":[{"message":{"content":"SMUGGLED"}}]}'


@dataclass(frozen=True)
class Example:
    """One hostile response and how it is delivered."""

    raw: bytes
    #: Where the response proper ends (extra bytes may follow it).
    end: int
    status: int
    body: bytes
    framing: str
    #: Whether the endpoint broke a rule (then no complete 2xx may come of it).
    broken: bool
    cuts: list[int]
    close_at: int | None


def _chunk_line(size: int, zeros: int, extension: int) -> bytes:
    line = b"0" * zeros + b"%x" % size
    return line + (b";e=" + b"x" * extension if extension else b"") + b"\r\n"


@st.composite
def _examples(draw: st.DrawFn) -> Example:
    status = draw(st.sampled_from([200, 201, 204, 400, 429, 500, 503]))
    framing = "none" if status == 204 else draw(st.sampled_from(["length", "chunked", "close"]))
    body = b"" if status == 204 else draw(st.binary(max_size=3 * CAP // 2))
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    broken = False
    code = b"%d" % status
    if draw(st.integers(0, 9)) == 0:
        code, broken = draw(st.sampled_from([b"000", b"099", b"600", b"999"])), True
    head = [b"HTTP/%b %b X" % (version, code), b"Content-Type: application/json"]
    if version == b"1.0" and framing != "close" and draw(st.booleans()):
        head.append(b"Connection: keep-alive")
    if framing == "length":
        head.append(b"Content-Length: %d" % len(body))
        framed = body
    elif framing == "chunked":
        head.append(b"Transfer-Encoding: chunked")
        sizes = draw(st.lists(st.integers(1, 700), max_size=8))
        pieces, at = [], 0
        for size in [*sizes, len(body)]:  # the last one takes what is left
            piece, at = body[at : at + size], at + size
            if piece:
                zeros = draw(st.integers(0, 3))
                long = draw(st.integers(0, 19)) == 0
                extension = draw(LONG_EXTENSION if long else SHORT_EXTENSION)
                broken = broken or long
                pieces.append(_chunk_line(len(piece), zeros, extension) + piece + b"\r\n")
        trailers = draw(
            st.lists(
                st.sampled_from(
                    [
                        b"Content-Encoding: gzip",
                        b"Content-Type: text/html",
                        b"X-T: 1",
                        b"Expires: 0",
                    ]
                ),
                max_size=3,
            )
        )
        framed = b"".join(pieces) + b"0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n"
    else:
        framed = body
    interim = b""
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["plain", "plain", "length", "chunked"]))
        line = b"HTTP/1.1 %d X\r\nLink: </a>\r\n" % draw(st.sampled_from([100, 102, 103, 199]))
        if kind == "plain":
            interim += line + b"\r\n"
        elif kind == "length":
            interim += line + b"Content-Length: %d\r\n\r\n%b" % (len(INTERIM_BODY), INTERIM_BODY)
            broken = True
        else:
            smuggled = b"%x\r\n%b\r\n0\r\n\r\n" % (len(INTERIM_BODY), INTERIM_BODY)
            interim += line + b"Transfer-Encoding: chunked\r\n\r\n" + smuggled
            broken = True
    response = interim + b"\r\n".join(head) + b"\r\n\r\n" + framed
    extra = b""
    if framing != "close" and draw(st.integers(0, 4)) == 0:
        extra = draw(
            st.sampled_from(
                [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", b"X", b"garbage\r\n\r\n"]
            )
        )
    raw = response + extra
    cuts = draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=6))
    close_at = draw(
        st.one_of(st.none(), st.just(len(raw)), st.integers(0, len(raw)), st.just(len(response)))
    )
    return Example(raw, len(response), status, body, framing, broken, cuts, close_at)


def _delivered_whole(example: Example) -> bool:
    """The whole response arrives, its end is known, and nothing follows it."""
    if example.framing == "close":
        return example.close_at == len(example.raw)
    if example.close_at is None:
        return example.end == len(example.raw)
    return example.close_at == example.end


async def _check(example: Example) -> None:
    """Every property of the module docstring, for one example."""
    raw, close_at = example.raw, example.close_at
    settled = await exchange(raw, example.cuts, close_at=close_at, cap=CAP, error_cap=CAP)
    whole = await exchange(raw, [], close_at=close_at, cap=CAP, error_cap=CAP)
    result = settled.outcome
    # One of the typed outcomes, whatever the cuts.
    assert len(result) == 7 or result[0] in TYPED, result
    assert result == whole.outcome
    # Bytes read: bounded by the cap and the stated constant.
    assert settled.read_for_response <= CAP + MAX_RESPONSE_OVERHEAD_BYTES
    # Never another body.
    if len(result) == 7 and result[4] and 200 <= result[0] < 300:
        cut_short = example.framing == "close" and close_at != len(raw)
        assert not example.broken
        assert result[3] == example.body or cut_short
    # A valid response delivered whole is read whole (within the cap and the bounds).
    fits = len(example.body) <= CAP and example.end <= TOTAL_BOUND
    if not example.broken and fits and _delivered_whole(example):
        assert result[:1] + result[3:5] == (example.status, example.body, True), result
    # Reused only after a clean, complete response with nothing after it.
    if settled.kept:
        assert result[4]
        assert not example.broken
        assert (close_at, example.end) == (None, len(raw))


@pytest.mark.slow
def test_a_hostile_response_settles_as_one_completion_or_a_typed_error() -> None:
    """The properties of the module docstring, over a few hundred hostile examples (about a
    second on a loaded two-core machine)."""
    with asyncio.Runner() as runner:

        @hypothesis.settings(max_examples=examples(300), deadline=None)
        @hypothesis.given(example=_examples())
        def check(example: Example) -> None:
            runner.run(_check(example))

        check()


#: Cap of the memory property, and what an exchange may allocate besides its body.
MEMORY_CAP: Final = 256 * 1024
CONSTANT: Final = 256 * 1024


def test_memory_per_response_is_bounded_whatever_the_framing() -> None:
    """Peak memory of one exchange stays within twice the cap plus a constant, for random
    chunk sizes (1 byte to 16 KiB) and extension lengths, body up to the cap."""
    with asyncio.Runner() as runner:

        @hypothesis.settings(max_examples=examples(15), deadline=None)
        @hypothesis.given(
            size=st.one_of(st.integers(1, 8), st.integers(1, 16 * 1024)),
            extension=st.integers(0, 64),
            length=st.integers(0, MEMORY_CAP),
        )
        def check(size: int, extension: int, length: int) -> None:
            chunk = _chunk_line(size, 0, extension) + b"x" * size + b"\r\n"
            whole, rest = divmod(length, size)
            tail = _chunk_line(rest, 0, extension) + b"x" * rest + b"\r\n" if rest else b""
            head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            raw = head + chunk * whole + tail + b"0\r\n\r\n"
            peak = runner.run(_peak(raw))
            assert peak <= 2 * MEMORY_CAP + CONSTANT

        check()


async def _peak(raw: bytes) -> int:
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        settled = await exchange(raw, [], cap=MEMORY_CAP, error_cap=MEMORY_CAP)
        assert len(settled.outcome) == 7 or settled.outcome[0] in TYPED
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
