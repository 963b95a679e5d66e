"""``run --model-script FILE``: a model played by a script the operator wrote, for any tools.

The file is a JSON array of turns, each ``{"text": "..."}`` (a final answer) or
``{"tool_calls": [{"name": "...", "arguments": {...}}, ...]}``. It is read as the
configuration is (a regular file only, bounded: :func:`metacrate_grid_agent.safety.read_regular`)
and checked whole before anything starts: a problem is one :class:`UsageError` line.

:meth:`ModelScript.reply_to` answers one chat-completions request from the request alone:
the turn is the number of assistant messages already in its history, plus one, so a request
sent again gets the same turn. Call ids are ``script-TURN-INDEX``. A request past the last
turn is answered with an error (the session ends there) and :attr:`ModelScript.ran_out` is
set, for the command's one line. :meth:`respond` plugs it into the loopback
:class:`~metacrate_grid_agent.testing.FakeEndpoint` (``responder=``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from metacrate_grid_agent.cli._common import UsageError
from metacrate_grid_agent.safety import read_regular
from metacrate_grid_agent.testing import RecordedRequest, Reply

__all__ = ["MAX_SCRIPT_BYTES", "ModelScript", "ScriptTurn"]

#: Largest script file: thousands of hand-written turns, small enough to hold and check whole.
MAX_SCRIPT_BYTES: Final = 1024 * 1024
#: The error type of the reply to a request past the script's last turn.
RAN_OUT_TYPE: Final = "model_script_ran_out"
#: Longest key or tool name quoted in a problem (a problem is one line).
_QUOTED_CHARS: Final = 64
_TURN_KEYS: Final = frozenset({"text", "tool_calls"})
_CALL_KEYS: Final = frozenset({"name", "arguments"})


@dataclass(frozen=True, slots=True)
class ScriptTurn:
    """One scripted reply: a final text, or tool calls as ``(id, name, arguments_json)``."""

    text: str | None
    tool_calls: tuple[tuple[str, str, str], ...] = ()


def _quoted(word: object) -> str:
    return json.dumps(str(word)[:_QUOTED_CHARS])


def _unknown(keys: Sequence[str], known: frozenset[str], where: str) -> None:
    for key in keys:
        if key not in known:
            expected = " and ".join(_quoted(k) for k in sorted(known))
            raise UsageError(f"{where}: unknown key {_quoted(key)} (the keys here: {expected})")


def _call(number: int, index: int, value: object) -> tuple[str, str, str]:
    where = f"turn {number}, call {index}"
    if not isinstance(value, dict):
        raise UsageError(f'{where}: must be an object {{"name": ..., "arguments": {{...}}}}')
    _unknown(list(value), _CALL_KEYS, where)
    name, arguments = value.get("name"), value.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise UsageError(f'{where}: "name" must be the tool\'s name (a non-empty string)')
    if not isinstance(arguments, dict):
        raise UsageError(f'{where}: "arguments" must be a JSON object')
    return f"script-{number}-{index}", name, json.dumps(arguments)


def _turn(number: int, value: object) -> ScriptTurn:
    where = f"turn {number}"
    shape = '{"text": "..."} or {"tool_calls": [{"name": ..., "arguments": {...}}, ...]}'
    if not isinstance(value, dict):
        raise UsageError(f"{where}: must be an object, {shape}")
    _unknown(list(value), _TURN_KEYS, where)
    if len(value) != 1:
        raise UsageError(f"{where}: must be one of {shape}")
    if "text" in value:
        if not isinstance(value["text"], str):
            raise UsageError(f'{where}: "text" must be a string')
        return ScriptTurn(value["text"])
    calls = value["tool_calls"]
    if not isinstance(calls, list) or not calls:
        raise UsageError(f'{where}: "tool_calls" must be a non-empty array of calls')
    return ScriptTurn(None, tuple(_call(number, i, c) for i, c in enumerate(calls, start=1)))


def _assistant_turns(body: bytes) -> int | None:
    """The assistant messages in a request's history, or None if the body is not a request."""
    try:
        messages = json.loads(body).get("messages")
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        return None
    if not isinstance(messages, list):
        return None
    return sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")


@dataclass(slots=True)
class ModelScript:
    """A checked script and the file it came from; :attr:`ran_out` once a turn was missing."""

    path: str
    turns: tuple[ScriptTurn, ...]
    ran_out: bool = field(default=False, compare=False)

    @classmethod
    def load(cls, path: str) -> ModelScript:
        """Read and check the script at ``path``; :class:`UsageError` (one line) if it is bad."""
        try:
            return cls(path, cls._parse(path))
        except UsageError as exc:
            raise UsageError(f"--model-script {path!r}: {exc}") from None

    @staticmethod
    def _parse(path: str) -> tuple[ScriptTurn, ...]:
        try:
            data = read_regular(path, MAX_SCRIPT_BYTES).data
        except OSError as exc:
            raise UsageError(f"cannot read: {exc.strerror or exc}") from None
        if len(data) > MAX_SCRIPT_BYTES:
            raise UsageError(f"is larger than {MAX_SCRIPT_BYTES} bytes")
        try:
            value: Any = json.loads(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            why = "too deeply nested" if isinstance(exc, RecursionError) else exc
            raise UsageError(f"is not JSON ({why})") from None
        if not isinstance(value, list):
            raise UsageError("must be a JSON array of turns")
        if not value:
            raise UsageError('has no turns: give at least one, e.g. [{"text": "Done."}]')
        return tuple(_turn(number, turn) for number, turn in enumerate(value, start=1))

    @property
    def shown(self) -> str:
        """The file and its length, as the command's lines name it."""
        count = len(self.turns)
        return f"{self.path} ({count} turn{'s' if count != 1 else ''})"

    def reply_to(self, body: bytes) -> Reply:
        """The reply to a request with this body: its turn, with deterministic usage."""
        done = _assistant_turns(body)
        if done is None:
            return Reply.error(400, "model script: the request body is not a chat request")
        if done >= len(self.turns):
            self.ran_out = True
            return Reply.error(
                400,
                f"the model script ran out: the session asked for turn {done + 1} of {self.shown}",
                type=RAN_OUT_TYPE,
            )
        turn = self.turns[done]
        completion_tokens = 1 + len(turn.text or "") // 4 + 12 * len(turn.tool_calls)
        return Reply.completion(
            turn.text,
            tool_calls=turn.tool_calls,
            usage=(max(1, len(body) // 4), completion_tokens),
        )

    def respond(self, request: RecordedRequest) -> Reply:
        """:meth:`reply_to` for the fake endpoint's ``responder=``."""
        return self.reply_to(request.body)

    def ran_out_line(self) -> str:
        """The one line saying the script ran out, and how to end one."""
        return (
            f"grid-agent: the model script {self.shown} ran out: the session asked for a turn "
            'after its last; end a script with a {"text": ...} turn'
        )
