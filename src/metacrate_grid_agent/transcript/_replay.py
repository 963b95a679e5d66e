"""Replay a recorded session's model side and report where the library now decides otherwise.

The recorded replies are served, one per request and in order, by the loopback
:class:`~metacrate_grid_agent.testing.FakeEndpoint`; the recorded observations are returned by
an executor that runs nothing. The session's header gives the tools, the configuration, the
system prompt and the goal. Everything the library decides (which calls are rejected or run,
what each observation becomes, which bound ends the session, the outcome) is decided again by
today's code, and compared with the recording: a changed validation, bound or policy shows up
as a :class:`Difference`. A cut the recording ends on (cancellation, supersession) is made
again at the same point; timing is not reproduced (a wall-clock ending is noted, not compared).

Public through :mod:`metacrate_grid_agent.transcript`.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from metacrate_grid_agent import (
    Ambiguous,
    ApprovalRequest,
    Approved,
    CancelToken,
    Denied,
    Failure,
    LLMClient,
    LLMConfig,
    LoopEvent,
    LoopResult,
    Message,
    Secret,
    SessionGeneration,
    Success,
    Tool,
    ToolLoop,
    ToolLoopConfig,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent._core._redact import display_safe
from metacrate_grid_agent.errors import GridAgentError, TranscriptError
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply
from metacrate_grid_agent.transcript import _schema as schema
from metacrate_grid_agent.transcript._load import Transcript, load
from metacrate_grid_agent.transcript._writer import REPLY_SETTINGS, TranscriptWriter

__all__ = ["Difference", "ReplayReport", "replay"]

#: The replay client's key: the fake endpoint checks nothing.
_REPLAY_KEY: Final = "replay-no-key"
#: Extra lifetime of the replay's fake endpoint beyond the session's wall-clock bound.
_ENDPOINT_MARGIN_S: Final = 30.0
#: Longest excerpt of a text quoted in a difference.
_EXCERPT: Final = 120
#: Most differences reported (the first ones explain the rest).
MAX_DIFFERENCES: Final = 50
#: Longest reason quoted when a recorded value cannot be used (it may quote the file).
MAX_REASON_CHARS: Final = 200
_CUT_OUTCOMES: Final = frozenset({"cancelled", "superseded"})
#: The reason the replay cuts a recording that has no finish record with.
_KILLED: Final = "recording_ends"


@dataclass(frozen=True, slots=True)
class Difference:
    """One decision the library makes differently from the recording."""

    where: str
    recorded: str
    replayed: str

    def __str__(self) -> str:
        return f"{self.where}: recorded {self.recorded}, now {self.replayed}"


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a replay found: ``differences`` (empty: same decisions), ``notes``, the result."""

    differences: tuple[Difference, ...]
    notes: tuple[str, ...]
    result: LoopResult | None
    """The replayed session's result; None when today's library refused the tools."""
    replayed: Transcript

    @property
    def same(self) -> bool:
        """Whether every compared decision is the recorded one."""
        return not self.differences

    def lines(self) -> list[str]:
        """A readable report, each line escaped (:func:`display_safe`)."""
        if self.result is None:
            lines = ["not replayed: the recorded tools are refused"]
        else:
            outcome = self.result.outcome.value
            lines = [f"replayed {self.result.turns} request(s); outcome {outcome}"]
        lines += [f"note: {n}" for n in self.notes]
        if self.same:
            lines.append("no difference: the library decides as it did in the recording")
        else:
            lines.append(f"{len(self.differences)} difference(s):")
            lines += [f"  {d}" for d in self.differences]
        return [display_safe(line) for line in lines]


def _excerpt(value: object) -> str:
    text = "none" if value is None else str(value)
    text = " ".join(text.split())
    return repr(text if len(text) <= _EXCERPT else text[: _EXCERPT - 1] + "…")


def _tools(header: schema.Session) -> list[Tool]:
    return [
        Tool(
            name=t.name,
            description=t.description,
            parameters=t.parameters,
            effect=t.effect,
            timeout_s=t.timeout_s,
        )
        for t in header.tools or ()
    ]


def _reply(record: schema.Reply) -> Reply:
    usage = None
    if record.usage is not None:
        counts = msgspec.structs.asdict(record.usage)
        usage = {k: v for k, v in counts.items() if v is not None} or None
    calls = [(c.id, c.name, c.arguments) for c in record.tool_calls]
    return Reply.completion(
        record.text,
        tool_calls=calls,
        usage=usage,
        finish_reason=record.finish_reason or ("tool_calls" if calls else "stop"),
    )


def _outcome(record: schema.ToolResult | schema.Unreported) -> ToolOutcome | None:
    status, observation = record.status, record.observation
    if status == "ok":
        return Success(observation)
    if status == "failed":
        return Failure(observation)
    if status == "ambiguous" and not observation.startswith("cut mid-flight"):
        return Ambiguous(observation)
    return None


#: How the loop records a call that a cut caught while the executor ran it.
_CUT_MID_CALL: Final = ("cut mid-flight (", "cut (")


def _in_flight(events: Sequence[schema.Event]) -> str | None:
    """The id of the call the recording was cut in, if it was cut while a call ran.

    The loop reports such a call's record (ambiguous or cancelled, "cut ...") right before
    it finishes, so the recording ends with the call, or with the call and that record.
    """
    if not events:
        return None
    last = events[-1]
    if isinstance(last, schema.ToolCall):
        return last.id
    before = events[-2] if len(events) >= 2 else None
    if (
        isinstance(last, schema.ToolResult)
        and isinstance(before, schema.ToolCall)
        and before.id == last.id
        and last.observation.startswith(_CUT_MID_CALL)
    ):
        return last.id
    return None


@dataclass(slots=True)
class _Cut:
    """Where and how the recording was cut from outside, to cut the replay alike."""

    outcome: str | None
    reason: str
    after_events: int
    in_flight_call: str | None
    generation: SessionGeneration
    token: CancelToken
    done: bool = False

    def apply(self) -> None:
        if self.done or self.outcome is None:
            return
        self.done = True
        if self.outcome == "superseded":
            self.generation.advance()
        else:
            self.token.cancel(self.reason)


class _RecordedExecutor:
    """Returns the recorded observation of each call; runs nothing."""

    def __init__(self, results: Mapping[str, _Decided], cut: _Cut) -> None:
        self._results = results
        self._cut = cut
        self.unrecorded: list[str] = []

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        if call.id == self._cut.in_flight_call:
            # Cut from outside, while this call awaits: the loop cancels the wait.
            asyncio.get_running_loop().call_soon(self._cut.apply)
            await asyncio.Event().wait()
        record = self._results.get(call.id)
        outcome = None if record is None else _outcome(record)
        if outcome is None:
            self.unrecorded.append(call.id)
            return Failure("replay: the recording has no observation for this call")
        return outcome


#: How the loop words a denial's observation; the reason sits between the brackets.
_DENIED: Final = "not run: the operator denied this call ("


class _RecordedApprover:
    """Answers each question as the recording says the operator (or the clock) did.

    A recorded verdict is answered again (a timeout or a failed approver as the denial it
    became, with its reason); a transcript written before verdicts were kept answers from
    the call's recorded status. A question cut while it waited is cut again.
    """

    def __init__(
        self,
        approvals: Mapping[str, schema.Approval],
        results: Mapping[str, _Decided],
        cut: _Cut,
    ) -> None:
        self._approvals = approvals
        self._results = results
        self._cut = cut

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved | Denied:
        call_id = request.call.id
        record = self._approvals.get(call_id)
        if record is not None and record.verdict is not None:
            if record.verdict == "cut":
                asyncio.get_running_loop().call_soon(self._cut.apply)
                await asyncio.Event().wait()
            if record.verdict == "approved":
                return Approved()
            return Denied(record.reason or "no reason given")
        result = self._results.get(call_id)
        if result is None or result.status != "denied":
            return Approved() if result is not None else Denied("replay: no recorded answer")
        reason = result.observation.removeprefix(_DENIED)
        return Denied(reason[:-1] if reason.endswith(")") else reason)


#: What the recording says of one call: its result, or how the finish reported it.
_Decided = schema.ToolResult | schema.Unreported


def _decisions(
    records: Sequence[schema.Event],
) -> tuple[int, dict[str, _Decided], schema.Finish | None]:
    requests = sum(isinstance(r, schema.Request) for r in records)
    calls: dict[str, _Decided] = {r.id: r for r in records if isinstance(r, schema.ToolResult)}
    finishes = [r for r in records if isinstance(r, schema.Finish)]
    finish = finishes[-1] if finishes else None
    for record in () if finish is None else finish.unreported_calls:
        calls.setdefault(record.id, record)
    return requests, calls, finish


def _ending(finish: schema.Finish | None) -> dict[str, str | None]:
    if finish is None:
        return dict.fromkeys(("outcome", "bound", "cancel_reason", "error"))
    return {
        "outcome": finish.outcome or None,
        "bound": finish.bound,
        "cancel_reason": finish.cancel_reason,
        "error": None if finish.error is None else finish.error.kind,
    }


def _compare(
    recorded: Sequence[schema.Event], replayed: Sequence[schema.Event], *, compare_ending: bool
) -> list[Difference]:
    differences: list[Difference] = []
    old_requests, old_calls, old_finish = _decisions(recorded)
    new_requests, new_calls, new_finish = _decisions(replayed)
    for call_id in [*old_calls, *(c for c in new_calls if c not in old_calls)]:
        old, new = old_calls.get(call_id), new_calls.get(call_id)
        some = old or new
        assert some is not None  # noqa: S101 - the id comes from one of the two
        turn = some.turn if isinstance(some, schema.ToolResult) else "?"
        where = f"turn {turn} call {call_id} ({some.name})"
        if old is None or new is None:
            differences.append(
                Difference(
                    where,
                    "not reached" if old is None else old.status,
                    "not reached" if new is None else new.status,
                )
            )
        elif old.status != new.status:
            differences.append(Difference(where, old.status, new.status))
        elif old.observation != new.observation:
            differences.append(
                Difference(
                    where + " observation", _excerpt(old.observation), _excerpt(new.observation)
                )
            )
    if old_requests != new_requests:
        differences.append(Difference("model requests", str(old_requests), str(new_requests)))
    if compare_ending:
        old_ending, new_ending = _ending(old_finish), _ending(new_finish)
        for name, old_value in old_ending.items():
            if old_value != new_ending[name]:
                differences.append(
                    Difference(f"session {name}", str(old_value), str(new_ending[name]))
                )
    return differences[:MAX_DIFFERENCES]


async def replay(
    source: Transcript | str | Path | Iterable[str],
    *,
    config: ToolLoopConfig | None = None,
    tools: Sequence[Tool] | None = None,
    llm_settings: Mapping[str, Any] | None = None,
) -> ReplayReport:
    """Re-run the recorded session's model side; report where the decisions now differ.

    ``config`` (default: the recorded one), ``tools`` (default: the recorded ones) and
    ``llm_settings`` (the client's reply-reading settings, such as ``max_tool_calls`` or
    ``max_argument_bytes``; default: the recorded ones) let a test try a change.
    Loopback only; nothing is executed.
    """
    transcript = source if isinstance(source, Transcript) else load(source)
    header, records = schema.parse_all(transcript.header, transcript.records)
    if header.tools is None or header.config is None:
        raise TranscriptError("the transcript's header has no tools and config to replay with")
    try:
        loop_config = config or ToolLoopConfig.from_mapping(header.config)
    except Exception as exc:  # noqa: BLE001 - any unreadable configuration is reported alike
        raise _unusable("the recorded configuration is unreadable", exc) from None
    tool_list = list(tools) if tools is not None else _tools(header)
    recorded_llm = {} if header.llm is None else msgspec.structs.asdict(header.llm)
    client_settings: dict[str, Any] = {
        k: v for k, v in recorded_llm.items() if k in REPLY_SETTINGS and v is not None
    }
    client_settings.update(llm_settings or {})
    try:
        LLMConfig(endpoint_url="http://127.0.0.1/", api_key=Secret(_REPLAY_KEY), **client_settings)
    except (GridAgentError, TypeError) as exc:
        raise _unusable("the client settings cannot be used", exc) from None
    try:
        generation = SessionGeneration(header.session_id or "replay", start=header.generation)
    except GridAgentError as exc:
        raise _unusable("the recorded session id cannot be used", exc) from None
    goal: str | list[Message] = (
        header.goal if header.goal is not None else _initial_messages(header)
    )
    recorded_replies = [r for r in records if isinstance(r, schema.Reply)]
    replies = [_reply(r) for r in recorded_replies]
    _, recorded_calls, finish = _decisions(records)
    notes: list[str] = list(transcript.notes)
    if any(c.arguments_cut for r in recorded_replies for c in r.tool_calls):
        notes.append("some recorded arguments were cut to the transcript's bound")
    if any(r.oversized or r.redacted for r in records):
        notes.append(
            "some records were oversized or withheld, so kept no text or list; "
            "replay serves them so"
        )
    if any(isinstance(r, schema.Compaction) for r in records):
        notes.append("the recording compacted its history; replay uses the truncation marker")
    error = None if finish is None else finish.error
    status = None if error is None else error.status

    def respond(request: RecordedRequest) -> Reply:
        if request.index < len(replies):
            return replies[request.index]
        if request.index == len(replies) and status is not None and 400 <= status <= 599:
            return Reply.error(status, "replayed error status")
        return Reply.error(599, "replay: the recording has no reply for this request")

    events = [r for r in records if not isinstance(r, schema.Finish)]
    outcome = None if finish is None else finish.outcome
    wall_clock = finish is not None and finish.bound == "wall_clock"
    if wall_clock:
        notes.append("the recording ended on its wall clock; replay cuts it at the same point")
    if error is not None and status is None:
        notes.append(f"the recorded request failed with {error.kind}; replayed as HTTP 599")
    killed = finish is None  # the recording stops where the process did: cut it there
    cut_as = outcome if outcome in _CUT_OUTCOMES else ("cancelled" if wall_clock else None)
    if killed:
        cut_as = "cancelled"
    in_flight = _in_flight(events) if cut_as is not None else None
    token = CancelToken()
    cut = _Cut(
        outcome=cut_as,
        reason=(finish.cancel_reason if finish is not None else None)
        or (_KILLED if killed else "wall_clock"),
        after_events=len(events) if in_flight is None else -1,
        in_flight_call=in_flight,
        generation=generation,
        token=token,
    )
    executor = _RecordedExecutor(recorded_calls, cut)
    approvals = {r.id: r for r in records if isinstance(r, schema.Approval)}
    asked = bool(approvals) or any(t.needs_approval is True for t in tool_list)
    approver = _RecordedApprover(approvals, recorded_calls, cut) if asked else None
    buffer = io.StringIO()
    writer = TranscriptWriter(buffer)
    writer.begin(
        session_id=generation.session_id,
        generation=generation.current,
        goal=header.goal or "",
        tools=tool_list,
        config=loop_config,
        system_prompt=header.system_prompt,
    )
    seen = 0

    def on_event(event: LoopEvent) -> None:
        nonlocal seen
        writer(event)
        if event.kind != "finish":
            seen += 1
            if seen == cut.after_events:
                cut.apply()

    async with FakeEndpoint(
        responder=respond, lifetime_s=loop_config.max_session_s + _ENDPOINT_MARGIN_S, strict=False
    ) as endpoint:
        llm = LLMConfig(
            endpoint_url=endpoint.url,
            api_key=Secret(_REPLAY_KEY),
            max_retries=0,
            **client_settings,
        )
        async with LLMClient(llm, correlation_id=generation.session_id) as client:
            try:
                loop = ToolLoop(
                    client,
                    tool_list,
                    executor,
                    config=loop_config,
                    system_prompt=header.system_prompt,
                    approver=approver,
                )
            except GridAgentError as exc:  # a changed tool validation: the first difference
                refused = Difference("tools", "accepted", f"refused ({exc.kind})")
                return ReplayReport(
                    (refused,), tuple(notes), None, Transcript(transcript.header, ())
                )
            try:
                result = await loop.run(
                    goal, generation=generation, cancel=token, on_event=on_event
                )
            except GridAgentError as exc:  # the recorded goal or messages are refused today
                raise _unusable("the recorded goal cannot be used", exc) from None
    replayed = load(buffer.getvalue().splitlines())
    _, replayed_records = schema.parse_all(replayed.header, replayed.records)
    if killed:  # compare what is there: the replay's events up to where the recording stops
        replayed_records = replayed_records[: len(events)]
    differences = _compare(records, replayed_records, compare_ending=not (wall_clock or killed))
    return ReplayReport(tuple(differences), tuple(notes), result, replayed)


def _unusable(what: str, exc: BaseException) -> TranscriptError:
    """``what`` failed on a recorded value: the reason, short and escaped."""
    return TranscriptError(f"{what} ({schema.excerpt(exc, MAX_REASON_CHARS, quote=False)})")


def _initial_messages(header: schema.Session) -> list[Message]:
    messages = header.initial_messages
    if not messages:
        raise TranscriptError("the header has neither a goal nor initial messages")
    try:
        return [msgspec.convert(m, Message) for m in messages]
    except (msgspec.ValidationError, GridAgentError, ValueError, TypeError) as exc:
        raise _unusable("the recorded initial messages are unreadable", exc) from None
