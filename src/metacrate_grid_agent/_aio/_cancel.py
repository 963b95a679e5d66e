"""An explicit cancellation handle: cancel a call (or a whole session) from outside.

A :class:`CancelToken` is bound to the tasks that run under it. ``cancel(reason)`` records
the reason once and cancels every bound task; the call that owns the task turns the
cancellation into :class:`~metacrate_grid_agent.errors.CancelledByCallerError` carrying the
reason. A cancellation that did not come from the token (``task.cancel()`` by someone else)
is left alone and propagates as ``asyncio.CancelledError``, as asyncio requires.

A bound task may cancel its own token (an executor or summarizer that the tool loop runs in
the session's task, cancelling the operator's token): the task is running then, so its cut
is delivered one turn of the event loop later, to the await it is suspended at, and only if
it is still bound to the token. Code that cancels and returns at once sees the reason at
its next check instead, and no cancellation is left to hit a later, unrelated await.

A token is the way to get a typed result out of a cut session: ``ToolLoop.run`` returns a
``LoopResult`` (outcome ``cancelled``, with the reason) when its ``cancel`` token fires.
Cancelling the task that runs ``ToolLoop.run`` instead still ends the session accountably,
but cannot return anything: the loop emits its ``finish`` event with a result whose outcome
is ``cancelled`` and reason ``task_cancelled`` (a mutating call in flight is marked
ambiguous), logs a WARNING record saying so, and re-raises the ``CancelledError``.

:meth:`CancelToken.child` gives the token handed to one executor call: it is cancelled
with its parent's reason, or on its own when that call alone is cut (``tool_timeout``,
``wall_clock``), and cancelling it does not cancel the parent.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from metacrate_grid_agent.errors import CancelledByCallerError

__all__ = ["CancelToken"]

#: Longest cancellation reason kept (reasons are short words such as "shutdown").
MAX_REASON_LENGTH: Final = 200
#: Most tasks and callbacks bound to one token at once (a session binds one or two).
MAX_BOUND: Final = 1024


class CancelToken:
    """A one-shot cancellation signal with a reason, bound to the tasks working under it."""

    __slots__ = (
        "__weakref__",
        "_call",
        "_callbacks",
        "_children",
        "_delivered",
        "_event",
        "_reason",
        "_tasks",
    )

    def __init__(self) -> None:
        self._reason: str | None = None
        # Made with the first child: most tokens (each executor call's) never have one.
        self._children: weakref.WeakSet[CancelToken] | None = None
        # The token of the one tool call in flight under this (a session's) token, held
        # strongly while the call runs: the tool loop's ``run_tool`` sets it and clears it
        # itself (attribute stores, no method call per tool call). One at a time: a
        # session's calls run one after another.
        self._call: CancelToken | None = None
        self._tasks: dict[asyncio.Task[object], int] = {}
        # Made when first needed: most tokens are never cut and have no callback.
        self._delivered: set[asyncio.Task[object]] | None = None
        self._callbacks: list[Callable[[str], object]] | None = None
        self._event: asyncio.Event | None = None

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """The reason given to :meth:`cancel`, or None."""
        return self._reason

    def cancel(self, reason: str = "cancelled") -> bool:
        """Cancel every bound task with ``reason``. Only the first call has an effect.

        Call it from the event loop's thread (a signal handler installed with
        ``loop.add_signal_handler`` qualifies).
        """
        if self._reason is not None:
            return False
        reason = reason.encode("utf-8", errors="replace").decode("utf-8")
        self._reason = reason[:MAX_REASON_LENGTH] or "cancelled"
        try:
            current = asyncio.current_task()
        except RuntimeError:  # no running loop: nothing can be bound and running
            current = None
        for task in list(self._tasks):
            if task is not current:
                self._deliver(task)
            else:
                # A task cancelling its own token is running, not awaiting: cancelling it
                # now could land on a later, unrelated await. Deliver on the next turn of
                # the event loop instead, to the await it is then suspended at, and only
                # if it is still bound to this token (see _deliver_later).
                task.get_loop().call_soon(self._deliver_later, task)
        children = () if self._children is None else tuple(self._children)
        call, self._call, self._children = self._call, None, None
        if call is not None:
            call.cancel(self._reason)
        for child in children:
            child.cancel(self._reason)
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback(self._reason)
        if self._event is not None:
            self._event.set()
        return True

    def child(self) -> CancelToken:
        """A new token cancelled with this one's reason when this one is cancelled.

        Cancelling the child does not cancel this token: the tool loop hands one child to
        each executor call and cancels it, with its own reason, when that call alone is cut.
        The parent holds its children weakly, so a child nobody keeps costs nothing.
        """
        token = CancelToken()
        if self._reason is not None:
            token.cancel(self._reason)
        else:
            if self._children is None:
                self._children = weakref.WeakSet()
            self._children.add(token)
        return token

    async def wait(self) -> str:
        """Wait until the token is cancelled; return the reason."""
        if self._reason is None:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
        assert self._reason is not None  # noqa: S101 - set before the event
        return self._reason

    def on_cancel(self, callback: Callable[[str], object]) -> Callable[[], None]:
        """Call ``callback(reason)`` on cancellation (at once if already cancelled).

        Returns a function that removes the callback again (a session that ends unlinks
        itself from a long-lived operator token).
        """
        if self._reason is not None:
            callback(self._reason)
            return _nothing
        if self._callbacks is None:
            self._callbacks = []
        if len(self._callbacks) >= MAX_BOUND:
            raise RuntimeError(f"more than {MAX_BOUND} callbacks bound to one CancelToken")
        self._callbacks.append(callback)

        def remove() -> None:
            if self._callbacks is not None and callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    def error(self, what: str) -> CancelledByCallerError:
        """The typed error for work cut short by this token."""
        reason = self._reason or "cancelled"
        return CancelledByCallerError(f"{what} was cancelled ({reason})", reason=reason)

    def raise_if_cancelled(self, what: str) -> None:
        """Raise the typed error if the token is already cancelled."""
        if self._reason is not None:
            raise self.error(what)

    @contextmanager
    def bound(self, what: str) -> Iterator[None]:
        """Run the block with the current task bound to the token.

        A cancellation delivered by the token leaves the block as
        :class:`CancelledByCallerError`; any other cancellation propagates unchanged.
        """
        self.raise_if_cancelled(what)
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("CancelToken.bound needs a running task")
        if len(self._tasks) >= MAX_BOUND:
            raise RuntimeError(f"more than {MAX_BOUND} tasks bound to one CancelToken")
        self._tasks[task] = self._tasks.get(task, 0) + 1
        released = False
        try:
            yield
        except asyncio.CancelledError:
            released = True
            if self._release(task) and self._undelivered(task) and task.uncancel() == 0:
                raise self.error(what) from None
            raise
        finally:
            if not released and self._release(task) and self._undelivered(task):
                # The block swallowed our cancellation (or ended before it arrived as an
                # error): balance the request so the caller's own timeouts keep working.
                task.uncancel()

    def _deliver(self, task: asyncio.Task[object]) -> None:
        """Cancel a bound task with the reason; :meth:`bound` takes the request back."""
        task.cancel(msg=f"cancelled: {self._reason}")
        if self._delivered is None:
            self._delivered = set()
        self._delivered.add(task)

    def _undelivered(self, task: asyncio.Task[object]) -> bool:
        """Forget a cut delivered to ``task``; whether there was one."""
        if self._delivered is None or task not in self._delivered:
            return False
        self._delivered.discard(task)
        return True

    def _deliver_later(self, task: asyncio.Task[object]) -> None:
        """The deferred cut of a task that cancelled its own token (see :meth:`cancel`).

        Nothing is delivered once the task has left every binding to this token (it
        returned at once and saw the reason at a check, or ended): the cut belongs to the
        bound block alone, never to what the task awaits after it.
        """
        delivered = self._delivered is not None and task in self._delivered
        if task in self._tasks and not delivered and not task.done():
            self._deliver(task)

    def _release(self, task: asyncio.Task[object]) -> bool:
        """Unbind one level of ``task``; True when this was its outermost binding."""
        depth = self._tasks.get(task, 0)
        if depth <= 1:
            self._tasks.pop(task, None)
            return depth == 1
        self._tasks[task] = depth - 1
        return False


def _nothing() -> None:
    """Nothing to undo."""
