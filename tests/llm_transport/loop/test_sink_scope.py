"""The ``on_event`` sink's optional ``scope``: entered around the run, each request sent and
each executor call, in that nesting; one that raises is logged and skipped, never fatal."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from metacrate_grid_agent import LoopEvent, SessionGeneration
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    RecordingExecutor,
    call,
    calls_reply,
    make_loop,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pytest

    from tests.llm_transport.conftest import ClientFactory


class ScopedSink:
    """Records each event kind and each scope entered and left, in order."""

    def __init__(self, *, raises: bool = False) -> None:
        self.seen: list[str] = []
        self.raises = raises

    def __call__(self, event: LoopEvent) -> None:
        """Note the event."""
        self.seen.append(event.kind)

    def scope(self, kind: str) -> contextlib.AbstractContextManager[None]:
        """Note entering and leaving ``kind`` (or refuse, when told to)."""
        if self.raises:
            raise RuntimeError("scope broke")
        return self._scope(kind)

    @contextlib.contextmanager
    def _scope(self, kind: str) -> Iterator[None]:
        self.seen.append(f"+{kind}")
        try:
            yield
        finally:
            self.seen.append(f"-{kind}")


async def test_scopes_nest_around_the_run_each_request_and_each_call(
    client_factory: ClientFactory,
) -> None:
    """The run's scope holds every step; a request's scope holds only the request (the
    ``request`` event comes before it, the ``reply`` after); a call's only the executor."""
    script = [calls_reply(call("c1", "look")), Reply.completion("done")]
    sink = ScopedSink()
    async with FakeEndpoint(script) as endpoint:
        loop = make_loop(client_factory(endpoint.url), RecordingExecutor())
        result = await loop.run("walk", generation=SessionGeneration("s"), on_event=sink)
    assert result.outcome == "completed"
    assert sink.seen == [
        "+session",
        "request", "+request", "-request", "reply",
        "tool_call", "+tool", "-tool", "tool_result",
        "request", "+request", "-request", "reply",
        "-session",
        "finish",
    ]  # fmt: skip


async def test_a_scope_that_raises_is_logged_and_the_run_goes_on(
    client_factory: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A sink whose ``scope`` raises: the run completes as without it, and each failure is
    a WARNING on the loop's logger."""
    script = [calls_reply(call("c1", "look")), Reply.completion("done")]
    sink = ScopedSink(raises=True)
    with caplog.at_level(logging.WARNING, logger="metacrate_grid_agent.loop"):
        async with FakeEndpoint(script) as endpoint:
            loop = make_loop(client_factory(endpoint.url), RecordingExecutor())
            result = await loop.run("walk", generation=SessionGeneration("s"), on_event=sink)
    assert result.outcome == "completed"
    kinds = [
        r.getMessage().removeprefix("the on_event sink's scope raised on '").split("'")[0]
        for r in caplog.records
        if "scope raised" in r.getMessage()
    ]
    assert kinds == ["session", "request", "tool", "request"]


EXPECTED_SCOPED = [
    "+session",
    "request", "+request", "-request", "reply",
    "tool_call", "+tool", "-tool", "tool_result",
    "request", "+request", "-request", "reply",
    "-session",
    "finish",
]  # fmt: skip


async def test_several_sinks_each_get_every_event_and_each_scope_is_entered(
    client_factory: ClientFactory,
) -> None:
    """``on_event=(a, b, fn)``: every sink gets every event, in order, and each sink's scope
    is entered around the run, each request sent and each call, as if it were alone (the
    first sink's scope outermost); a sink without a scope is simply told of events."""
    script = [calls_reply(call("c1", "look")), Reply.completion("done")]
    first, second, plain = ScopedSink(), ScopedSink(), []
    async with FakeEndpoint(script) as endpoint:
        loop = make_loop(client_factory(endpoint.url), RecordingExecutor())
        result = await loop.run(
            "walk",
            generation=SessionGeneration("s"),
            on_event=(first, second, lambda event: plain.append(event.kind)),
        )
    assert result.outcome == "completed"
    assert first.seen == second.seen == EXPECTED_SCOPED
    assert plain == [kind for kind in EXPECTED_SCOPED if kind[0] not in "+-"]


class Nested:
    """Two sinks' scopes that share one record: shows which is entered first."""

    def __init__(self, name: str, seen: list[str]) -> None:
        self.name = name
        self.seen = seen

    def __call__(self, event: LoopEvent) -> None:
        """Events are not what this sink checks."""

    @contextlib.contextmanager
    def scope(self, kind: str) -> Iterator[None]:
        """Note entering and leaving ``kind`` under this sink's name."""
        self.seen.append(f"+{self.name}:{kind}")
        try:
            yield
        finally:
            self.seen.append(f"-{self.name}:{kind}")


async def test_the_first_sinks_scope_is_the_outermost(client_factory: ClientFactory) -> None:
    """Scopes are entered in the sinks' order and left in the reverse order (properly
    nested), so a span made current by the first sink is the parent of the second's."""
    seen: list[str] = []
    async with FakeEndpoint([Reply.completion("done")]) as endpoint:
        loop = make_loop(client_factory(endpoint.url), RecordingExecutor())
        await loop.run(
            "walk",
            generation=SessionGeneration("s"),
            on_event=[Nested("a", seen), Nested("b", seen)],
        )
    assert seen == [
        "+a:session", "+b:session",
        "+a:request", "+b:request", "-b:request", "-a:request",
        "-b:session", "-a:session",
    ]  # fmt: skip


async def test_a_failing_sink_is_logged_and_the_others_still_get_everything(
    client_factory: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A sink that raises on every event, and whose scope raises, between two others: each
    failure is a WARNING on the loop's logger, and the sinks after it still get every event
    and have their scopes entered; the run completes."""

    class Broken(ScopedSink):
        def __call__(self, event: LoopEvent) -> None:
            raise RuntimeError("sink broke")

    script = [calls_reply(call("c1", "look")), Reply.completion("done")]
    before, after = ScopedSink(), ScopedSink()
    with caplog.at_level(logging.WARNING, logger="metacrate_grid_agent.loop"):
        async with FakeEndpoint(script) as endpoint:
            loop = make_loop(client_factory(endpoint.url), RecordingExecutor())
            result = await loop.run(
                "walk",
                generation=SessionGeneration("s"),
                on_event=(before, Broken(raises=True), after),
            )
    assert result.outcome == "completed"
    assert before.seen == after.seen == EXPECTED_SCOPED
    messages = [r.getMessage() for r in caplog.records]
    assert sum("on_event sink raised" in m for m in messages) == 7  # every event
    assert sum("scope raised" in m for m in messages) == 4  # session, 2 requests, 1 tool


async def test_one_sink_in_a_sequence_is_that_sink(client_factory: ClientFactory) -> None:
    """``on_event=(sink,)`` is ``on_event=sink``; ``on_event=()`` is no sink at all."""
    sink = ScopedSink()
    async with FakeEndpoint([Reply.completion("done"), Reply.completion("done")]) as endpoint:
        loop = make_loop(client_factory(endpoint.url), RecordingExecutor())
        await loop.run("walk", generation=SessionGeneration("s"), on_event=(sink,))
        result = await loop.run("walk", generation=SessionGeneration("t"), on_event=())
    assert sink.seen == [
        "+session",
        "request",
        "+request",
        "-request",
        "reply",
        "-session",
        "finish",
    ]
    assert result.outcome == "completed"
