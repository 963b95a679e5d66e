"""The tool loop's calls into application code: the executor, the approver, the summariser.

Each call runs in the loop's task under a bound: a tool call with its own child token and
one timer at the earlier of its timeout and the session's end (:func:`run_tool`), an
approval with its own child token within ``approval_timeout_s`` (:func:`ask`), a summary
with its own child token within ``summarizer_timeout_s`` (:func:`summarize`). Whatever the
application code raises or returns becomes a value the machine takes (a failure, an
ambiguous call, a denial, the truncation marker); only a cut of the session itself
propagates. The child tokens get the reason for the cut before it reaches the application
code.
"""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Coroutine, Generator
from typing import Any, Final, Literal, TypeAlias, TypeVar, cast

from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._aio._protocols import Approver, SummaryCall, ToolExecutor
from metacrate_grid_agent._core._loop import AskApproval, RunTool, Summarize
from metacrate_grid_agent._core._tools import (
    Ambiguous,
    Approved,
    Denied,
    Effect,
    Failure,
    Success,
    ToolOutcome,
    ValidatedCall,
)

__all__ = [
    "APPROVAL_TIMEOUT",
    "SUMMARIZER_TIMEOUT",
    "TASK_CANCELLED",
    "TOOL_TIMEOUT",
    "WALL_CLOCK",
    "Verdict",
    "ask",
    "run_tool",
    "summarize",
]

logger = logging.getLogger("metacrate_grid_agent.loop")
_T = TypeVar("_T")

#: Reason given to a call cut by its tool's own timeout.
TOOL_TIMEOUT: Final = "tool_timeout"
#: Reason given to an approver's token when ``approval_timeout_s`` runs out.
APPROVAL_TIMEOUT: Final = "approval_timeout"
#: Reason given to a summarizer's token when ``summarizer_timeout_s`` runs out.
SUMMARIZER_TIMEOUT: Final = "summarizer_timeout"
#: Reason given to whatever the session's wall-clock bound cuts.
WALL_CLOCK: Final = "wall_clock"
#: Reason recorded when the task running ``ToolLoop.run`` is cancelled from outside.
TASK_CANCELLED: Final = "task_cancelled"

#: What became of one approval question: the operator's answer, no answer in time, an
#: approver that failed, or a cut of the session while it waited.
Verdict: TypeAlias = Literal["approved", "denied", "timeout", "failed", "cut"]


async def summarize(
    summarize_span: SummaryCall | None,
    decision: Summarize,
    token: CancelToken,
    timeout_s: float,
    deadline: float,
) -> str | None:
    """Ask for one summary, with its own child token, within ``summarizer_timeout_s``.

    The child is cancelled, with the reason, before a cut reaches the summarizer:
    ``summarizer_timeout``, ``wall_clock``, the session token's reason, or
    ``task_cancelled``. None (the truncation marker) when there is no summarizer, or it
    fails, runs out of time or returns something other than a str. ``token`` is the
    session's, ``deadline`` its wall-clock end on the loop's clock.
    """
    if summarize_span is None:
        return None
    loop = asyncio.get_running_loop()
    child = token.child()
    summary_deadline = loop.time() + timeout_s
    timers = [
        loop.call_at(summary_deadline, child.cancel, SUMMARIZER_TIMEOUT),
        loop.call_at(deadline, child.cancel, WALL_CLOCK),
    ]
    try:
        async with asyncio.timeout_at(summary_deadline):
            text = await summarize_span(decision.span, child)
    except TimeoutError:
        logger.warning("summarizer timed out; using the truncation marker")
        return None
    except Exception as exc:  # noqa: BLE001 - application code: any failure means the marker
        logger.warning("summarizer failed (%s); using the truncation marker", type(exc).__name__)
        return None
    except asyncio.CancelledError:
        child.cancel(TASK_CANCELLED)  # no effect when a cut already gave its reason
        raise
    finally:
        for timer in timers:
            timer.cancel()
    return text if isinstance(text, str) else None


async def ask(
    approver: Approver, decision: AskApproval, token: CancelToken, deadline: float
) -> tuple[Approved | Denied, Verdict]:
    """Ask the approver about one call, with its own child token, within its timeout.

    No answer within ``approval_timeout_s``, an exception or a value other than
    :class:`Approved` / :class:`Denied` is a denial. A cut of the session (token, wall
    clock, task) propagates: the machine then records the call as never run.
    ``token`` is the session's, ``deadline`` its wall-clock end on the loop's clock.
    Returns the answer and what it was: ``approved``, ``denied``, ``timeout`` (no answer
    in time) or ``failed`` (the approver raised or answered nonsense).
    """
    loop = asyncio.get_running_loop()
    request = decision.request
    child = token.child()
    answer_deadline = loop.time() + decision.timeout_s
    timers = [
        loop.call_at(answer_deadline, child.cancel, APPROVAL_TIMEOUT),
        loop.call_at(deadline, child.cancel, WALL_CLOCK),
    ]
    scope = asyncio.timeout_at(answer_deadline)
    try:
        async with scope:
            verdict = await approver.approve(request, child)
    except TimeoutError as exc:
        if scope.expired():
            child.cancel(APPROVAL_TIMEOUT)
            return Denied(f"no answer within {decision.timeout_s:g} s"), "timeout"
        return _approver_failed(request.call, exc), "failed"
    except Exception as exc:  # noqa: BLE001 - application code: any failure is a denial
        return _approver_failed(request.call, exc), "failed"
    except asyncio.CancelledError:
        child.cancel(TASK_CANCELLED)  # no effect when a cut already gave its reason
        raise
    finally:
        for timer in timers:
            timer.cancel()
    if child.reason == APPROVAL_TIMEOUT:
        # The approver swallowed its timeout's cancellation and answered late anyway.
        return Denied(f"no answer within {decision.timeout_s:g} s"), "timeout"
    if not isinstance(verdict, Approved | Denied):
        logger.warning(
            "the approver returned %s for call %s of tool %r, not Approved or Denied; "
            "counted as denied",
            type(verdict).__name__,
            request.call.id,
            request.call.name,
        )
        return Denied(f"the approver gave no valid answer ({type(verdict).__name__})"), "failed"
    return verdict, "approved" if isinstance(verdict, Approved) else "denied"


async def run_tool(
    executor: ToolExecutor,
    decision: RunTool,
    token: CancelToken,
    deadline: float,
    *,
    now: float,
    task: asyncio.Task[Any],
) -> ToolOutcome:
    """Run one call with its own child token, cut at its timeout or the session's end.

    The child token is cancelled, with the reason, before the cut reaches the executor:
    ``tool_timeout`` at the tool's timeout, ``wall_clock`` at the session's deadline,
    the session token's reason (``superseded``, the operator's) when the session is cut,
    ``task_cancelled`` when the task is cancelled from outside. An executor cancelling
    its child itself changes nothing for the loop: the call's outcome is still what it
    returns or raises. ``token`` is the session's, ``deadline`` its wall-clock end, ``now``
    the loop's time the call starts at (read by the driver's check right before it),
    ``task`` the task running the session (this one).
    """
    call = decision.call
    # The call's own token, held by the session's token (which cancels it with its reason)
    # until the call is over: set and cleared here, attribute stores rather than calls.
    child = CancelToken()
    if token._reason is not None:  # noqa: SLF001 - the token is the session's, cut already
        child.cancel(token._reason)  # noqa: SLF001 - as above
    token._call = child  # noqa: SLF001 - cleared below, when the call is over
    tool_deadline = now + decision.timeout_s
    cancelling = task.cancelling()
    cut = None
    try:
        try:
            running = executor.execute(call, child)
            if type(running) is _COROUTINE:
                # The call's first step runs here, before any timer: a call that returns
                # without awaiting cannot be cut by one (no timer fires while it runs), so
                # it gets none; one that awaits gets its timer before it is suspended.
                try:
                    pending = running.send(None)
                except StopIteration as done:
                    outcome = done.value
                else:
                    cut = _CallTimer(task, cancelling, child, tool_deadline < deadline)
                    timer = task.get_loop().call_at(min(tool_deadline, deadline), cut.fire)
                    try:
                        outcome = await _rest(running, pending)
                    finally:
                        timer.cancel()
                        cut.settle()
            else:
                cut = _CallTimer(task, cancelling, child, tool_deadline < deadline)
                timer = task.get_loop().call_at(min(tool_deadline, deadline), cut.fire)
                try:
                    outcome = await running
                finally:
                    timer.cancel()
                    cut.settle()
        finally:
            token._call = None  # noqa: SLF001 - set above
    except asyncio.CancelledError:
        if cut is None or not cut.timed_out:
            child.cancel(TASK_CANCELLED)  # no effect when a cut already gave its reason
            raise
        return _timed_out(decision)
    except TimeoutError:
        return _timed_out(decision)
    except Exception as exc:
        logger.warning(
            "tool %r (call %s) raised %s",
            call.name,
            call.id,
            type(exc).__name__,
            exc_info=exc,
        )
        return _failed(call, f"tool {call.name!r} failed ({type(exc).__name__})", effect=True)
    if child._reason == TOOL_TIMEOUT and task.get_loop().time() >= tool_deadline:  # noqa: SLF001
        # The executor swallowed its timeout's cancellation and returned late anyway.
        return _timed_out(decision)
    if not isinstance(outcome, _OUTCOMES):
        text = f"tool {call.name!r} returned {type(outcome).__name__}, not a ToolOutcome"
        return _failed(call, text)
    if not isinstance(outcome.observation, str):
        kind = type(outcome.observation).__name__
        text = f"tool {call.name!r} returned an observation of type {kind}, not str"
        return _failed(call, text)
    return outcome


#: What an executor may return (a tuple: ``Success | Failure | Ambiguous`` would build a
#: union at every call).
_OUTCOMES: Final = (Success, Failure, Ambiguous)
_COROUTINE: Final = types.CoroutineType


def _failed(call: ValidatedCall, text: str, *, effect: bool = False) -> Failure | Ambiguous:
    """A call that failed: ambiguous when it mutates (its effect, with ``effect``, may or
    may not have happened), else a plain failure."""
    if call.effect is not Effect.MUTATING:
        return Failure(text)
    return Ambiguous(f"{text}; its effect may or may not have happened" if effect else text)


def _timed_out(decision: RunTool) -> Failure | Ambiguous:
    """A call cut by its tool's timeout."""
    text = f"tool {decision.call.name!r} timed out after {decision.timeout_s} s"
    return _failed(decision.call, text, effect=True)


class _CallTimer:
    """The one timer of a tool call, at the earlier of its timeout and the session's end.

    At the session's deadline it gives the child ``wall_clock`` (the session's wall-clock
    scope cuts the task). At the tool's timeout it gives the child ``tool_timeout`` and
    cancels the task, as ``asyncio.timeout`` would: :meth:`settle` takes that cancellation
    back once the call is over, and :attr:`timed_out` then says the call's
    ``CancelledError`` was this timeout's alone (any other cancellation propagates).
    """

    __slots__ = ("_cancelling", "_child", "_fired", "_task", "_tool_first", "timed_out")

    def __init__(
        self, task: asyncio.Task[object], cancelling: int, child: CancelToken, tool_first: bool
    ) -> None:
        self._task = task
        self._cancelling = cancelling
        self._child = child
        self._tool_first = tool_first
        self._fired = False
        self.timed_out = False

    def fire(self) -> None:
        """The timer fell due: give the child its reason; at the tool's timeout, cut."""
        if not self._tool_first:
            self._child.cancel(WALL_CLOCK)
            return
        self._child.cancel(TOOL_TIMEOUT)
        self._fired = True
        self._task.cancel()

    def settle(self) -> None:
        """The call is over: take back this timer's cancellation of the task, if it made one."""
        if self._fired:
            self._fired = False
            self.timed_out = self._task.uncancel() <= self._cancelling


@types.coroutine
def _rest(running: Coroutine[Any, Any, _T], pending: object) -> Generator[Any, Any, _T]:
    """The rest of a coroutine whose first step yielded ``pending``: awaited as ``await
    running`` would have been from there on (the task's sends and throws passed through)."""
    try:
        sent = yield pending
    except GeneratorExit:
        running.close()
        raise
    except BaseException as exc:  # noqa: BLE001 - thrown in by the task: passed on
        try:
            pending = running.throw(exc)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        return (yield from _rest(running, pending))
    if sent is None:
        return cast("_T", (yield from running))  # what the task sends: delegate from here
    try:
        pending = running.send(sent)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    return (yield from _rest(running, pending))


def _approver_failed(call: ValidatedCall, exc: BaseException) -> Denied:
    """An approver that raised: logged with its traceback, counted as a denial."""
    logger.warning(
        "the approver raised %s for call %s of tool %r; counted as denied",
        type(exc).__name__,
        call.id,
        call.name,
        exc_info=exc,
    )
    return Denied(f"the approver failed ({type(exc).__name__})")
