"""Operator approval of mutating calls: asked after validation, before the executor, in time.

A ``ToolLoop`` given an :class:`Approver` asks it about every valid call of a tool that
asks for approval (mutating by default, or ``Tool.needs_approval``) and waits. Approved:
the call runs. Denied, not answered within ``approval_timeout_s``, or an approver that
raises or answers nonsense: the call never reaches the executor and the model reads the
reason as the call's observation. A cut while waiting (the operator's token, a
supersession, the session's wall clock) ends the session as that cut, never as an
ambiguous mutation: nothing was started. Every test checks the executor's own log and
what the fake endpoint recorded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, cast

import msgspec
import pytest

from metacrate_grid_agent import (
    ApprovalRequest,
    Approved,
    Approver,
    CancelToken,
    Denied,
    Effect,
    Outcome,
    SessionGeneration,
    Tool,
)
from metacrate_grid_agent.errors import ToolDefinitionError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    LONG_STALL_S,
    LOOK,
    MOVE,
    SESSION,
    WAIT_S,
    RecordingExecutor,
    assistant,
    bodies,
    call,
    calls_reply,
    default_observation,
    loop_config,
    make_loop,
    run_loop,
    start_loop,
    system,
    tool,
    user,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from tests.llm_transport.conftest import ClientFactory

SHORT_S: Final = 0.2
"""An approval timeout or session bound, always set against an approver that never answers."""
MOVE_ARGS: Final = '{"x": 100, "y": 100}'
#: Turn 1 of most tests: one mutating call (asked about), then one read-only call (not).
TURN_1: Final = calls_reply(call("m-1", "move", MOVE_ARGS), call("l-2", "look"))
DONE: Final = Reply.completion("done")


@dataclass(frozen=True)
class Answer:
    """What :class:`RecordingApprover` does for one call, in this order.

    ``gate``: await it first (a gate nobody sets waits until the question is cut);
    ``swallow_cancel``: catch that wait's CancelledError and answer anyway; ``cut``: called
    synchronously just before answering; ``raises``: raise it instead of answering;
    ``verdict``: the answer (default: approved).
    """

    verdict: object = Approved()
    gate: asyncio.Event | None = None
    swallow_cancel: bool = False
    cut: Callable[[], object] | None = None
    raises: Exception | None = None


class RecordingApprover:
    """A fake approver: records every request and its token; answers from a per-call script."""

    def __init__(self, answers: Mapping[str, Answer] | None = None) -> None:
        self.answers = dict(answers or {})
        self.requests: list[ApprovalRequest] = []
        self.tokens: list[CancelToken] = []
        self.reasons_at_cut: dict[str, str | None] = {}
        self._changed = asyncio.Event()

    @property
    def asked(self) -> list[str]:
        """The call ids asked about, in order."""
        return [request.call.id for request in self.requests]

    async def wait_for_request(self, index: int = 0) -> ApprovalRequest:
        """Wait until request number ``index`` (from 0) has come in; return it."""
        async with asyncio.timeout(WAIT_S):
            while len(self.requests) <= index:
                await self._changed.wait()
        return self.requests[index]

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved | Denied:
        """Record the request, then follow its answer."""
        self.requests.append(request)
        self.tokens.append(cancel)
        self._changed.set()
        self._changed = asyncio.Event()
        answer = self.answers.get(request.call.id, Answer())
        if answer.gate is not None:
            try:
                await answer.gate.wait()
            except asyncio.CancelledError:
                self.reasons_at_cut[request.call.id] = cancel.reason
                if not answer.swallow_cancel:
                    raise
        if answer.cut is not None:
            answer.cut()
        if answer.raises is not None:
            raise answer.raises
        return cast("Approved | Denied", answer.verdict)


def statuses(calls: Any) -> list[tuple[str, str]]:
    """(call id, status) of every call record."""
    return [(record.call_id, record.status) for record in calls]


def denial(reason: str) -> str:
    """The observation the model reads for a denied call."""
    return f"not run: the operator denied this call ({reason})"


async def test_an_approved_call_runs_and_a_read_only_call_is_not_asked(
    client_factory: ClientFactory,
) -> None:
    """Approved: the mutating call runs; the read-only one runs without a question.

    Protects: the approver sees exactly the mutating call, with its tool, its effect, the
    arguments the executor will receive and the time it has, before the executor does; the
    model then reads both results as usual.
    """
    executor, approver = RecordingExecutor(), RecordingApprover()
    async with FakeEndpoint([TURN_1, DONE]) as ep:
        loop = make_loop(client_factory(ep.url), executor, approver=approver)
        run = await run_loop(loop)

    assert run.result.outcome is Outcome.COMPLETED
    assert approver.asked == ["m-1"]
    request = approver.requests[0]
    assert (request.tool, request.arguments, request.turn) == (MOVE, '{"x":100,"y":100}', 1)
    assert request.timeout_s == loop_config().approval_timeout_s
    assert (request.session_id, request.generation) == (SESSION, 0)
    assert executor.call_ids == ["m-1", "l-2"]
    assert statuses(run.result.calls) == [("m-1", "ok"), ("l-2", "ok")]
    assert run.event_kinds[:4] == ["request", "reply", "approval", "tool_call"]
    assert bodies(ep)[1]["messages"][-2:] == [
        tool("m-1", default_observation(executor.calls[0])),
        tool("l-2", default_observation(executor.calls[1])),
    ]


async def test_the_arguments_shown_are_the_bytes_the_executor_receives(
    client_factory: ClientFactory,
) -> None:
    """The request's arguments are the executor's value encoded once, not the model's text.

    Protects: an operator approves what runs. Spacing, number spelling and escapes of the
    model's text are gone; arguments longer than ``max_observation_bytes`` are not cut.
    """
    say = Tool(
        "say",
        "Say a line in local chat.",
        {"type": "object", "properties": {"text": {"type": "string"}}},
        Effect.MUTATING,
    )
    raw = '{ "text" : "' + "\\u00e9" * 300 + ' at 12:30" ,"n": 1.50E1 }'
    executor, approver = RecordingExecutor(), RecordingApprover()
    async with FakeEndpoint([calls_reply(call("s-1", "say", raw)), DONE]) as ep:
        config = loop_config(max_observation_bytes=256)
        loop = make_loop(
            client_factory(ep.url), executor, tools=(say,), approver=approver, config=config
        )
        run = await run_loop(loop)

    assert run.result.outcome is Outcome.COMPLETED
    (received,) = executor.calls
    (request,) = approver.requests
    assert request.arguments.encode("utf-8") == msgspec.json.encode(received.arguments)
    assert request.arguments == '{"text":"' + "é" * 300 + ' at 12:30","n":15.0}'


@pytest.mark.parametrize(
    ("arguments", "key"),
    [
        ('{"x": 21, "y": 20, "\\u0078": 63, "\\u0079": 63}', "x"),
        ("{" + '"x": 21, ' * 260 + '"x": 63, "y": 63}', "x"),
        ('{"x": 21, "y": 20, "y": 63}', "y"),
    ],
    ids=["escaped", "repeated_260_times", "plain"],
)
async def test_a_call_that_repeats_a_key_is_never_asked_about_nor_run(
    client_factory: ClientFactory, arguments: str, key: str
) -> None:
    """Arguments whose text can be read two ways are refused before any question.

    Protects: the operator is never shown x = 21 while the executor would get x = 63; the
    model reads which key it repeated, and the valid call of the same turn goes on.
    """
    executor, approver = RecordingExecutor(), RecordingApprover()
    turn = calls_reply(call("m-dup", "move", arguments), call("m-ok", "move", MOVE_ARGS))
    async with FakeEndpoint([turn, DONE]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor, approver=approver))

    assert approver.asked == ["m-ok"]
    assert executor.call_ids == ["m-ok"]
    assert statuses(run.result.calls) == [("m-dup", "rejected"), ("m-ok", "ok")]
    assert bodies(ep)[1]["messages"][3] == tool(
        "m-dup",
        f"the arguments for move repeat the key {key!r} within one object; each key may "
        "appear only once: send them again as one JSON object without the repeated key",
    )


async def test_a_denied_call_never_reaches_the_executor_and_the_model_reads_why(
    client_factory: ClientFactory,
) -> None:
    """Denied: the executor never sees the call; its observation is the operator's reason.

    Protects: the denial is recorded ``denied`` (not failed, not ambiguous), the session
    goes on, and the next request answers the call with the reason, paired as the API
    requires.
    """
    executor = RecordingExecutor()
    approver = RecordingApprover({"m-1": Answer(Denied("too far from spawn"))})
    async with FakeEndpoint([TURN_1, DONE]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor, approver=approver))

    assert run.result.outcome is Outcome.COMPLETED
    assert executor.call_ids == ["l-2"]
    assert statuses(run.result.calls) == [("m-1", "denied"), ("l-2", "ok")]
    assert run.result.calls[0].observation == denial("too far from spawn")
    assert len(ep.requests) == 2
    assert bodies(ep)[1]["messages"] == [
        system(bodies(ep)[0]["messages"][0]["content"]),
        user(bodies(ep)[0]["messages"][1]["content"]),
        assistant(call("m-1", "move", MOVE_ARGS), call("l-2", "look")),
        tool("m-1", denial("too far from spawn")),
        tool("l-2", default_observation(executor.calls[0])),
    ]


async def test_a_denial_reason_is_bounded_like_an_observation(
    client_factory: ClientFactory,
) -> None:
    """An operator's long reason reaches the model cut to ``max_observation_bytes``.

    Protects: the model's context grows by at most the observation bound per denial.
    """
    limit = 256
    approver = RecordingApprover({"m-1": Answer(Denied("no " * 1000))})
    executor = RecordingExecutor()
    async with FakeEndpoint([TURN_1, DONE]) as ep:
        config = loop_config(max_observation_bytes=limit)
        loop = make_loop(client_factory(ep.url), executor, approver=approver, config=config)
        run = await run_loop(loop)

    sent = bodies(ep)[1]["messages"][3]
    assert sent["tool_call_id"] == "m-1"
    assert len(sent["content"].encode("utf-8")) <= limit
    assert sent["content"].endswith(" … [truncated]")
    assert executor.call_ids == ["l-2"]
    assert run.result.outcome is Outcome.COMPLETED


async def test_no_answer_within_the_approval_timeout_counts_as_denied(
    client_factory: ClientFactory,
) -> None:
    """An approver that never answers is cut at ``approval_timeout_s``: the call is denied.

    Protects: the question's own token is cancelled ``approval_timeout`` (the session's is
    not), the executor never sees the call, and the session goes on to its summary.
    """
    executor = RecordingExecutor()
    approver = RecordingApprover({"m-1": Answer(gate=asyncio.Event())})
    async with FakeEndpoint([TURN_1, DONE]) as ep:
        config = loop_config(approval_timeout_s=SHORT_S)
        loop = make_loop(client_factory(ep.url), executor, approver=approver, config=config)
        run = await run_loop(loop)

    assert run.result.outcome is Outcome.COMPLETED
    assert approver.reasons_at_cut == {"m-1": "approval_timeout"}
    assert executor.call_ids == ["l-2"]
    assert statuses(run.result.calls) == [("m-1", "denied"), ("l-2", "ok")]
    assert bodies(ep)[1]["messages"][3] == tool("m-1", denial(f"no answer within {SHORT_S:g} s"))


async def test_a_late_answer_after_the_approval_timeout_is_still_a_denial(
    client_factory: ClientFactory,
) -> None:
    """An approver that swallows its timeout and then approves is not obeyed.

    Protects: ``approval_timeout_s`` is a hard bound; a late "yes" never runs the call.
    """
    executor = RecordingExecutor()
    approver = RecordingApprover({"m-1": Answer(gate=asyncio.Event(), swallow_cancel=True)})
    async with FakeEndpoint([TURN_1, DONE]) as ep:
        config = loop_config(approval_timeout_s=SHORT_S)
        loop = make_loop(client_factory(ep.url), executor, approver=approver, config=config)
        run = await run_loop(loop)

    assert executor.call_ids == ["l-2"]
    assert statuses(run.result.calls) == [("m-1", "denied"), ("l-2", "ok")]
    assert len(ep.requests) == 2


@pytest.mark.parametrize("cut", ["advance", "shutdown", "operator"])
async def test_a_cut_while_waiting_ends_the_session_as_that_cut_not_ambiguous(
    client_factory: ClientFactory, cut: str
) -> None:
    """Cancellation or supersession during the wait ends the session as cancelled/superseded.

    Protects: the question's token is cut with the session's reason, the call is recorded
    "not run" (nothing started, so never ambiguous), no executor call and no further
    request follow.
    """
    generation, operator = SessionGeneration(SESSION), CancelToken()
    executor = RecordingExecutor()
    approver = RecordingApprover({"m-1": Answer(gate=asyncio.Event())})
    async with FakeEndpoint([TURN_1, DONE]) as ep:
        loop = make_loop(client_factory(ep.url), executor, approver=approver)
        handle = start_loop(loop, generation=generation, cancel=operator)
        await approver.wait_for_request(0)
        if cut == "advance":
            generation.advance()
        else:
            operator.cancel(cut)
        run = await handle.finish()

    reason = "superseded" if cut == "advance" else cut
    expected = Outcome.SUPERSEDED if cut == "advance" else Outcome.CANCELLED
    assert (run.result.outcome, run.result.cancel_reason) == (expected, reason)
    assert run.result.ambiguous_call is None
    assert approver.reasons_at_cut == {"m-1": reason}
    assert executor.calls == []
    assert statuses(run.result.calls) == [("m-1", "cancelled")]
    assert run.result.calls[0].observation == f"not run ({reason})"
    assert len(ep.requests) == 1
    assert run.pending_cancels == 0


async def test_an_approval_followed_by_a_cut_never_starts_the_call(
    client_factory: ClientFactory,
) -> None:
    """A cut made while the approver answers "yes" stops the call before the executor.

    Protects: the pre-action check also stands between the approval and the run.
    """
    operator = CancelToken()
    executor = RecordingExecutor()
    approver = RecordingApprover({"m-1": Answer(cut=lambda: operator.cancel("shutdown"))})
    async with FakeEndpoint([TURN_1, DONE]) as ep:
        loop = make_loop(client_factory(ep.url), executor, approver=approver)
        run = await run_loop(loop, cancel=operator)

    assert (run.result.outcome, run.result.cancel_reason) == (Outcome.CANCELLED, "shutdown")
    assert run.result.ambiguous_call is None
    assert executor.calls == []
    assert statuses(run.result.calls) == [("m-1", "cancelled")]
    assert len(ep.requests) == 1


async def test_the_wait_counts_toward_the_session_wall_clock(
    client_factory: ClientFactory,
) -> None:
    """An operator who never answers cannot hold the session past ``max_session_s``.

    Protects: the wait is cut at the session's deadline (the question's token says
    ``wall_clock``), the outcome is ``bound_reached`` / ``wall_clock``, nothing is ambiguous,
    the executor never runs the call and no request follows.
    """
    executor = RecordingExecutor()
    approver = RecordingApprover({"m-1": Answer(gate=asyncio.Event())})
    async with FakeEndpoint([TURN_1, DONE]) as ep:
        config = loop_config(max_session_s=SHORT_S, approval_timeout_s=LONG_STALL_S)
        loop = make_loop(client_factory(ep.url), executor, approver=approver, config=config)
        run = await run_loop(loop)

    assert (run.result.outcome, run.result.bound) == (Outcome.BOUND_REACHED, "wall_clock")
    assert run.result.ambiguous_call is None
    assert run.result.latency_s >= SHORT_S
    assert approver.reasons_at_cut == {"m-1": "wall_clock"}
    assert executor.calls == []
    assert statuses(run.result.calls) == [("m-1", "cancelled")]
    assert len(ep.requests) == 1


async def test_a_call_that_fails_validation_is_never_sent_for_approval(
    client_factory: ClientFactory,
) -> None:
    """Validation first: an invalid mutating call is rejected without a question.

    Protects: the operator is never asked to approve a call that could not run; only the
    valid call of the same turn is asked about, and the rejection reaches the model.
    """
    executor, approver = RecordingExecutor(), RecordingApprover()
    turn = calls_reply(call("m-bad", "move", '{"x": "north"}'), call("m-ok", "move", MOVE_ARGS))
    async with FakeEndpoint([turn, DONE]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor, approver=approver))

    assert approver.asked == ["m-ok"]
    assert executor.call_ids == ["m-ok"]
    assert statuses(run.result.calls) == [("m-bad", "rejected"), ("m-ok", "ok")]
    sent = bodies(ep)[1]["messages"]
    assert [m.get("tool_call_id") for m in sent[-2:]] == ["m-bad", "m-ok"]


@pytest.mark.parametrize(
    "answer",
    [Answer(raises=RuntimeError("approval service down")), Answer(verdict="yes")],
    ids=["raises", "not_a_verdict"],
)
async def test_an_approver_that_raises_or_answers_nonsense_denies_and_is_logged(
    client_factory: ClientFactory, caplog: pytest.LogCaptureFixture, answer: Answer
) -> None:
    """A failing approver is a denial, logged (with its traceback when it raised).

    Protects: fail closed: a broken approval path never runs a mutating call, and never
    ends the session; the operator finds the cause in the log.
    """
    executor = RecordingExecutor()
    approver = RecordingApprover({"m-1": answer})
    with caplog.at_level(logging.WARNING, logger="metacrate_grid_agent.loop"):
        async with FakeEndpoint([TURN_1, DONE]) as ep:
            run = await run_loop(make_loop(client_factory(ep.url), executor, approver=approver))

    assert run.result.outcome is Outcome.COMPLETED
    assert executor.call_ids == ["l-2"]
    assert statuses(run.result.calls) == [("m-1", "denied"), ("l-2", "ok")]
    kind = "RuntimeError" if answer.raises is not None else "str"
    assert kind in bodies(ep)[1]["messages"][3]["content"]
    records = [r for r in caplog.records if "approver" in r.getMessage()]
    assert len(records) == 1
    if answer.raises is not None:
        assert records[0].exc_info is not None
        assert records[0].exc_info[1] is answer.raises


async def test_needs_approval_overrides_the_effect(client_factory: ClientFactory) -> None:
    """``needs_approval=True`` asks for a read-only tool; ``False`` skips a mutating one.

    Protects: the per-tool switch decides, in both directions.
    """
    tools = (replace(LOOK, needs_approval=True), replace(MOVE, needs_approval=False))
    executor, approver = RecordingExecutor(), RecordingApprover()
    async with FakeEndpoint([TURN_1, DONE]) as ep:
        loop = make_loop(client_factory(ep.url), executor, tools=tools, approver=approver)
        run = await run_loop(loop)

    assert approver.asked == ["l-2"]
    assert executor.call_ids == ["m-1", "l-2"]
    assert run.result.outcome is Outcome.COMPLETED
    assert len(ep.requests) == 2


def test_a_tool_that_needs_approval_is_refused_by_a_loop_without_an_approver(
    client_factory: ClientFactory,
) -> None:
    """Fail closed: ``needs_approval=True`` without an approver is a start-up error.

    Protects: a tool meant to be approved is never run unasked because the approver was
    forgotten.
    """
    tools = (LOOK, replace(MOVE, needs_approval=True))
    client = client_factory("http://127.0.0.1:9/v1/chat/completions")
    with pytest.raises(ToolDefinitionError, match="move"):
        make_loop(client, RecordingExecutor(), tools=tools)


def test_the_fake_approver_is_an_approver() -> None:
    """The protocol is runtime-checkable, like ``ToolExecutor``."""
    approver: Approver = RecordingApprover()
    assert isinstance(approver, Approver)


async def test_cancelling_the_task_while_waiting_reports_the_call_not_run(
    client_factory: ClientFactory,
) -> None:
    """The task running ``run`` cancelled during the wait: finish event, nothing ambiguous.

    Protects: the question's token ends ``task_cancelled``, the ``finish`` event reports
    ``cancelled`` with the call "not run", and CancelledError still propagates.
    """
    executor = RecordingExecutor()
    approver = RecordingApprover({"m-1": Answer(gate=asyncio.Event())})
    async with FakeEndpoint([TURN_1, DONE]) as ep:
        handle = start_loop(make_loop(client_factory(ep.url), executor, approver=approver))
        await approver.wait_for_request(0)
        handle.task.cancel()
        settled = await handle.settle()

    assert isinstance(settled, str)  # run() re-raised CancelledError, as documented
    finish = handle.events[-1]
    assert finish.kind == "finish"
    assert finish.result is not None
    assert (finish.result.outcome, finish.result.cancel_reason) == (
        Outcome.CANCELLED,
        "task_cancelled",
    )
    assert finish.result.ambiguous_call is None
    assert statuses(finish.result.calls) == [("m-1", "cancelled")]
    # A plain task cancellation reaches the approver first; its token says why right after.
    assert approver.tokens[0].reason == "task_cancelled"
    assert executor.calls == []
    assert len(ep.requests) == 1
