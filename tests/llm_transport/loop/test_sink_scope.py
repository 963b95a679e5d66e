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
