"""A tool-loop run's state (:class:`Run`: its machine, token, deadline, sink and journal
recorder, the checkpoint before every action, its rare steps: a summary, an approval) and
:class:`LoopEvent`, what a run reports. The driver that uses them is :mod:`._tool_loop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, ParamSpec, cast

from metacrate_grid_agent._aio._calls import WALL_CLOCK, Verdict, ask, summarize
from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._aio._durable import Recorder
from metacrate_grid_agent._aio._generation import SessionGeneration
from metacrate_grid_agent._aio._protocols import Approver, SummaryCall
from metacrate_grid_agent._core._journal import Cut
from metacrate_grid_agent._core._loop import (
    AskApproval,
    CallModel,
    Decision,
    Finish,
    LoopMachine,
    Summarize,
)
from metacrate_grid_agent._core._request import HistoryEncoder
from metacrate_grid_agent._core._results import CallRecord, LoopResult
from metacrate_grid_agent._core._retry import AttemptRecord
from metacrate_grid_agent._core._tools import Denied, ValidatedCall
from metacrate_grid_agent._core._types import Completion, Message, ToolDefinition
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import CancelledByCallerError, GridAgentError

__all__ = [
    "CHECKPOINT_YIELDS",
    "TURN",
    "EventSink",
    "LoopEvent",
    "Run",
    "ScopeKind",
    "one_sink",
    "scope_of",
]

logger = logging.getLogger("metacrate_grid_agent.loop")
_P = ParamSpec("_P")

#: Passes of the event loop before each action: one whole turn of it (see :data:`TURN`).
CHECKPOINT_YIELDS: Final = 2
#: What a run enters when its sink offers no scope: one reusable do-nothing context manager.
_NO_SCOPE: Final = contextlib.nullcontext()

ScopeKind = Literal["session", "request", "tool"]
"""What a sink's ``scope`` is entered around: the run's steps, a request sent, a tool call."""
EventSink = Callable[["LoopEvent"], None]
"""An ``on_event`` sink: told of each :class:`LoopEvent` (and maybe with a ``scope``)."""


@dataclass(frozen=True, slots=True)
class LoopEvent:
    """Progress of a running session, for display and logs (never used for decisions).

    A ``request`` event also carries what the request sends, ``messages`` and ``tools``
    (the loop's own sequences, not copies; left out of the repr).
    An ``approval`` event comes once the question is settled: ``call`` is the call asked
    about, ``verdict`` what became of it (``approved``, ``denied``, ``timeout``, ``failed``,
    or ``cut`` when the session was cut while it waited), ``reason`` the denial's reason
    and ``wait_s`` the seconds the approver took. A ``request_failed`` event reports a
    model request that ended in ``error``, whose ``attempt_records`` keep
    every attempt it made; a request cut from outside has no ``error`` and, when the
    session's token cut it, that token's ``reason``.
    """

    kind: Literal[
        "request",
        "reply",
        "request_failed",
        "approval",
        "tool_call",
        "tool_result",
        "compaction",
        "finish",
    ]
    turn: int
    request_id: str | None = None
    completion: Completion | None = None
    call: ValidatedCall | None = None
    record: CallRecord | None = None
    result: LoopResult | None = None
    messages: Sequence[Message] = field(default=(), repr=False)
    tools: Sequence[ToolDefinition] = field(default=(), repr=False)
    verdict: Verdict | None = None
    reason: str | None = None
    wait_s: float | None = None
    error: GridAgentError | None = None
    attempt_records: tuple[AttemptRecord, ...] = ()


@dataclass(slots=True)
class Run:
    """What one ``run`` call works with: its machine, token, deadline and event sink."""

    machine: LoopMachine
    token: CancelToken
    deadline: float
    generation: SessionGeneration
    gen: int
    sink: Callable[[LoopEvent], None] | None
    """The ``on_event`` sink; None when nobody listens (no event is then built)."""
    scope: Callable[[ScopeKind], contextlib.AbstractContextManager[object]] | None = None
    """The sink's ``scope`` method, if it has one (see :meth:`ToolLoop.run`)."""
    tool_in_flight: bool = False
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    """The event loop the run runs on (read once, not at every step)."""
    encoder: HistoryEncoder = field(default_factory=HistoryEncoder)
    """The session's request encoder: each message of the history is encoded once."""
    recorder: Recorder | None = None
    """The run's journal writer, when the run is journaled."""

    def note_cut(
        self,
        reason: str,
        *,
        superseded: bool = False,
        wall_clock: bool = False,
        tool_in_flight: bool = False,
    ) -> None:
        """Keep the cut that is ending the session for the journal's finish record (the
        inputs of ``LoopMachine.on_cancelled``, so a resume re-derives the same end)."""
        if self.recorder is not None and self.recorder.cut is None:
            self.recorder.cut = Cut(
                reason=reason,
                superseded=superseded,
                wall_clock=wall_clock,
                tool_in_flight=tool_in_flight,
            )

    def scoped(self, kind: ScopeKind) -> contextlib.AbstractContextManager[object]:
        """The sink's scope for ``kind``; a do-nothing one without it or if it raised."""
        if self.scope is None:
            return _NO_SCOPE
        try:
            return self.scope(kind)
        except Exception:
            logger.warning(
                "the on_event sink's scope raised on %r in session %s; ignored",
                kind,
                self.machine.session_id,
                exc_info=True,
            )
            return _NO_SCOPE

    def emit(self, event: LoopEvent) -> None:
        """Report ``event``; a failing sink is logged with its traceback and ignored."""
        if self.sink is None:
            return
        try:
            self.sink(event)
        except Exception:
            logger.warning(
                "the on_event sink raised on a %r event of session %s; ignored",
                event.kind,
                self.machine.session_id,
                exc_info=True,
            )

    def request_failed(
        self, decision: CallModel, exc: BaseException, attempts: list[AttemptRecord]
    ) -> LoopEvent:
        """The event of a model request that failed (``exc``) or was cut (no error)."""
        error = exc if isinstance(exc, GridAgentError) else None
        return LoopEvent(
            "request_failed",
            decision.turn,
            decision.request_id,
            error=error,
            reason=self.token.reason if error is None else None,
            attempt_records=tuple(attempts),
        )

    def check(self, now: float) -> Finish | None:
        """Right before an action, after :data:`TURN`: ask the machine whether it may start
        at ``now`` (the wall clock, the token), and report the call records a cut made."""
        reason = self.token.reason
        if reason is None and self.recorder is None and self.sink is None:
            return self.machine.check(now)  # nothing to note, nothing to report
        # Superseded matters only with a reason: a run's generation is replaced only by
        # cancelling its token.
        superseded = reason is not None and not self.generation.is_current(self.gen)
        if self.recorder is not None:
            if reason is not None:
                self.note_cut(reason, superseded=superseded)
            elif now - self.machine.started_at >= self.machine.config.max_session_s:
                self.note_cut(WALL_CLOCK, wall_clock=True)
        if self.sink is None:
            return self.machine.check(now, reason, superseded=superseded)
        before = self.machine.call_count_recorded
        finish = self.machine.check(now, reason, superseded=superseded)
        for record in self.machine.records_since(before):
            self.emit(LoopEvent("tool_result", self.machine.turn, record=record))
        return finish

    def cancelled(self, now: float) -> Decision:
        """Feed the token's cancellation to the machine."""
        self.note_cut(
            self.token.reason or "cancelled",
            superseded=not self.generation.is_current(self.gen),
            tool_in_flight=self.tool_in_flight,
        )
        return self.machine.on_cancelled(
            self.token.reason or "cancelled",
            now,
            superseded=not self.generation.is_current(self.gen),
            tool_in_flight=self.tool_in_flight,
        )

    def cut(self, now: float) -> Decision:
        """An await was cut: by the token, or else by the session's wall clock."""
        if self.token.cancelled:
            return self.fed(self.machine.turn, self.cancelled, now)
        self.note_cut(WALL_CLOCK, wall_clock=True, tool_in_flight=self.tool_in_flight)
        return self.fed(
            self.machine.turn,
            self.machine.on_cancelled,
            WALL_CLOCK,
            now,
            superseded=False,
            wall_clock=True,
            tool_in_flight=self.tool_in_flight,
        )

    def fed(
        self, turn: int, event: Callable[_P, Decision], *args: _P.args, **kwargs: _P.kwargs
    ) -> Decision:
        """Feed an event to the machine (``event(*args, **kwargs)``: no closure is made per
        step) and report the call records it made."""
        if self.sink is None:
            return event(*args, **kwargs)
        before = self.machine.call_count_recorded
        decision = event(*args, **kwargs)
        for record in self.machine.records_since(before):
            self.emit(LoopEvent("tool_result", turn, record=record))
        return decision

    async def summary(
        self, decision: Summarize, summarize_span: SummaryCall | None, config: ToolLoopConfig
    ) -> Decision:
        """Carry out a summary (the history is compacted); return the machine's next decision.

        A step of the driver (:meth:`ToolLoop._steps`) in a frame of its own: it is rare.
        """
        await TURN
        loop, token = self.loop, self.token
        if (finish := self.check(loop.time())) is not None:
            return finish
        text = await summarize(
            summarize_span, decision, token, config.summarizer_timeout_s, self.deadline
        )
        token.raise_if_cancelled("summary")
        if self.sink is not None:
            self.emit(LoopEvent("compaction", self.machine.turn))
            token.raise_if_cancelled("summary")
        now = loop.time()
        if self.recorder is not None:
            await self.recorder.summary(text, now)
        return self.machine.on_summary(text, now)

    async def approval(self, decision: AskApproval, approver: Approver | None) -> Decision:
        """Ask the approver about a call; return the machine's next decision (a step of the
        driver in a frame of its own, as :meth:`summary`)."""
        await TURN
        loop, token = self.loop, self.token
        if (finish := self.check(loop.time())) is not None:
            return finish
        started = loop.time()
        assert approver is not None  # noqa: S101 - AskApproval comes only with an approver
        asked = decision.request.call
        try:
            verdict, said = await ask(approver, decision, token, self.deadline)
            token.raise_if_cancelled("approval")
        except (asyncio.CancelledError, CancelledByCallerError):
            if self.sink is not None:
                wait_s = loop.time() - started
                self.emit(
                    LoopEvent("approval", decision.turn, call=asked, verdict="cut", wait_s=wait_s)
                )
            raise
        latency = loop.time() - started
        if self.sink is not None:
            reason = verdict.reason if isinstance(verdict, Denied) else None
            self.emit(
                LoopEvent(
                    "approval",
                    decision.turn,
                    call=asked,
                    verdict=said,
                    reason=reason,
                    wait_s=latency,
                )
            )
        now = loop.time()
        if self.recorder is not None:
            await self.recorder.verdict(asked, verdict, now, latency)
        return self.fed(decision.turn, self.machine.on_approval, verdict, now, latency)


class _Turn:
    """The checkpoint's turn of the event loop, right before an action (then :meth:`Run.check`).

    Two passes (:data:`CHECKPOINT_YIELDS`, each what ``asyncio.sleep(0)`` makes: a bare
    ``yield``) make one whole turn of the event loop: a cut that fell due while code ran
    synchronously (a timer, a signal, a supersession scheduled from another thread while an
    executor blocked the loop) reaches the token first (one pass is not enough: the task's
    own wake-up is queued before the timers that fell due). ``await TURN`` makes both
    passes with no frame of its own: each ``await`` takes a new iterator over the passes'
    ``None`` values (a tuple's, in C), so a pass resumes only the driver's chain of
    coroutines (a generator per turn was one frame more in it, resumed at each pass).

    The turn is made before every action, on any event loop: asyncio offers no public
    way to tell that nothing is due (a callback queued by ``call_soon`` from an executor
    that returned at once is invisible to the clock), and the turn costs about 17 us of
    CPU per tool turn (see BENCHMARKS.md, "The checkpoint's turn of the event loop").
    """

    __slots__ = ()
    __await__ = ((None,) * CHECKPOINT_YIELDS).__iter__


#: ``await TURN``: the checkpoint's turn of the event loop (see :class:`_Turn`).
TURN: Final = cast("Awaitable[None]", _Turn())


def scope_of(
    sink: Callable[[LoopEvent], None] | None,
) -> Callable[[ScopeKind], contextlib.AbstractContextManager[object]] | None:
    """The sink's ``scope`` method, or None (no sink, or a sink without one)."""
    scope = None if sink is None else getattr(sink, "scope", None)
    return scope if callable(scope) else None


def one_sink(on_event: EventSink | Sequence[EventSink] | None, session_id: str) -> EventSink | None:
    """What the run reports to: the sink given (one sink costs nothing more), None for no
    sink (or none in a sequence), or several sinks as one :class:`_Sinks`."""
    if on_event is None or callable(on_event):
        return on_event
    sinks = tuple(on_event)
    if len(sinks) <= 1:
        return sinks[0] if sinks else None
    return _Sinks(sinks, session_id)


class _Sinks:
    """Several ``on_event`` sinks as one: each told every event in turn, each one's scope
    entered (the first outermost); a sink or scope that raises is logged and skipped, the
    others go on."""

    def __init__(self, sinks: tuple[EventSink, ...], session_id: str) -> None:
        self._sinks = sinks
        self._session_id = session_id
        scopes = tuple(scope for scope in map(scope_of, sinks) if scope is not None)
        self._scopes = scopes
        if scopes:
            self.scope = self._scope

    def __call__(self, event: LoopEvent) -> None:
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:
                logger.warning(
                    "the on_event sink raised on a %r event of session %s; ignored",
                    event.kind,
                    self._session_id,
                    exc_info=True,
                )

    @contextlib.contextmanager
    def _scope(self, kind: ScopeKind) -> Generator[None, None, None]:
        with contextlib.ExitStack() as stack:
            for scope in self._scopes:
                try:
                    entered = scope(kind)
                except Exception:
                    logger.warning(
                        "the on_event sink's scope raised on %r in session %s; ignored",
                        kind,
                        self._session_id,
                        exc_info=True,
                    )
                    continue
                stack.enter_context(entered)
            yield
