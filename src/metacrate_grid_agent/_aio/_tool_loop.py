"""The tool loop's driver: ``ToolLoop``, its run's state (``Run``) and its ``LoopEvent``.

The driver around the pure :class:`~._loop.LoopMachine`: ask the machine, do the I/O (the
model request here; the summariser, approver and executor through :mod:`._calls`), feed the
result back, and report progress as :class:`LoopEvent` values to an optional sink. After
every await it checks the session's cancellation token first, so a late result of superseded
or cancelled work is discarded and never starts another action; right before every action
it turns the event loop once and asks the machine (:meth:`LoopMachine.check`, fed the time
and the token's reason) whether the action may still start. It also binds the run to its
:class:`~._generation.SessionGeneration`, the operator's token and the session's wall
clock. Everything runs in the caller's task: the loop creates no task of its own, so
nothing is left running when ``run`` returns (``resume_pending`` resumes its runs in a task
group it awaits: none outlives the call).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from metacrate_grid_agent._aio._calls import (
    TASK_CANCELLED,
    run_tool,
)
from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._aio._durable import (
    JOURNAL_FAILED,
    SUPERSEDED,
    Recorder,
    header_of,
    prepare_resume,
)
from metacrate_grid_agent._aio._generation import SessionGeneration
from metacrate_grid_agent._aio._journal import Journal
from metacrate_grid_agent._aio._protocols import Approver, Summarizer, ToolExecutor, summary_caller
from metacrate_grid_agent._aio._recover import (
    RESUME_CONCURRENCY,
    check_concurrency,
    pending_of,
    resume_each,
    session_of,
)
from metacrate_grid_agent._aio._transport import LLMClient
from metacrate_grid_agent._core._journal import ToolPrint, parse_run_id, tool_prints
from metacrate_grid_agent._core._loop import (
    AskApproval,
    CallModel,
    Decision,
    Finish,
    LoopMachine,
    RunTool,
    Summarize,
)
from metacrate_grid_agent._core._results import LoopResult
from metacrate_grid_agent._core._retry import AttemptRecord
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent._core._tools import Tool
from metacrate_grid_agent._core._types import (
    Message,
    SystemMessage,
    UserMessage,
)
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import (
    CancelledByCallerError,
    GridAgentError,
    JournalError,
    JournalFencedError,
    ToolDefinitionError,
)

__all__ = ["LoopEvent", "ToolLoop"]

from metacrate_grid_agent._aio._run import TURN, LoopEvent, Run, one_sink, scope_of

logger = logging.getLogger("metacrate_grid_agent.loop")


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
        self._tools = tuple(tools)
        self._prints: tuple[ToolPrint, ...] | None = None

    def _tool_prints(self) -> tuple[ToolPrint, ...]:
        """The tools' fingerprints for a journal's header (computed once, when first used)."""
        if self._prints is None:
            self._prints = tool_prints(self._tools)
        return self._prints

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
        journal: Journal | None = None,
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

        ``journal`` makes the session durable (see :meth:`resume`): the run's journal,
        ``<session_id>-g<generation>-r<run>``, is created in it before anything is sent
        (:class:`~metacrate_grid_agent.errors.JournalError` if that run id already has
        one), every input of the loop is written before it is acted on, and a mutating
        call's intent is durable before the executor is called; if it cannot be written the
        call does not run and the session ends ``cancelled`` (reason ``journal_failed``).
        """
        gen = generation.current
        number = generation._claim_run()  # noqa: SLF001 - the driver is the generation's one user
        history = self._initial_history(goal)
        sink = one_sink(on_event, generation.session_id)
        start = functools.partial(
            self._start, history, generation, gen=gen, number=number, sink=sink, journal=journal
        )
        return self._drive(start, cancel)

    def resume(
        self,
        journal: Journal,
        run_id: str,
        *,
        generation: SessionGeneration | None = None,
        cancel: CancelToken | None = None,
        on_event: (
            Callable[[LoopEvent], None] | Sequence[Callable[[LoopEvent], None]] | None
        ) = None,
    ) -> Coroutine[Any, Any, LoopResult]:
        """Resume the journaled run ``run_id`` (``<session_id>-g<generation>-r<run>``).

        The run's journal is claimed exclusively
        (:class:`~metacrate_grid_agent.errors.JournalLockedError` if another process holds
        it) and checked against this loop: the same tools, schemas, loop configuration and
        approval, or :class:`~metacrate_grid_agent.errors.JournalDivergenceError` naming
        the difference. Its inputs are replayed into a new state machine, each decision
        checked against the journal, and the session goes on from where it stopped: a
        request without its reply is sent again with the same request id, a read-only call
        without its result runs again, an approval not answered is asked again; **a mutating
        call without its result is never run again**: it ends the session
        ``ambiguous_mutation``. A finished run returns its result without acting. A run
        whose generation is older than ``generation.current`` (or than the newest the
        journal has seen for the session) ends ``superseded`` without acting; one past its
        ``max_session_s`` (which counts the time the process was down) ends
        ``bound_reached``. Nothing is done before every check has passed.

        ``generation`` is the avatar session's counter (by default a new one at the run's
        generation); ``cancel`` and ``on_event`` are as for :meth:`run`.
        """
        sink = one_sink(on_event, run_id)
        prepare = functools.partial(self._prepare, journal, run_id, generation, sink)
        return self._drive(prepare, cancel)

    async def resume_pending(
        self,
        journal: Journal,
        *,
        session_id: str | None = None,
        concurrency: int = int(RESUME_CONCURRENCY.default),
        cancel: CancelToken | None = None,
        on_event: (
            Callable[[LoopEvent], None] | Sequence[Callable[[LoopEvent], None]] | None
        ) = None,
        on_resume: (
            Callable[[str, SessionGeneration], Sequence[Callable[[LoopEvent], None]]] | None
        ) = None,
        on_result: Callable[[str, LoopResult | JournalError], None] | None = None,
    ) -> dict[str, LoopResult | JournalError]:
        """Resume every unfinished run of ``journal`` (or of ``session_id``), as after a crash.

        Each run listed by :meth:`Journal.pending` (only those of ``session_id``, or the run
        of that id, when given) is resumed as by :meth:`resume`, at most ``concurrency`` at
        once (default 64, at most 4096, and within the process's file descriptors: a run
        being resumed holds 4; :class:`~metacrate_grid_agent.errors.ConfigError` otherwise):
        the first run acts as soon as its own journal is read. Each run gets its own
        :class:`SessionGeneration` at its journal's generation; ``on_resume(run_id,
        generation)``, if given, is called right before a run is claimed and returns more
        sinks for that run's events (beside ``on_event``, which every run shares);
        ``on_result(run_id, result)`` is told of each run as it ends. Once ``cancel`` is
        cancelled the running runs end ``cancelled`` and no other starts.

        Returns each run's :class:`LoopResult`, or the
        :class:`~metacrate_grid_agent.errors.JournalError` that kept it from resuming
        (:class:`~metacrate_grid_agent.errors.JournalLockedError`: another process holds
        it, and nothing was done; a divergence; a damaged journal), by run id in the order
        listed; a run not started because of ``cancel`` is absent. Any other error ends
        the other runs and is raised.
        """
        limit = check_concurrency(concurrency)
        run_ids = await pending_of(journal, session_id)
        shared = () if on_event is None else (on_event,) if callable(on_event) else on_event

        def resume_one(run_id: str) -> Coroutine[Any, Any, LoopResult]:
            parsed = parse_run_id(run_id)
            generation = SessionGeneration(
                session_of(run_id), start=0 if parsed is None else parsed[1]
            )
            sinks = [*shared, *(() if on_resume is None else on_resume(run_id, generation))]
            return self.resume(
                journal, run_id, generation=generation, cancel=cancel, on_event=sinks
            )

        return await resume_each(
            run_ids, resume_one, concurrency=limit, cancel=cancel, on_result=on_result
        )

    async def _prepare(
        self,
        journal: Journal,
        run_id: str,
        generation: SessionGeneration | None,
        sink: Callable[[LoopEvent], None] | None,
    ) -> tuple[Run, Decision] | LoopResult:
        """A resumed run's state and next decision, once its journal is checked (see
        :meth:`resume`); or the result of a run its journal says is finished."""
        prepared = await prepare_resume(
            journal,
            run_id,
            config=self._config,
            registry=self._registry,
            prints=self._tool_prints(),
            approval=self._approver is not None,
            current_generation=None if generation is None else generation.current,
        )
        recorder, header = prepared.recorder, prepared.header
        if prepared.finished:
            assert isinstance(prepared.decision, Finish)  # noqa: S101 - a journaled finish
            return prepared.decision.result
        if generation is None:
            generation = SessionGeneration(header.session_id, start=header.generation)
        machine = recorder.machine
        loop = asyncio.get_running_loop()
        run = Run(
            machine=machine,
            token=CancelToken(),
            deadline=machine.started_at + self._config.max_session_s,
            generation=generation,
            gen=header.generation,
            sink=sink,
            scope=scope_of(sink),
            loop=loop,
            recorder=recorder,
        )
        return run, prepared.decision

    async def _start(
        self,
        history: list[Message],
        generation: SessionGeneration,
        *,
        gen: int,
        number: int,
        sink: Callable[[LoopEvent], None] | None,
        journal: Journal | None,
    ) -> tuple[Run, None]:
        """A new run's state, its clock started; its journal created when it has one."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        run = Run(
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
            scope=scope_of(sink),
            loop=loop,
        )
        if journal is not None:
            created = await journal.create(
                header_of(run.machine, self._tool_prints(), self._config)
            )
            run.recorder = Recorder(created, run.machine)
        return run, None

    async def _drive(
        self,
        start: Callable[[], Awaitable[tuple[Run, Decision | None] | LoopResult]],
        cancel: CancelToken | None,
    ) -> LoopResult:
        """Start the run (``start``: a new one or a resumed one), carry it from its decision
        (None: the start) to its end, bound to its generation and the operator's token;
        journal its finish. ``run`` and ``resume`` return this coroutine: no frame of theirs
        is in the chain each pass of the event loop resumes, nor one holding ``start``'s
        locals (the starting history, the journal's header) for the whole session.
        """
        started = await start()
        del start
        if isinstance(started, LoopResult):
            return started  # a resumed run that had already finished
        run, decision = started
        del started
        loop = run.loop
        generation, gen = run.generation, run.gen
        generation._bind(gen, run.token)  # noqa: SLF001 - the driver is the generation's one user
        unlink = None if cancel is None else cancel.on_cancel(run.token.cancel)
        try:
            if run.token.cancelled and not isinstance(decision, Finish):
                decision = run.cancelled(loop.time())  # superseded or cancelled first
            elif decision is None:
                decision = run.machine.start(loop.time())
            if not isinstance(decision, Finish):
                with run.scoped("session"):
                    decision = await self._steps(decision, run)
            if run.recorder is not None:
                await run.recorder.finish(decision, loop.time())
        except asyncio.CancelledError:
            # Cancelled from outside (not through a token): report the end, then propagate.
            if not run.machine.finished:
                now = loop.time()
                run.note_cut(TASK_CANCELLED, tool_in_flight=run.tool_in_flight)
                final = run.fed(
                    run.machine.turn,
                    run.machine.on_cancelled,
                    TASK_CANCELLED,
                    now,
                    superseded=False,
                    tool_in_flight=run.tool_in_flight,
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
                if run.recorder is not None:
                    await run.recorder.finish(final, now)
            raise
        finally:
            generation._unbind(run.token)  # noqa: SLF001 - as above
            if unlink is not None:
                unlink()
            if run.recorder is not None:
                await run.recorder.close()
        if run.sink is not None:
            run.emit(LoopEvent("finish", decision.result.turns, result=decision.result))
        return decision.result

    async def _steps(self, decision: Decision, run: Run) -> Finish:
        """Carry out decisions until the machine finishes, under the session's token and
        wall clock; feed each result back.

        One wall-clock scope and one binding of the task to the token cover every step of
        the run (not one of each per step): a cut leaves whichever await it reaches, and is
        fed to the machine here. Right before each action the event loop turns once and the
        machine checks the wall clock and the token (:data:`~._run.TURN`, then :meth:`Run.check`);
        after every await the token is checked first, so a late result is discarded. The
        request and the tool call are carried out in this frame (each pass of the event loop
        resumes every frame of the chain); a summary or an approval in one of its own.
        """
        loop = run.loop
        machine, token = run.machine, run.token
        wall = asyncio.timeout_at(run.deadline)
        try:
            async with wall:
                with run.token.bound("tool-loop session"):
                    task = asyncio.current_task()
                    assert task is not None  # noqa: S101 - bound() needs a task
                    quiet = run.recorder is None and run.sink is None  # nothing to note
                    while True:
                        if isinstance(decision, RunTool):
                            if run.sink is not None:
                                run.emit(LoopEvent("tool_call", decision.turn, call=decision.call))
                            await TURN
                            now = loop.time()
                            if token._reason is None and quiet:  # noqa: SLF001 - read, not a property call
                                finish = machine.check(now)  # Run.check's case with nothing to do
                            else:
                                finish = run.check(now)
                            if finish is not None:
                                return finish
                            if run.recorder is not None:
                                # A mutating call's intent is durable before the executor is
                                # called; if it cannot be written, this raises and the call
                                # never runs.
                                await run.recorder.call(decision.call, now)
                                now = loop.time()
                            run.tool_in_flight = True
                            executor, deadline = self._executor, run.deadline
                            if run.scope is None:
                                outcome = await run_tool(
                                    executor, decision, token, deadline, now=now, task=task
                                )
                            else:
                                with run.scoped("tool"):
                                    outcome = await run_tool(
                                        executor, decision, token, deadline, now=now, task=task
                                    )
                            if token._reason is not None:  # noqa: SLF001 - as above
                                raise token.error("tool call")
                            done = loop.time()
                            if run.recorder is not None:
                                await run.recorder.result(decision.call, outcome, done, done - now)
                            run.tool_in_flight = False
                            if run.sink is None:
                                decision = machine.on_tool_result(outcome, done, done - now)
                            else:
                                decision = run.fed(
                                    decision.turn, machine.on_tool_result, outcome, done, done - now
                                )
                        elif isinstance(decision, CallModel):
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
                            await TURN
                            now = loop.time()
                            if token._reason is None and quiet:  # noqa: SLF001 - as above
                                finish = machine.check(now)  # Run.check's case with nothing to do
                            else:
                                finish = run.check(now)
                            if finish is not None:
                                return finish
                            recorder = run.recorder
                            if recorder is not None:
                                await recorder.request(decision, now)
                            attempts: list[AttemptRecord] = []
                            try:
                                if run.scope is None:
                                    completion = await self._client.complete(
                                        decision.messages,
                                        self._registry.definitions,
                                        request_id=decision.request_id,
                                        cancel=token,
                                        attempt_log=attempts,
                                        encoder=run.encoder,
                                    )
                                else:
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
                                if not isinstance(exc, GridAgentError) or isinstance(
                                    exc, CancelledByCallerError
                                ):
                                    raise
                                token.raise_if_cancelled("model request")
                                logger.warning(
                                    "request %s failed: %s", decision.request_id, exc.kind
                                )
                                now = loop.time()
                                if recorder is not None:
                                    await recorder.model_error(exc, now)
                                decision = machine.on_model_error(exc, now)
                                continue
                            if token._reason is not None:  # noqa: SLF001 - as above
                                raise token.error("model request")
                            if run.sink is not None:
                                run.emit(
                                    LoopEvent(
                                        "reply",
                                        decision.turn,
                                        decision.request_id,
                                        completion=completion,
                                    )
                                )
                                token.raise_if_cancelled("model request")
                            now = loop.time()
                            if recorder is not None:
                                await recorder.reply(completion, now)
                            if run.sink is None:
                                decision = machine.on_reply(completion, now)
                            else:
                                decision = run.fed(decision.turn, machine.on_reply, completion, now)
                        elif isinstance(decision, Finish):
                            return decision
                        elif isinstance(decision, Summarize):
                            decision = await run.summary(
                                decision, self._summarize_span, self._config
                            )
                        else:
                            assert isinstance(decision, AskApproval)  # noqa: S101 - the last kind
                            decision = await run.approval(decision, self._approver)
        except CancelledByCallerError:
            cut = run.cut(loop.time())
        except JournalFencedError:
            # A newer generation took the session over: the call guarded never ran.
            run.note_cut(SUPERSEDED, superseded=True)
            cut = run.machine.on_cancelled(SUPERSEDED, loop.time(), superseded=True)
        except JournalError as exc:
            # Fail closed: the record was not written, so the action it guarded never ran
            # (a result not written leaves its call in flight: a mutating one is ambiguous).
            logger.warning("session %s: journal failed (%s)", run.machine.session_id, exc)
            run.note_cut(JOURNAL_FAILED, tool_in_flight=run.tool_in_flight)
            cut = run.fed(
                run.machine.turn,
                run.machine.on_cancelled,
                JOURNAL_FAILED,
                loop.time(),
                superseded=False,
                tool_in_flight=run.tool_in_flight,
            )
        except TimeoutError:
            if not wall.expired():
                raise
            cut = run.cut(loop.time())
        assert isinstance(cut, Finish)  # noqa: S101 - a cut always finishes
        return cut
