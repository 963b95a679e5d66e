"""The boundary protocols: what the application implements and the tool loop awaits.

``ToolExecutor`` is the boundary to the grid; ``Approver`` lets an operator allow or refuse a
call before it runs; ``Summarizer`` compacts old history. All are :class:`typing.Protocol`\\ s
that take frozen payloads (``_core/_tools.py``) and, but for the summarizer, a
:class:`~metacrate_grid_agent.CancelToken`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._core._tools import (
    ApprovalRequest,
    Approved,
    Denied,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent._core._types import Message

__all__ = ["Approver", "Summarizer", "ToolExecutor"]


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
    """

    async def summarize(self, messages: Sequence[Message]) -> str:
        """A short summary of ``messages``."""
        ...
