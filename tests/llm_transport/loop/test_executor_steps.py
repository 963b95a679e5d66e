"""An executor call is the same whether it returns at once, awaits, or is no coroutine.

The loop runs a coroutine executor's first step itself and arms the call's timer only when
the call awaits (a call that returns at once cannot be cut by a timer). These tests pin what
must not change with that: an awaitable that is not a coroutine is awaited as before and
still cut at its timeout; a call that awaits still gets its timeout and the session's cut,
with values and throws passed through its awaits; and the session's token keeps no hold on
the token of a call that is over.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import TYPE_CHECKING, Any, cast

from metacrate_grid_agent import (
    CancelToken,
    Outcome,
    SessionGeneration,
    Success,
    ToolExecutor,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    SESSION,
    call,
    calls_reply,
    loop_config,
    make_loop,
    run_loop,
    start_loop,
)

if TYPE_CHECKING:
    from collections.abc import Generator

    from tests.llm_transport.conftest import ClientFactory

SHORT_S = 0.2
"""A tool timeout, always set against a future nobody resolves."""


class FutureExecutor:
    """Returns a plain future (no coroutine): resolved at once, or never."""

    def __init__(self, *, resolve: bool) -> None:
        self.resolve = resolve
        self.futures: list[asyncio.Future[ToolOutcome]] = []

    def execute(self, call: ValidatedCall, cancel: CancelToken) -> asyncio.Future[ToolOutcome]:
        future: asyncio.Future[ToolOutcome] = asyncio.get_running_loop().create_future()
        if self.resolve:
            future.set_result(Success(f"future {call.id}"))
        self.futures.append(future)
        return future


def as_executor(executor: FutureExecutor) -> ToolExecutor:
    """The future-returning executor where a ``ToolExecutor`` is expected: the protocol
    declares a coroutine, and this one is awaitable without being one (on purpose)."""
    return cast("ToolExecutor", executor)


class _Echo:
    """An awaitable that yields one bare pass and returns what it was sent back."""

    def __await__(self) -> Generator[None, Any, str]:
        sent = yield
        return f"sent {sent!r}"


class AwaitingExecutor:
    """Awaits several times before answering; keeps weak references to its tokens."""

    def __init__(self) -> None:
        self.tokens: list[weakref.ref[CancelToken]] = []
        self.alive_at_call: list[int] = []
        self.echoes: list[str] = []

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        gc.collect()  # the tokens of earlier calls, while the session (and its token) lives
        self.alive_at_call.append(sum(ref() is not None for ref in self.tokens))
        self.tokens.append(weakref.ref(cancel))
        await asyncio.sleep(0)
        self.echoes.append(await _Echo())
        await asyncio.sleep(0)
        return Success(f"awaited {call.id}")


async def test_an_awaitable_that_is_no_coroutine_is_awaited(
    client_factory: ClientFactory,
) -> None:
    """An executor returning a resolved future (not a coroutine) has its result used.

    Protects: the loop's first-step shortcut applies to coroutines only; any awaitable an
    executor returns is still awaited for its outcome.
    """
    executor = FutureExecutor(resolve=True)
    async with FakeEndpoint([calls_reply(call("l-1", "look")), Reply.completion("ok")]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), as_executor(executor)))

    assert run.result.outcome is Outcome.COMPLETED
    assert [(c.call_id, c.status) for c in run.result.calls] == [("l-1", "ok")]
    assert len(executor.futures) == 1
    assert ep.requests[1].json()["messages"][-1]["content"] == "future l-1"


async def test_an_awaitable_that_is_no_coroutine_is_cut_at_its_timeout(
    client_factory: ClientFactory,
) -> None:
    """A future nobody resolves is cut at the tool's timeout, and the model hears it.

    Protects: a call that is no coroutine still runs under its timer.
    """
    executor = FutureExecutor(resolve=False)
    async with FakeEndpoint([calls_reply(call("l-1", "look")), Reply.completion("ok")]) as ep:
        config = loop_config(tool_timeout_s=SHORT_S)
        loop = make_loop(client_factory(ep.url), as_executor(executor), config=config)
        run = await run_loop(loop)

    assert run.result.outcome is Outcome.COMPLETED
    assert [(c.call_id, c.status) for c in run.result.calls] == [("l-1", "failed")]
    assert executor.futures[0].cancelled()
    assert len(ep.requests) == 2


async def test_a_call_that_awaits_gets_what_its_awaits_are_sent(
    client_factory: ClientFactory,
) -> None:
    """A coroutine executor that awaits several times (a bare pass among them) finishes
    with what each await was given, and its token is not held once the call is over.

    Protects: the rest of a call after its first step is awaited as ``await`` would
    (the task's sends passed through), and the session's token drops the token of a call
    that ended (a long session does not grow with its calls).
    """
    executor = AwaitingExecutor()
    generation = SessionGeneration(SESSION)
    async with FakeEndpoint(
        [calls_reply(call("l-1", "look"), call("l-2", "look")), Reply.completion("ok")]
    ) as ep:
        handle = start_loop(make_loop(client_factory(ep.url), executor), generation=generation)
        run = await handle.finish()

    assert run.result.outcome is Outcome.COMPLETED
    assert [(c.call_id, c.status) for c in run.result.calls] == [
        ("l-1", "ok"),
        ("l-2", "ok"),
    ]
    assert executor.echoes == ["sent None", "sent None"]
    assert executor.alive_at_call == [0, 0]
