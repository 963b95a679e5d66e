"""The tool loop's driver: ``ToolLoop``, its run's state (``_Run``) and its ``LoopEvent``.

The driver around the pure :class:`~._loop.LoopMachine`: ask the machine, do the I/O (the
model request here; the summariser, approver and executor through :mod:`._calls`), feed the
result back, and report progress as :class:`LoopEvent` values to an optional sink. After
every await it checks the session's cancellation token first, so a late result of superseded
or cancelled work is discarded and never starts another action; right before every action
it turns the event loop once and asks the machine (:meth:`LoopMachine.check`, fed the time
and the token's reason) whether the action may still start. It also binds the run to its
:class:`~._generation.SessionGeneration`, the operator's token and the session's wall
clock. Everything runs in the caller's task: the loop creates no task of its own, so
nothing is left running when ``run`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import types
from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from metacrate_grid_agent._aio._calls import (
    TASK_CANCELLED,
    WALL_CLOCK,
    Verdict,
    ask,
    run_tool,
    summarize,
)
from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._aio._generation import SessionGeneration
from metacrate_grid_agent._aio._protocols import Approver, Summarizer, ToolExecutor, summary_caller
from metacrate_grid_agent._aio._transport import LLMClient
from metacrate_grid_agent._core._loop import (
    AskApproval,
    CallModel,
    Decision,
    Finish,
    LoopMachine,
    RunTool,
    Summarize,
)
from metacrate_grid_agent._core._results import CallRecord, LoopResult
from metacrate_grid_agent._core._retry import AttemptRecord
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent._core._tools import Denied, Tool, ValidatedCall
from metacrate_grid_agent._core._types import (
    Completion,
    Message,
    SystemMessage,
    ToolDefinition,
    UserMessage,
)
from metacrate_grid_agent._core._wire import HistoryEncoder
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import (
    CancelledByCallerError,
    GridAgentError,
    ToolDefinitionError,
)

__all__ = ["LoopEvent", "ToolLoop"]

logger = logging.getLogger("metacrate_grid_agent.loop")

#: ``sleep(0)`` calls before each action: one whole turn of the event loop (see checkpoint).
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


class ToolLoop:
    """A bounded, validated, cancellable tool loop over one :class:`LLMClient`.

    Every tool schema is validated when the loop is built (:class:`ToolDefinitionError`);
    every proposed call is validated before it reaches the executor. Tools run one at a time.
    With an ``approver``, each valid call of a tool that asks for approval (mutating, or
    ``Tool.needs_approval``) waits for its answer first; a denied call never runs.
    """

    def __init__(
        self,
        client: LLMClient,
        tools: Sequence[Tool],
        executor: ToolExecutor,
        *,
        config: ToolLoopConfig | None = None,
        summarizer: Summarizer | None = None,
        system_prompt: str | None = None,
        approver: Approver | None = None,
    ) -> None:
        self._client = client
        self._config = ToolLoopConfig() if config is None else config
        self._registry = ToolRegistry.build(tools, self._config)
        if approver is None:
            # Fail closed: a tool that must be approved is refused, not run unasked.
            unasked = [t.name for t in tools if t.needs_approval is True]
            if unasked:
                raise ToolDefinitionError(
                    f"tools {unasked} set needs_approval, but the loop was given no approver"
                )
        self._approver = approver
        self._executor = executor
        self._summarize_span = None if summarizer is None else summary_caller(summarizer)
        self._system_prompt = system_prompt

    @property
    def registry(self) -> ToolRegistry:
        """The validated tools."""
        return self._registry

    def _initial_history(self, goal: str | Sequence[Message]) -> list[Message]:
        if isinstance(goal, str):
            history: list[Message] = []
            if self._system_prompt:
                history.append(SystemMessage(content=self._system_prompt))
            history.append(UserMessage(content=goal))
            return history
        return list(goal)

    def run(
        self,
        goal: str | Sequence[Message],
        *,
        generation: SessionGeneration,
        cancel: CancelToken | None = None,
        on_event: (
            Callable[[LoopEvent], None] | Sequence[Callable[[LoopEvent], None]] | None
        ) = None,
    ) -> Coroutine[Any, Any, LoopResult]:
        """Run one session toward ``goal`` (a user message, or a whole starting history).

        ``generation`` ties the run to the avatar session: the run belongs to the generation
        that is current when ``run(...)`` is *called* (not when its coroutine first runs), so
        ``asyncio.create_task(loop.run(...))`` followed by :meth:`SessionGeneration.advance`
        gives a run that makes no request, calls no executor and returns ``superseded``.
        ``cancel`` is the operator's handle (reasons such as "shutdown", "disconnect",
        "session_expired"). Await the returned coroutine (or make it a task); its result
        names how the session ended. ``on_event`` is told of progress; an exception it
        raises is logged and ignored. If ``on_event`` also has a ``scope(kind)`` method
        (the tracing sink has), the run enters the context manager it returns around its
        steps (``"session"``), around each request that is really sent (``"request"``) and
        around each executor call (``"tool"``), in the run's own task: that is how spans
        become current. A ``scope`` that raises is logged and skipped.

        ``on_event`` may also be several sinks (``on_event=(telemetry.session(gen), writer,
        my_fn)``): each is told every event in turn and each one's ``scope`` is entered,
        the first sink's outermost; one that raises is logged and the others still run.
        """
        gen = generation.current
        number = generation._claim_run()  # noqa: SLF001 - the driver is the generation's one user
        history = self._initial_history(goal)
        sink = _one_sink(on_event, generation.session_id)
        return self._run(history, generation, gen=gen, number=number, cancel=cancel, sink=sink)

    async def _run(
        self,
        history: list[Message],
        generation: SessionGeneration,
        *,
        gen: int,
        number: int,
        cancel: CancelToken | None,
        sink: EventSink | None,
    ) -> LoopResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        run = _Run(
            machine=LoopMachine(
                config=self._config,
                registry=self._registry,
                session_id=generation.session_id,
                generation=gen,
                started_at=started,
                history=history,
                run=number,
                approval=self._approver is not None,
            ),
            token=CancelToken(),
            deadline=started + self._config.max_session_s,
            generation=generation,
            gen=gen,
            sink=sink,
            scope=_scope_of(sink),
            loop=loop,
        )
        generation._bind(gen, run.token)  # noqa: SLF001 - as above
        unlink = None if cancel is None else cancel.on_cancel(run.token.cancel)
        try:
            if run.token.cancelled:  # superseded or cancelled before it started
                decision: Decision = run.cancelled(started)
            else:
                decision = run.machine.start(started)
            if not isinstance(decision, Finish):
                with run.scoped("session"):
                    decision = await self._steps(decision, run)
        except asyncio.CancelledError:
            # Cancelled from outside (not through a token): report the end, then propagate.
            if not run.machine.finished:
                now = loop.time()
                final = run.fed(
                    lambda: run.machine.on_cancelled(
                        TASK_CANCELLED, now, superseded=False, tool_in_flight=run.tool_in_flight
                    ),
                    run.machine.turn,
                )
                assert isinstance(final, Finish)  # noqa: S101 - on_cancelled always finishes
                result = final.result
                logger.warning(
                    "session %s generation %d: its task was cancelled at turn %d; "
                    "outcome %s%s; re-raising CancelledError",
                    result.session_id,
                    result.generation,
                    result.turns,
                    result.outcome,
                    "" if result.ambiguous_call is None else ", a mutating call is ambiguous",
                )
                if run.sink is not None:
                    run.emit(LoopEvent("finish", result.turns, result=result))
            raise
        finally:
            generation._unbind(run.token)  # noqa: SLF001 - as above
            if unlink is not None:
                unlink()
        if run.sink is not None:
            run.emit(LoopEvent("finish", decision.result.turns, result=decision.result))
        return decision.result

    async def _steps(self, decision: Decision, run: _Run) -> Finish:
        """Carry out decisions until the machine finishes, under the session's token and
        wall clock.

        One wall-clock scope and one binding of the task to the token cover every step of
        the run (not one of each per step): a cut leaves whichever await it reaches, and is
        fed to the machine here.
        """
        loop = asyncio.get_running_loop()
        wall = asyncio.timeout_at(run.deadline)
        try:
            async with wall:
                with run.token.bound("tool-loop session"):
                    while not isinstance(decision, Finish):
                        decision = await self._perform(decision, run)
                    return decision
        except CancelledByCallerError:
            cut = run.cut(loop.time())
        except TimeoutError:
            if not wall.expired():
                raise
            cut = run.cut(loop.time())
        assert isinstance(cut, Finish)  # noqa: S101 - a cut always finishes
        return cut

    async def _perform(self, decision: Decision, run: _Run) -> Decision:
        """Carry out one decision; return the machine's next one.

        Right before each action the machine checks the wall clock and the token
        (:meth:`_Run.checkpoint`); after every await the token is checked first, so a late
        result is discarded.
        """
        loop = run.loop
        machine, token = run.machine, run.token
        if isinstance(decision, CallModel):
            if run.sink is not None:
                run.emit(
                    LoopEvent(
                        "request",
                        decision.turn,
                        request_id=decision.request_id,
                        messages=decision.messages,
                        tools=self._registry.definitions,
                    )
                )
            if (finish := await run.checkpoint()) is not None:
                return finish
            attempts: list[AttemptRecord] = []
            try:
                with run.scoped("request"):
                    completion = await self._client.complete(
                        decision.messages,
                        self._registry.definitions,
                        request_id=decision.request_id,
                        cancel=token,
                        attempt_log=attempts,
                        encoder=run.encoder,
                    )
            except (asyncio.CancelledError, GridAgentError) as exc:
                if run.sink is not None:
                    run.emit(run.request_failed(decision, exc, attempts))
                if not isinstance(exc, GridAgentError) or isinstance(exc, CancelledByCallerError):
                    raise
                token.raise_if_cancelled("model request")
                logger.warning("request %s failed: %s", decision.request_id, exc.kind)
                return machine.on_model_error(exc, loop.time())
            token.raise_if_cancelled("model request")
            if run.sink is not None:
                run.emit(
                    LoopEvent("reply", decision.turn, decision.request_id, completion=completion)
                )
            token.raise_if_cancelled("model request")
            return run.fed(lambda: machine.on_reply(completion, loop.time()), decision.turn)
        if isinstance(decision, Summarize):
            if (finish := await run.checkpoint()) is not None:
                return finish
            text = await summarize(
                self._summarize_span,
                decision,
                run.token,
                self._config.summarizer_timeout_s,
                run.deadline,
            )
            token.raise_if_cancelled("summary")
            if run.sink is not None:
                run.emit(LoopEvent("compaction", machine.turn))
            token.raise_if_cancelled("summary")
            return machine.on_summary(text, loop.time())
        if isinstance(decision, AskApproval):
            if (finish := await run.checkpoint()) is not None:
                return finish
            started = loop.time()
            approver = self._approver
            assert approver is not None  # noqa: S101 - AskApproval comes only with an approver
            asked = decision.request.call
            try:
                verdict, said = await ask(approver, decision, token, run.deadline)
                token.raise_if_cancelled("approval")
            except (asyncio.CancelledError, CancelledByCallerError):
                if run.sink is not None:
                    cut = LoopEvent("approval", decision.turn, call=asked, verdict="cut")
                    run.emit(dataclasses.replace(cut, wait_s=loop.time() - started))
                raise
            latency = loop.time() - started
            if run.sink is not None:
                reason = verdict.reason if isinstance(verdict, Denied) else None
                run.emit(
                    LoopEvent(
                        "approval",
                        decision.turn,
                        call=asked,
                        verdict=said,
                        reason=reason,
                        wait_s=latency,
                    )
                )
            return run.fed(
                lambda: machine.on_approval(verdict, loop.time(), latency), decision.turn
            )
        if isinstance(decision, RunTool):
            if run.sink is not None:
                run.emit(LoopEvent("tool_call", decision.turn, call=decision.call))
            if (finish := await run.checkpoint()) is not None:
                return finish
            started = loop.time()
            run.tool_in_flight = True
            with run.scoped("tool"):
                outcome = await run_tool(self._executor, decision, token, run.deadline)
            token.raise_if_cancelled("tool call")
            run.tool_in_flight = False
            latency = loop.time() - started
            return run.fed(
                lambda: machine.on_tool_result(outcome, loop.time(), latency), decision.turn
            )
        raise AssertionError(f"unexpected decision {decision!r}")  # pragma: no cover


@dataclass(slots=True)
class _Run:
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

    async def checkpoint(self) -> Finish | None:
        """Right before an action: let what is already due run, then ask the machine.

        Two ``sleep(0)`` calls make one whole turn of the event loop: a cut that fell due
        while code ran synchronously (a timer, a signal, a supersession scheduled from
        another thread while an executor blocked the loop) reaches the token first (one
        ``sleep(0)`` is not enough: the task's own wake-up is queued before the timers
        that fell due). Then the machine checks the clock and the token.

        The turn is made before every action, on any event loop: asyncio offers no public
        way to tell that nothing is due (a callback queued by ``call_soon`` from an executor
        that returned at once is invisible to the clock), and the turn costs about 17 us of
        CPU per tool turn (see BENCHMARKS.md, "The checkpoint's turn of the event loop").
        """
        for _ in range(CHECKPOINT_YIELDS):
            await _one_pass()
        now = self.loop.time()
        superseded = not self.generation.is_current(self.gen)
        if self.sink is None:
            return self.machine.check(now, self.token.reason, superseded=superseded)
        before = self.machine.call_count_recorded
        finish = self.machine.check(now, self.token.reason, superseded=superseded)
        for record in self.machine.records_since(before):
            self.emit(LoopEvent("tool_result", self.machine.turn, record=record))
        return finish

    def cancelled(self, now: float) -> Decision:
        """Feed the token's cancellation to the machine."""
        return self.machine.on_cancelled(
            self.token.reason or "cancelled",
            now,
            superseded=not self.generation.is_current(self.gen),
            tool_in_flight=self.tool_in_flight,
        )

    def cut(self, now: float) -> Decision:
        """An await was cut: by the token, or else by the session's wall clock."""
        if self.token.cancelled:
            return self.fed(lambda: self.cancelled(now), self.machine.turn)
        return self.fed(
            lambda: self.machine.on_cancelled(
                WALL_CLOCK,
                now,
                superseded=False,
                wall_clock=True,
                tool_in_flight=self.tool_in_flight,
            ),
            self.machine.turn,
        )

    def fed(self, event: Callable[[], Decision], turn: int) -> Decision:
        """Feed an event to the machine and report the call records it made."""
        if self.sink is None:
            return event()
        before = self.machine.call_count_recorded
        decision = event()
        for record in self.machine.records_since(before):
            self.emit(LoopEvent("tool_result", turn, record=record))
        return decision


@types.coroutine
def _one_pass() -> Generator[None, None, None]:
    """Give the event loop one pass, as ``asyncio.sleep(0)`` does (a bare ``yield`` is how
    it does it), without the extra coroutine frame ``sleep`` adds to every resumption."""
    yield


def _scope_of(
    sink: Callable[[LoopEvent], None] | None,
) -> Callable[[ScopeKind], contextlib.AbstractContextManager[object]] | None:
    """The sink's ``scope`` method, or None (no sink, or a sink without one)."""
    scope = None if sink is None else getattr(sink, "scope", None)
    return scope if callable(scope) else None


def _one_sink(
    on_event: EventSink | Sequence[EventSink] | None, session_id: str
) -> EventSink | None:
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
        scopes = tuple(scope for scope in map(_scope_of, sinks) if scope is not None)
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
