"""The journal's records: the tool loop's inputs, made durable (pure data, no I/O).

A journaled run writes one record per input it feeds :class:`~._loop.LoopMachine`, in the
order it feeds them, each carrying the session time ``t`` (seconds since the run started,
counting any downtime) it was fed with, so that :mod:`._resume` can feed the same inputs to
a new machine and get the same decisions back. The records that name an action (a request
id, a call's id, name and arguments) are checked against the decision the new machine
derives; the records are the journal's whole content, the file format and the database
rows are their JSON (msgspec, never pickle).

The records, in the order a run writes them (``commit``: written and made durable before
the run goes on; ``append``: written in order, not waited on)::

    Header       append  session id, generation, run, wall-clock anchor, loop config, tools
                         (and a hash of their schemas), approval, the starting history
    Request      append  before a request is sent: its deterministic request id
    Reply        append  before the reply is acted on: the decoded completion, usage, attempts
    ModelError   append  a request that failed for good
    Summary      append  a compaction's summary (model output) before the next request
    Verdict      append  an approver's answer, before the call it allows
    Call         append  a read-only call, before the executor is called
    Call         COMMIT  a mutating call (the intent): durable before the executor is called;
                         if the commit fails the call does not run (fail closed)
    Result       append  what the executor returned
    Finish       COMMIT  the session's end (and the cut that ended it, if one did)

One commit per mutating call and one at the finish; a commit makes every earlier record
durable too. A record lost in a crash costs a re-run (a request sent again with the same id,
a read-only call run again), never a second mutating execution: a mutating call's intent is
durable before it runs, and an intent without its result resumes as ``Ambiguous``.

Run ids: a run is named ``<session_id>-g<generation>-r<run>`` (:func:`run_id`), the
request ids' prefix; a backend keeps one journal per run id and refuses to create one twice.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec

from metacrate_grid_agent._core._results import LoopResult
from metacrate_grid_agent._core._tools import Effect, Tool
from metacrate_grid_agent._core._types import Completion, Message
from metacrate_grid_agent.config import ToolLoopConfig

__all__ = [
    "AMBIGUOUS_ON_RESUME",
    "FORMAT_VERSION",
    "Call",
    "Cut",
    "DroppedArguments",
    "Finish",
    "FinishReport",
    "Header",
    "ModelError",
    "Record",
    "Reply",
    "Request",
    "Result",
    "ShownCall",
    "Summary",
    "ToolPrint",
    "Verdict",
    "config_of",
    "decode_record",
    "encode_record",
    "is_commit",
    "parse_run_id",
    "report_of",
    "run_id",
    "tool_prints",
    "tools_hash",
]

#: The journal format's version, in every header; a reader refuses any other.
FORMAT_VERSION: Final = 1
#: The observation a mutating call gets when its intent is journaled without its result.
AMBIGUOUS_ON_RESUME: Final = "the process ended while the call ran"
_RUN_ID: Final = re.compile(
    r"\A(?P<session>[A-Za-z0-9._:-]{1,64})-g(?P<gen>\d{1,18})-r(?P<run>\d{1,18})\Z"
)


def run_id(session_id: str, generation: int, run: int) -> str:
    """The run's id, ``<session_id>-g<generation>-r<run>``: the prefix of its request ids."""
    return f"{session_id}-g{generation}-r{run}"


def parse_run_id(value: str) -> tuple[str, int, int] | None:
    """``(session_id, generation, run)`` of a run id, or None if ``value`` is not one."""
    found = _RUN_ID.match(value)
    if found is None:
        return None
    return found["session"], int(found["gen"]), int(found["run"])


class ToolPrint(msgspec.Struct, frozen=True, kw_only=True):
    """What a resumed run must find unchanged of one tool: its name, effect, approval and
    timeout, and ``schema``, the SHA-256 of its description and parameter schema (canonical
    JSON), which are kept too (for a transcript reader's replay)."""

    name: str
    effect: str
    needs_approval: bool | None
    timeout_s: float | None
    schema: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


def tool_prints(tools: Sequence[Tool]) -> tuple[ToolPrint, ...]:
    """The fingerprint of each tool, in registration order."""
    prints = []
    for tool in tools:
        body = msgspec.json.encode(
            {"description": tool.description, "parameters": tool.parameters}, order="sorted"
        )
        prints.append(
            ToolPrint(
                name=tool.name,
                effect=tool.effect.value,
                needs_approval=tool.needs_approval,
                timeout_s=tool.timeout_s,
                schema=hashlib.sha256(body).hexdigest(),
                description=tool.description,
                parameters=dict(msgspec.to_builtins(dict(tool.parameters))),
            )
        )
    return tuple(prints)


def tools_hash(prints: Sequence[ToolPrint]) -> str:
    """One hash over every tool's fingerprint, in order."""
    return hashlib.sha256(msgspec.json.encode(list(prints), order="sorted")).hexdigest()


def config_of(config: ToolLoopConfig) -> dict[str, Any]:
    """The loop configuration as the header keeps it (plain data)."""
    return dict(msgspec.to_builtins(config.to_dict()))


class _Record(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", forbid_unknown_fields=True
):
    """Every record but the header carries ``t``, the session time it was fed at."""


class Header(_Record, tag="header", frozen=True, kw_only=True):
    """The run's start: what it is, what it runs with, and where it began.

    ``anchor`` is the wall-clock time (Unix seconds) of the run's start: a resumed run's
    session time is the wall clock minus it, so ``max_session_s`` counts the downtime.
    ``history`` is the whole starting history (goal, system prompt, earlier messages).
    """

    version: int = FORMAT_VERSION
    library: str
    session_id: str
    generation: int
    run: int
    anchor: float
    config: dict[str, Any]
    tools: tuple[ToolPrint, ...]
    tools_hash: str
    approval: bool
    history: tuple[Message, ...]

    @property
    def run_id(self) -> str:
        """``<session_id>-g<generation>-r<run>``."""
        return run_id(self.session_id, self.generation, self.run)


class Request(_Record, tag="request", frozen=True, kw_only=True):
    """A model request about to be sent (written again, same id, when it is re-sent)."""

    t: float
    turn: int
    request_id: str


class DroppedArguments(msgspec.Struct, frozen=True):
    """A reply's tool call whose arguments were dropped as oversized: its index and size."""

    index: int
    argument_bytes: int


class Reply(_Record, tag="reply", frozen=True, kw_only=True):
    """The decoded reply to the last request, before the loop acts on it."""

    t: float
    completion: Completion
    dropped: tuple[DroppedArguments, ...] = ()


class ModelError(_Record, tag="model_error", frozen=True, kw_only=True):
    """The last request failed for good: enough of the error to rebuild it."""

    t: float
    request_id: str | None
    error_kind: str
    message: str
    status: int | None = None
    retryable: bool = False
    attempts: int = 0
    elapsed_s: float = 0.0


class Summary(_Record, tag="summary", frozen=True, kw_only=True):
    """A compaction's summary text (None: the summarizer failed; the marker was used)."""

    t: float
    text: str | None


class Verdict(_Record, tag="approval", frozen=True, kw_only=True):
    """The approver's answer about call ``call_id`` (a timeout is a denial)."""

    t: float
    call_id: str
    approved: bool
    reason: str | None = None
    latency_s: float = 0.0


class Call(_Record, tag="call", frozen=True, kw_only=True):
    """A validated call about to run: for a mutating call this is the intent (committed).

    ``arguments`` is the canonical JSON (sorted keys) of the validated arguments.
    """

    t: float
    call_id: str
    name: str
    arguments: str
    effect: str

    @property
    def mutating(self) -> bool:
        """Whether this is a mutating call's intent."""
        return self.effect == Effect.MUTATING.value


class Result(_Record, tag="result", frozen=True, kw_only=True):
    """What the executor returned for call ``call_id`` (observation bounded as the loop
    appends it)."""

    t: float
    call_id: str
    status: Literal["success", "failure", "ambiguous"]
    observation: str
    latency_s: float = 0.0


class Cut(msgspec.Struct, frozen=True, kw_only=True):
    """The cut that ended a session (``LoopMachine.on_cancelled``'s inputs)."""

    reason: str
    superseded: bool = False
    wall_clock: bool = False
    tool_in_flight: bool = False


class FinishReport(msgspec.Struct, frozen=True, kw_only=True):
    """What the session produced, for display and listings (a resume re-derives the whole
    result from the inputs; this is never used for a decision)."""

    turns: int = 0
    calls: int = 0
    final_text: str | None = None
    finish_reason: str | None = None
    bound: str | None = None
    cancel_reason: str | None = None
    error_kind: str | None = None
    error_message: str | None = None
    ambiguous_call: str | None = None
    attempts: int = 0
    latency_s: float = 0.0
    compactions: int = 0
    usage: dict[str, int] = msgspec.field(default_factory=dict)
    call_list: tuple[ShownCall, ...] = ()
    """The session's last calls (at most :data:`MAX_SHOWN_CALLS`) with their status."""


class ShownCall(msgspec.Struct, frozen=True, array_like=True):
    """One call of the session, for display: id, tool, status, observation."""

    call_id: str
    name: str
    status: str
    observation: str


#: Calls a finish record lists for display (the transcript's list bound).
MAX_SHOWN_CALLS: Final = 64


class Finish(_Record, tag="finish", frozen=True, kw_only=True):
    """The session ended with ``outcome``; ``cut`` is the cut that ended it, if any."""

    t: float
    outcome: str
    cut: Cut | None = None
    report: FinishReport | None = None


def report_of(result: LoopResult) -> FinishReport:
    """The display summary of a session's result."""
    error = result.error
    return FinishReport(
        turns=result.turns,
        calls=len(result.calls),
        final_text=result.final_text,
        finish_reason=result.finish_reason if isinstance(result.finish_reason, str) else None,
        bound=result.bound,
        cancel_reason=result.cancel_reason,
        error_kind=None if error is None else error.kind,
        error_message=None if error is None else error.message,
        ambiguous_call=None if result.ambiguous_call is None else result.ambiguous_call.call_id,
        attempts=result.attempts,
        latency_s=result.latency_s,
        compactions=result.compactions,
        usage=result.usage.as_dict(),
        call_list=tuple(
            ShownCall(c.call_id, c.name, c.status, c.observation)
            for c in result.calls[-MAX_SHOWN_CALLS:]
        ),
    )


Record = Header | Request | Reply | ModelError | Summary | Verdict | Call | Result | Finish

_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Record)


def is_commit(record: Record) -> bool:
    """Whether ``record`` must be durable before the run goes on: a mutating intent, the
    finish."""
    return isinstance(record, Finish) or (isinstance(record, Call) and record.mutating)


def encode_record(record: Record) -> bytes:
    """The record as JSON (one line: JSON never holds a raw newline)."""
    return _ENCODER.encode(record)


def decode_record(data: bytes | str) -> Record:
    """A record from its JSON; raises :class:`msgspec.ValidationError` /
    :class:`msgspec.DecodeError` if it is not one (the caller bounds and words it)."""
    return _DECODER.decode(data)
