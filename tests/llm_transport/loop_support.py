"""Shared helpers for the tool-loop half of the loopback suite.

- the two standard tools: ``look`` (read-only) and ``move`` (mutating, strict schema), and
  their wire definitions as the endpoint must receive them;
- :class:`RecordingExecutor`, a fake :class:`ToolExecutor` that records every call it is
  given and follows a per-call script of :class:`Step` values (outcome, exception, gate,
  a cut made from inside it, a swallowed cancellation, a synchronous block of the event
  loop, what its token said when the cut reached it);
- :func:`start_loop` / :func:`run_loop`, which run ``ToolLoop.run`` in a task of its own
  and report how that task ended, so that a cancellation leaking past ``run`` (the caller
  would lose the result) fails the test loudly instead of cancelling the test;
- builders for scripted replies and for the expected wire messages, and checks on what the
  fake endpoint recorded.

Nothing here sleeps: every wait is on an event, with a bound that only a hang reaches.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from metacrate_grid_agent import (
    Approver,
    CancelToken,
    Effect,
    LLMClient,
    LoopEvent,
    LoopResult,
    Message,
    SessionGeneration,
    Success,
    Summarizer,
    Tool,
    ToolExecutor,
    ToolLoop,
    ToolLoopConfig,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

#: Bound on waiting for something that happens at once on loopback; only a hang reaches it.
WAIT_S: Final = 5.0
#: A server-side stall far longer than any limit a test sets (the fake ends it early when
#: the client leaves, and its own lifetime is 30 s).
LONG_STALL_S: Final = 20.0
#: The session id every test uses unless it says otherwise.
SESSION: Final = "agent-1"
#: The goal every test uses unless it says otherwise.
GOAL: Final = "walk to the fountain and tell me what you see"
#: The system prompt of :func:`make_loop` unless a test says otherwise.
SYSTEM: Final = "You drive an avatar in a virtual region. Use the tools; never guess."

LOOK_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {"radius": {"type": "number", "minimum": 0, "maximum": 100}},
    "additionalProperties": False,
}
MOVE_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "x": {"type": "number", "minimum": 0, "maximum": 256},
        "y": {"type": "number", "minimum": 0, "maximum": 256},
        "run": {"type": "boolean"},
    },
    "required": ["x", "y"],
    "additionalProperties": False,
}

LOOK: Final = Tool(
    name="look",
    description="Describe what the avatar sees within radius metres.",
    parameters=LOOK_SCHEMA,
    effect=Effect.READ_ONLY,
)
MOVE: Final = Tool(
    name="move",
    description="Walk the avatar to the point (x, y) of the region. Changes the world.",
    parameters=MOVE_SCHEMA,
    effect=Effect.MUTATING,
)
TOOLS: Final = (LOOK, MOVE)


def tool_definition(tool: Tool) -> dict[str, Any]:
    """The wire definition of ``tool``, exactly as the request body must carry it."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": json.loads(json.dumps(dict(tool.parameters))),
        },
    }


def loop_config(**overrides: Any) -> ToolLoopConfig:
    """A tool-loop configuration: the defaults, with ``overrides``."""
    return ToolLoopConfig(**overrides)


def make_loop(
    client: LLMClient,
    executor: ToolExecutor,
    *,
    tools: Sequence[Tool] = TOOLS,
    config: ToolLoopConfig | None = None,
    summarizer: Summarizer | None = None,
    system_prompt: str | None = SYSTEM,
    approver: Approver | None = None,
) -> ToolLoop:
    """A tool loop over ``client`` with the standard tools and :data:`SYSTEM`."""
    return ToolLoop(
        client,
        tools,
        executor,
        config=config,
        summarizer=summarizer,
        system_prompt=system_prompt,
        approver=approver,
    )


# --- the fake executor ------------------------------------------------------------------------

Ending = Literal["returned", "raised", "cancelled", "swallowed"]


@dataclass(frozen=True)
class Step:
    """What :class:`RecordingExecutor` does for one call, in this order.

    ``gate``: await it first (a gate nobody sets waits until the call is cancelled).
    ``swallow_cancel``: misbehave: catch the CancelledError of that wait, then await
    ``late_gate`` (if any) and return anyway. ``cut``: called synchronously just before
    returning (to cancel the session from inside the executor). ``raises``: raise it
    instead of returning. ``outcome``: what to return (default: a Success naming the call).
    ``bogus``: return this non-ToolOutcome value instead. ``block_s``: first block the
    event loop this long with ``time.sleep`` (a synchronous SDK call), after calling
    ``schedule`` (if any) to arrange something for the loop to run once it is free.
    """

    outcome: ToolOutcome | None = None
    raises: Exception | None = None
    gate: asyncio.Event | None = None
    swallow_cancel: bool = False
    late_gate: asyncio.Event | None = None
    cut: Callable[[], object] | None = None
    bogus: object = None
    block_s: float = 0.0
    schedule: Callable[[], object] | None = None


def default_observation(call: ValidatedCall) -> str:
    """The observation of a call the script says nothing about."""
    return f"{call.name} ok: {json.dumps(dict(call.arguments), sort_keys=True)}"


class RecordingExecutor:
    """A fake executor: records each call and how it ended; follows a per-call script."""

    def __init__(self, steps: Mapping[str, Step] | None = None, default: Step = Step()) -> None:
        self.steps = dict(steps or {})
        self.default = default
        self.calls: list[ValidatedCall] = []
        """Every call received, in order."""
        self.tokens: list[CancelToken] = []
        """The cancel token passed with each call."""
        self.endings: dict[str, Ending] = {}
        """How each call ended, by call id."""
        self.reasons_at_cut: dict[str, str | None] = {}
        """The token's reason when the cancellation reached the call, by call id."""
        self._changed = asyncio.Event()

    @property
    def call_ids(self) -> list[str]:
        """The ids of the calls received, in order."""
        return [call.id for call in self.calls]

    async def wait_for_call(self, index: int = 0, *, timeout_s: float = WAIT_S) -> ValidatedCall:
        """Wait until call number ``index`` (from 0) has started; return it."""
        async with asyncio.timeout(timeout_s):
            while len(self.calls) <= index:
                await self._changed.wait()
        return self.calls[index]

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Record the call, then follow its step."""
        self.calls.append(call)
        self.tokens.append(cancel)
        self._notify()
        step = self.steps.get(call.id, self.default)
        if step.schedule is not None:
            step.schedule()
        if step.block_s:
            time.sleep(step.block_s)  # noqa: ASYNC251 - on purpose: an executor that blocks
        if step.gate is not None:
            try:
                await step.gate.wait()
            except asyncio.CancelledError:
                self.reasons_at_cut[call.id] = cancel.reason
                if not step.swallow_cancel:
                    self.endings[call.id] = "cancelled"
                    raise
                self.endings[call.id] = "swallowed"
                if step.late_gate is not None:
                    await step.late_gate.wait()
        if step.cut is not None:
            step.cut()
        if step.raises is not None:
            self.endings.setdefault(call.id, "raised")
            raise step.raises
        self.endings.setdefault(call.id, "returned")
        if step.bogus is not None:
            return cast("ToolOutcome", step.bogus)
        return step.outcome or Success(default_observation(call))


# --- the fake summarizer --------------------------------------------------------------------

SummaryMode = Literal["ok", "raises", "stalls", "too_large", "escapes", "not_a_str"]


def summary_text(number: int, span: Sequence[Message]) -> str:
    """The deterministic summary :class:`FakeSummarizer` writes for its ``number``-th span."""
    roles = ", ".join(type(message).__name__ for message in span)
    return f"summary {number} of {len(span)} messages: {roles}"


class FakeSummarizer:
    """A deterministic summarizer that records each span; ``mode`` makes it fail on purpose.

    ``raises``: raise; ``stalls``: wait on an event nobody sets (until cancelled);
    ``too_large``: return ``limit + 1`` bytes; ``escapes``: return ``limit`` quote
    characters (within the byte limit, twice that once JSON-escaped); ``not_a_str``:
    return an int. ``cut_reasons`` holds what its token said each time a cut reached it.
    """

    def __init__(self, mode: SummaryMode = "ok", *, limit: int = 4096) -> None:
        self.mode = mode
        self.limit = limit
        self.spans: list[tuple[Message, ...]] = []
        self.cancelled = 0
        self.cut_reasons: list[str | None] = []
        self._never = asyncio.Event()
        self._changed = asyncio.Event()

    async def wait_for_span(self, index: int = 0, *, timeout_s: float = WAIT_S) -> None:
        """Wait until span number ``index`` (from 0) has been handed over."""
        async with asyncio.timeout(timeout_s):
            while len(self.spans) <= index:
                await self._changed.wait()

    async def summarize(self, messages: Sequence[Message], cancel: CancelToken) -> str:
        """Record the span; answer according to the mode."""
        self.spans.append(tuple(messages))
        self._changed.set()
        self._changed = asyncio.Event()
        if self.mode == "raises":
            raise RuntimeError("summarizer exploded")
        if self.mode == "stalls":
            try:
                await self._never.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                self.cut_reasons.append(cancel.reason)
                raise
        if self.mode == "too_large":
            return "y" * (self.limit + 1)
        if self.mode == "escapes":
            return '"' * self.limit
        if self.mode == "not_a_str":
            return cast("str", 42)
        return summary_text(len(self.spans), messages)


# --- running the loop -----------------------------------------------------------------------


@dataclass(frozen=True)
class LoopRun:
    """How one ``ToolLoop.run`` ended."""

    result: LoopResult
    events: tuple[LoopEvent, ...]
    pending_cancels: int
    """``cancelling()`` of the run's task right after ``run`` returned: must be 0."""

    @property
    def event_kinds(self) -> list[str]:
        """The kinds of the events emitted, in order."""
        return [event.kind for event in self.events]


@dataclass
class LoopHandle:
    """A ``ToolLoop.run`` running in a task of its own."""

    task: asyncio.Task[tuple[LoopResult, int]]
    events: list[LoopEvent]
    raised_cancelled: list[bool] = field(default_factory=list)

    async def settle(self, *, timeout_s: float = WAIT_S) -> LoopRun | str:
        """Wait for ``run`` to end; its :class:`LoopRun`, or what went wrong with the task.

        Fails at once if ``run`` hung. Returns a description (not a LoopRun) when ``run``
        raised CancelledError, or returned but left a cancellation pending on its task (the
        task then ends cancelled and the caller loses the result).
        """
        done, _ = await asyncio.wait({self.task}, timeout=timeout_s)
        if not done:
            self.task.cancel()
            await asyncio.wait({self.task})
            raise AssertionError(f"ToolLoop.run did not return within {timeout_s} s")
        if self.raised_cancelled:
            return (
                "ToolLoop.run raised CancelledError instead of returning a result "
                "(its own cancellation escaped as a bare asyncio cancellation)"
            )
        if self.task.cancelled():
            return (
                "ToolLoop.run returned, but left a cancellation request pending on its task: "
                "the task ended cancelled and the caller lost the result"
            )
        result, pending = self.task.result()
        return LoopRun(result=result, events=tuple(self.events), pending_cancels=pending)

    async def finish(self, *, timeout_s: float = WAIT_S) -> LoopRun:
        """Wait for ``run`` to return; fail loudly if it hung, raised, or lost its result."""
        settled = await self.settle(timeout_s=timeout_s)
        if isinstance(settled, LoopRun):
            return settled
        raise AssertionError(settled)


def start_loop(
    loop: ToolLoop,
    goal: str | Sequence[Message] = GOAL,
    *,
    generation: SessionGeneration | None = None,
    cancel: CancelToken | None = None,
    on_event: Callable[[LoopEvent], None] | None = None,
) -> LoopHandle:
    """Start ``loop.run(goal, ...)`` in a new task; every event is recorded on the handle."""
    events: list[LoopEvent] = []
    gen = SessionGeneration(SESSION) if generation is None else generation

    def record(event: LoopEvent) -> None:
        events.append(event)
        if on_event is not None:
            on_event(event)

    flag: list[bool] = []

    async def drive() -> tuple[LoopResult, int]:
        try:
            result = await loop.run(goal, generation=gen, cancel=cancel, on_event=record)
        except asyncio.CancelledError:
            flag.append(True)
            raise
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    task = asyncio.create_task(drive(), name="tool loop under test")
    return LoopHandle(task=task, events=events, raised_cancelled=flag)


async def run_loop(
    loop: ToolLoop,
    goal: str | Sequence[Message] = GOAL,
    *,
    generation: SessionGeneration | None = None,
    cancel: CancelToken | None = None,
    on_event: Callable[[LoopEvent], None] | None = None,
    timeout_s: float = WAIT_S,
) -> LoopRun:
    """Run ``loop.run`` to its end in a task of its own (see :meth:`LoopHandle.finish`)."""
    handle = start_loop(loop, goal, generation=generation, cancel=cancel, on_event=on_event)
    return await handle.finish(timeout_s=timeout_s)


# --- scripted replies -------------------------------------------------------------------------


def call(
    call_id: str, name: str, arguments: Mapping[str, Any] | str = "{}"
) -> tuple[str, str, str]:
    """A tool call for ``Reply.completion``; a mapping is sent as ``json.dumps`` text."""
    text = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    return (call_id, name, text)


def calls_reply(
    *calls: tuple[str, str, str] | Mapping[str, Any],
    text: str | None = None,
    usage: tuple[int, int] | None = None,
) -> Reply:
    """A completion that asks for ``calls``."""
    return Reply.completion(text, tool_calls=calls, usage=usage)


def always_calling(name: str = "look", arguments: str = "{}") -> Callable[[Any], Reply]:
    """A responder for a model that never stops: a fresh call id on every request."""

    def respond(request: Any) -> Reply:
        return calls_reply(call(f"call-{request.index}", name, arguments))

    return respond


# --- expected wire messages -------------------------------------------------------------------


def system(text: str) -> dict[str, Any]:
    """A system message as sent."""
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, Any]:
    """A user message as sent."""
    return {"role": "user", "content": text}


def wire_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A tool call inside an assistant message, as sent: id, type, function (nothing else)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(*calls: tuple[str, str, str], text: str | None = None) -> dict[str, Any]:
    """An assistant message as sent (``content`` is omitted when there is none)."""
    message: dict[str, Any] = {"role": "assistant"}
    if text is not None:
        message["content"] = text
    if calls:
        message["tool_calls"] = [wire_call(*c) for c in calls]
    return message


def tool(call_id: str, content: str) -> dict[str, Any]:
    """A tool message as sent."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# --- what the endpoint recorded ---------------------------------------------------------------


def bodies(ep: FakeEndpoint) -> list[dict[str, Any]]:
    """The decoded JSON body of every request the endpoint received, in order."""
    return [request.json() for request in ep.requests]


def request_ids(ep: FakeEndpoint) -> list[str | None]:
    """The ``X-Request-Id`` header of every request the endpoint received, in order."""
    return [request.header("X-Request-Id") for request in ep.requests]


def unpaired_tool_messages(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Problems with assistant/tool pairing in one request's messages (empty: all intact).

    Every tool message must sit in the run of tool messages right after an assistant
    message whose ``tool_calls`` has its id, and every such call must be answered there
    exactly once (the API rejects a request that breaks either rule).
    """
    problems: list[str] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        if message.get("role") == "tool":
            problems.append(f"message {index}: tool message not after its assistant")
            index += 1
            continue
        index += 1
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            continue
        wanted = [c["id"] for c in message["tool_calls"]]
        answered: list[str] = []
        while index < len(messages) and messages[index].get("role") == "tool":
            answered.append(messages[index]["tool_call_id"])
            index += 1
        if sorted(answered) != sorted(wanted):
            problems.append(f"assistant calls {wanted} answered by {answered}")
    return problems


def new_tasks(before: Iterable[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    """Tasks running now that were not running at ``before`` (the current task aside)."""
    known = set(before)
    current = asyncio.current_task()
    return {task for task in asyncio.all_tasks() if task not in known and task is not current}
