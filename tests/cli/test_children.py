"""The CLI suite's own bounds on its children: one per core at a time, none outliving a failure.

A test that starts several ``grid-agent`` children at once must not outrun a loaded machine
(each child's time limit, or its fake endpoint's lifetime, would then measure the queue, not
its work), and when one case fails the others must stop with it: their processes killed and
reaped and their sockets closed before the test ends, so nothing they leave behind fails an
unrelated test later.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest

from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import KEY_ENV, MAX_CHILDREN, RunCLI, together

#: The fake's stall: far longer than any bound below, so only the child's death can end it.
STALL_S = 30.0
#: How long a killed child's connection may take to be seen closed.
CLOSED_WITHIN_S = 5.0
#: How long each probe is held: long enough that unbounded children would overlap.
HOLD_S = 0.5

pytestmark = pytest.mark.slow


def probe_args(url: str) -> tuple[str, ...]:
    return ("probe", "--endpoint", url, "--api-key-env", KEY_ENV, "--json")


async def test_a_failing_case_stops_its_siblings(cli: RunCLI) -> None:
    """The first failure among children run together kills the rest before the test goes on.

    One child waits on a stalled endpoint while a sibling case fails: ``together`` raises the
    failure, and by then the waiting child is gone (its connection closed by the client).
    """

    class CaseFailedError(Exception):
        pass

    stalled = dataclasses.replace(Reply.completion("late"), stall_before_headers_s=STALL_S)
    async with FakeEndpoint([stalled]) as ep:

        async def failing_case() -> None:
            await ep.wait_for_request(0)
            raise CaseFailedError

        with pytest.raises(ExceptionGroup) as caught:
            await together(cli(*probe_args(ep.url)), failing_case(), limit=2)  # both at once
        closed = await ep.wait_closed(0, timeout_s=CLOSED_WITHIN_S)
        assert [CaseFailedError] == [type(e) for e in caught.value.exceptions]
        assert closed.closed_by == "client"
        assert ep.open_connections == 0


async def test_children_run_at_most_one_per_core(cli: RunCLI) -> None:
    """More children than cores, each held a while: never more than one per core at once.

    Every child still runs and succeeds; the ones beyond the bound wait their turn.
    """
    count = MAX_CHILDREN + 1
    held = dataclasses.replace(Reply.completion("ok"), stall_before_headers_s=HOLD_S)
    async with FakeEndpoint([held] * count) as ep:
        results = await together(*(cli(*probe_args(ep.url)) for _ in range(count)))
    assert [0] * count == [r.returncode for r in results]
    assert count == len(ep.requests)
    assert ep.max_concurrent_requests <= MAX_CHILDREN


async def test_cases_wait_their_turn_before_they_start(cli: RunCLI) -> None:
    """More cases than cores: a case beyond the bound starts only when an earlier one ended.

    So a case's own fake endpoint is open only while its child runs, never while it queues
    (a queued endpoint outlived its lifetime on a loaded machine).
    """
    count = MAX_CHILDREN + 1
    running = most = 0

    async def case() -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        async with FakeEndpoint([Reply.completion("ok")]) as ep:
            result = await cli(*probe_args(ep.url))
        running -= 1
        return result.returncode

    assert [0] * count == await together(*(case() for _ in range(count)))
    assert most == MAX_CHILDREN


async def test_a_case_that_never_started_is_closed_quietly() -> None:
    """A case still waiting for its turn when another fails is closed, not left unawaited.

    An unawaited coroutine warns when collected, and warnings are errors: the warning would
    fail whichever test was running then.
    """
    started: list[str] = []

    async def failing_case() -> None:
        started.append("failing")
        raise ValueError("a failing case")

    async def waiting_case() -> None:
        started.append("waiting")

    with pytest.raises(ExceptionGroup) as caught:
        await together(failing_case(), waiting_case(), limit=1)
    failures = [type(e) for e in caught.value.exceptions]
    del caught  # its traceback holds the cases: let them go
    gc.collect()  # a coroutine left unawaited would warn here, failing this test
    assert [ValueError] == failures
    assert started == ["failing"]
