"""The boundary protocols: what the application implements and the tool loop awaits.

``ToolExecutor`` is the boundary to the grid; ``Approver`` lets an operator allow or refuse a
call before it runs; ``Summarizer`` compacts old history. All are :class:`typing.Protocol`\\ s
that take frozen payloads (``_core/_tools.py``) and a :class:`~metacrate_grid_agent.CancelToken`
of their own.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, cast, runtime_checkable

from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._core._tools import (
    ApprovalRequest,
    Approved,
    Denied,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent._core._types import Message

__all__ = ["Approver", "Summarizer", "SummaryCall", "ToolExecutor", "summary_caller"]


@runtime_checkable
class ToolExecutor(Protocol):
    """The boundary to the grid: runs one validated call at a time.

    ``cancel`` is this call's own token, a child of the session's: it is cancelled, with
    the reason, whenever the call is cut (``tool_timeout``, ``wall_clock``, ``superseded``,
    the operator's reason, ``task_cancelled``), before the cut reaches the executor; the
    executor should stop promptly. Cancelling it from inside stops nothing else: the call's
    outcome is still what the executor returns or raises. Raising, or overrunning the
    tool's timeout, counts as a failure for a read-only tool and as an ambiguous outcome
    for a mutating one. Do not block the event loop: a result that comes back after the
    session's deadline is discarded, and the call counts as cut mid-flight.
    """

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Run ``call`` and report its outcome."""
        ...


@runtime_checkable
class Approver(Protocol):
    """Asks an operator whether one validated call may run; the loop waits for the answer.

    Asked only for calls that passed validation, one at a time, before the executor sees
    them. ``cancel`` is this question's own token, a child of the session's: it is
    cancelled when the session is cut (``superseded``, the operator's reason,
    ``wall_clock``, ``task_cancelled``) or at ``approval_timeout_s``
    (``approval_timeout``), and the wait is then abandoned. The wait counts toward the
    session's wall clock. No answer in time, an exception or any value other than
    :class:`Approved` or :class:`Denied` counts as denied.
    """

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved | Denied:
        """The operator's answer about ``request``."""
        ...


@runtime_checkable
class Summarizer(Protocol):
    """Summarises the oldest span of a history so it can be replaced by one message.

    It must be deterministic for a given input; the loop bounds its time and output size.
    ``cancel`` is this summary's own token, a child of the session's: it is cancelled, with
    the reason, whenever the summary is cut (``summarizer_timeout`` at
    ``summarizer_timeout_s``, ``wall_clock``, ``superseded``, the operator's reason,
    ``task_cancelled``), before the cut reaches the summarizer. A summary that fails or is
    cut is replaced by a fixed truncation marker.

    Deprecated: a ``summarize(messages)`` that takes no token still works (the loop looks at
    its signature once, when it is built, and then calls it without one), but new
    summarizers should take ``cancel``.
    """

    async def summarize(self, messages: Sequence[Message], cancel: CancelToken) -> str:
        """A short summary of ``messages``."""
        ...


#: How the loop calls a summarizer: the span and the summary's own token.
SummaryCall = Callable[[Sequence[Message], CancelToken], Awaitable[str]]


def summary_caller(summarizer: Summarizer) -> SummaryCall:
    """How the loop calls ``summarizer``: with the token, or without it for the deprecated
    one-argument ``summarize(messages)``. Its signature is read once, here."""

    def with_token(messages: Sequence[Message], cancel: CancelToken) -> Awaitable[str]:
        return summarizer.summarize(messages, cancel)

    def without_token(messages: Sequence[Message], cancel: CancelToken) -> Awaitable[str]:
        legacy = cast("Callable[[Sequence[Message]], Awaitable[str]]", summarizer.summarize)
        return legacy(messages)

    try:
        inspect.signature(summarizer.summarize).bind(None, None)
    except TypeError:  # it takes no second argument: the deprecated form
        return without_token
    except (AttributeError, ValueError):  # no signature to read: the call says what is wrong
        pass
    return with_token
