"""The tool loop's driver: ``ToolLoop.run`` and ``SessionGeneration``.

A short driver around the pure :class:`~._loop.LoopMachine`: ask the machine, do the I/O
(model request, summariser, executor), feed the result back. After every await it checks
the session's cancellation token first, so a late result of superseded or cancelled work is
discarded and never starts another action. Everything runs in the caller's task: the loop
creates no task of its own, so nothing is left running when ``run`` returns.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from metacrate_grid_agent._cancel import CancelToken
from metacrate_grid_agent._loop import (
    CallModel,
    CallRecord,
    Decision,
    Finish,
    LoopMachine,
    LoopResult,
    RunTool,
    Summarize,
)
from metacrate_grid_agent._schema import ToolRegistry
from metacrate_grid_agent._tools import (
    Ambiguous,
    Effect,
    Failure,
    Success,
    Summarizer,
    Tool,
    ToolExecutor,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent._transport import LLMClient
from metacrate_grid_agent._types import Completion, Message, SystemMessage, UserMessage
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import CancelledByCallerError, GridAgentError, InvalidMessageError

__all__ = ["LoopEvent", "SessionGeneration", "ToolLoop"]

logger = logging.getLogger("metacrate_grid_agent.loop")

#: Reason given to the tokens of a generation that a newer one replaced.
SUPERSEDED: Final = "superseded"
_SESSION_ID: Final = re.compile(r"\A[A-Za-z0-9._:-]{1,64}\Z", re.ASCII)
#: Most sessions (runs) bound to one generation at once.
MAX_RUNS_PER_GENERATION: Final = 64


class SessionGeneration:
    """The generation counter of one avatar session. It only grows.

    :meth:`advance` (avatar-session replacement) supersedes every run of older generations:
    their in-flight request or executor call is cancelled, and any late result is discarded.
    """

    __slots__ = ("_current", "_runs", "session_id")

    def __init__(self, session_id: str, *, start: int = 0) -> None:
        if not isinstance(session_id, str) or _SESSION_ID.match(session_id) is None:
            raise InvalidMessageError("session id must be 1 to 64 of letters, digits and . _ : -")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise InvalidMessageError("start generation must be a non-negative int")
        self.session_id = session_id
        self._current = start
        self._runs: dict[CancelToken, int] = {}

    @property
    def current(self) -> int:
        """The current generation."""
        return self._current

    def is_current(self, generation: int) -> bool:
        """Whether ``generation`` is still the current one."""
        return generation == self._current

    def advance(self) -> int:
        """Start a new generation, superseding (cancelling) every run of the older ones."""
        self._current += 1
        runs, self._runs = self._runs, {}
        for token, generation in runs.items():
            if generation < self._current:
                token.cancel(SUPERSEDED)
            else:  # pragma: no cover - a run is never newer than the current generation
                self._runs[token] = generation
        return self._current

    def _bind(self, generation: int, token: CancelToken) -> None:
        if generation != self._current:
            token.cancel(SUPERSEDED)
            return
        if len(self._runs) >= MAX_RUNS_PER_GENERATION:
            raise RuntimeError(f"more than {MAX_RUNS_PER_GENERATION} runs in one generation")
        self._runs[token] = generation

    def _unbind(self, token: CancelToken) -> None:
        self._runs.pop(token, None)

    def __repr__(self) -> str:
        return f"SessionGeneration({self.session_id!r}, current={self._current})"


@dataclass(frozen=True, slots=True)
class LoopEvent:
    """Progress of a running session, for display and logs (never used for decisions)."""

    kind: Literal["request", "reply", "tool_call", "tool_result", "compaction", "finish"]
    turn: int
    request_id: str | None = None
    completion: Completion | None = None
    call: ValidatedCall | None = None
    record: CallRecord | None = None
    result: LoopResult | None = None


class ToolLoop:
    """A bounded, validated, cancellable tool loop over one :class:`LLMClient`.

    Every tool schema is validated when the loop is built (:class:`ToolDefinitionError`);
    every proposed call is validated before it reaches the executor. Tools run one at a time.
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
    ) -> None:
        self._client = client
        self._config = ToolLoopConfig() if config is None else config
        self._registry = ToolRegistry.build(tools, self._config)
        self._executor = executor
        self._summarizer = summarizer
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

    async def run(
        self,
        goal: str | Sequence[Message],
        *,
        generation: SessionGeneration,
        cancel: CancelToken | None = None,
        on_event: Callable[[LoopEvent], None] | None = None,
    ) -> LoopResult:
        """Run one session toward ``goal`` (a user message, or a whole starting history).

        ``generation`` ties the run to the avatar session: :meth:`SessionGeneration.advance`
        supersedes it. ``cancel`` is the operator's handle (reasons such as "shutdown",
        "disconnect", "session_expired"). The result names how the session ended.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        gen = generation.current
        run = _Run(
            machine=LoopMachine(
                config=self._config,
                registry=self._registry,
                session_id=generation.session_id,
                generation=gen,
                started_at=started,
                history=self._initial_history(goal),
            ),
            token=CancelToken(),
            deadline=started + self._config.max_session_s,
            generation=generation,
            gen=gen,
            emit=on_event or _ignore,
        )
        generation._bind(gen, run.token)
        unlink = None if cancel is None else cancel.on_cancel(run.token.cancel)
        try:
            decision = run.machine.start(started)
            while not isinstance(decision, Finish):
                decision = await self._step(decision, run)
            run.emit(LoopEvent("finish", decision.result.turns, result=decision.result))
            return decision.result
        finally:
            generation._unbind(run.token)
            if unlink is not None:
                unlink()

    async def _step(self, decision: Decision, run: _Run) -> Decision:
        """Carry out one decision under the session's token and wall clock."""
        loop = asyncio.get_running_loop()
        if run.token.cancelled:
            return run.cancelled(loop.time())
        wall = asyncio.timeout_at(run.deadline)
        try:
            async with wall:
                with run.token.bound("tool-loop session"):
                    return await self._perform(decision, run)
        except CancelledByCallerError:
            return run.cancelled(loop.time())
        except TimeoutError:
            if not wall.expired():
                raise
            return run.machine.on_cancelled(
                "wall_clock",
                loop.time(),
                superseded=False,
                wall_clock=True,
                tool_in_flight=run.tool_in_flight,
            )

    async def _perform(self, decision: Decision, run: _Run) -> Decision:
        """Carry out one decision; return the machine's next one.

        After every await the token is checked first: a late result is discarded.
        """
        loop = asyncio.get_running_loop()
        machine, token = run.machine, run.token
        if isinstance(decision, CallModel):
            run.tell(LoopEvent("request", decision.turn, request_id=decision.request_id))
            try:
                completion = await self._client.complete(
                    decision.messages,
                    self._registry.definitions,
                    request_id=decision.request_id,
                    cancel=token,
                )
            except CancelledByCallerError:
                raise
            except GridAgentError as exc:
                token.raise_if_cancelled("model request")
                logger.warning("request %s failed: %s", decision.request_id, exc.kind)
                return machine.on_model_error(exc, loop.time())
            token.raise_if_cancelled("model request")
            run.tell(LoopEvent("reply", decision.turn, decision.request_id, completion=completion))
            return run.fed(lambda: machine.on_reply(completion, loop.time()), decision.turn)
        if isinstance(decision, Summarize):
            text = await self._summarize(decision)
            token.raise_if_cancelled("summary")
            run.tell(LoopEvent("compaction", machine.turn))
            return machine.on_summary(text, loop.time())
        if isinstance(decision, RunTool):
            run.tell(LoopEvent("tool_call", decision.turn, call=decision.call))
            started = loop.time()
            run.tool_in_flight = True
            outcome = await self._run_tool(decision, token)
            token.raise_if_cancelled("tool call")
            run.tool_in_flight = False
            latency = loop.time() - started
            return run.fed(
                lambda: machine.on_tool_result(outcome, loop.time(), latency), decision.turn
            )
        raise AssertionError(f"unexpected decision {decision!r}")  # pragma: no cover

    async def _summarize(self, decision: Summarize) -> str | None:
        if self._summarizer is None:
            return None
        try:
            async with asyncio.timeout(self._config.summarizer_timeout_s):
                text = await self._summarizer.summarize(decision.span)
        except TimeoutError:
            logger.warning("summarizer timed out; using the truncation marker")
            return None
        except Exception as exc:  # noqa: BLE001 - application code: any failure means the marker
            logger.warning(
                "summarizer failed (%s); using the truncation marker", type(exc).__name__
            )
            return None
        return text if isinstance(text, str) else None

    async def _run_tool(self, decision: RunTool, token: CancelToken) -> ToolOutcome:
        call = decision.call
        mutating = call.effect is Effect.MUTATING
        try:
            async with asyncio.timeout(decision.timeout_s):
                outcome = await self._executor.execute(call, token)
        except TimeoutError:
            text = f"tool {call.name!r} timed out after {decision.timeout_s} s"
            if mutating:
                return Ambiguous(f"{text}; its effect may or may not have happened")
            return Failure(text)
        except Exception as exc:  # noqa: BLE001 - application code: classify any failure
            text = f"tool {call.name!r} failed ({type(exc).__name__})"
            if mutating:
                return Ambiguous(f"{text}; its effect may or may not have happened")
            return Failure(text)
        if not isinstance(outcome, Success | Failure | Ambiguous):
            text = f"tool {call.name!r} returned {type(outcome).__name__}, not a ToolOutcome"
            return Ambiguous(text) if mutating else Failure(text)
        if not isinstance(outcome.observation, str):
            kind = type(outcome.observation).__name__
            text = f"tool {call.name!r} returned an observation of type {kind}, not str"
            return Ambiguous(text) if mutating else Failure(text)
        return outcome


def _ignore(event: LoopEvent) -> None:
    """The default event sink."""


@dataclass(slots=True)
class _Run:
    """What one ``run`` call works with: its machine, token, deadline and event sink."""

    machine: LoopMachine
    token: CancelToken
    deadline: float
    generation: SessionGeneration
    gen: int
    emit: Callable[[LoopEvent], None]
    tool_in_flight: bool = False

    def tell(self, event: LoopEvent) -> None:
        """Report ``event``; a sink that cancelled the session stops it right here."""
        self.emit(event)
        self.token.raise_if_cancelled("tool-loop session")

    def cancelled(self, now: float) -> Decision:
        """Feed the token's cancellation to the machine."""
        return self.machine.on_cancelled(
            self.token.reason or "cancelled",
            now,
            superseded=not self.generation.is_current(self.gen),
            tool_in_flight=self.tool_in_flight,
        )

    def fed(self, event: Callable[[], Decision], turn: int) -> Decision:
        """Feed an event to the machine and report the call records it made."""
        before = self.machine.call_count_recorded
        decision = event()
        for record in self.machine.records_since(before):
            self.emit(LoopEvent("tool_result", turn, record=record))
        return decision
