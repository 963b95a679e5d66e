"""A deterministic scripted "model" for the fake endpoint: the CLI's built-in demo partner.

It is not a language model. Each reply is decided from the request body alone (stateless,
so retries and replays give the same answer), by counting the assistant messages already in
the history and reading the last tool observations:

1. ``look_around``;
2. one deliberately invalid call, ``move_to`` with ``{"x": "north"}``, which the tool loop
   rejects and returns to the model as an observation;
3. a valid ``move_to`` to the cell next to the sign that ``look_around`` reported;
4. ``say`` a greeting;
5. a final text summary naming what it did, and saying that it is a scripted model.

Plug it into the loopback fake with ``FakeEndpoint(responder=respond)``; :func:`decide` is the
pure decision, for tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from metacrate_grid_agent.testing import RecordedRequest, Reply

__all__ = [
    "DISCLAIMER",
    "INVALID_MOVE_ARGUMENTS",
    "ScriptedTurn",
    "decide",
    "respond",
]

#: Said in the greeting and the summary, so no reader mistakes the demo for a real model.
DISCLAIMER: Final = "This was the scripted demo model, not a real language model."
#: The deliberately invalid arguments of step 2 (``x`` must be an integer; ``y`` is missing).
INVALID_MOVE_ARGUMENTS: Final = '{"x": "north"}'
#: Tools the script drives; without all of them it only answers with text.
REQUIRED_TOOLS: Final = frozenset({"look_around", "move_to", "say"})
#: Where to walk when ``look_around`` did not report the sign.
FALLBACK_TARGET: Final = (25, 25)
#: Longest observation quoted in the summary.
QUOTE_CHARS: Final = 160
_GRID_MAX: Final = 63
_SIGN: Final = re.compile(r"\bsign at \((\d{1,2}), (\d{1,2})\)")
_NAMES: Final = re.compile(r"(?:^|; |: )([A-Za-z]+) at \(")


@dataclass(frozen=True, slots=True)
class ScriptedTurn:
    """One scripted reply: text, or tool calls as ``(id, name, arguments_json)``."""

    text: str | None
    tool_calls: tuple[tuple[str, str, str], ...] = ()


def _call_id(step: int, name: str) -> str:
    return f"scripted-{step}-{name}"


LOOK_ID: Final = _call_id(1, "look_around")
BAD_MOVE_ID: Final = _call_id(2, "move_to")
MOVE_ID: Final = _call_id(3, "move_to")
SAY_ID: Final = _call_id(4, "say")


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


def _observations(messages: Sequence[Any]) -> dict[str, str]:
    """Tool observations by tool-call id."""
    found: dict[str, str] = {}
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if isinstance(call_id, str):
                found[call_id] = _text_of(message.get("content"))
    return found


def _offered_tools(body: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    tools = body.get("tools")
    if isinstance(tools, Sequence):
        for tool in tools:
            function = tool.get("function") if isinstance(tool, Mapping) else None
            if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                names.add(function["name"])
    return names


def _target(look: str | None) -> tuple[int, int]:
    """The free cell just north of the sign (one row up), or the fallback."""
    match = _SIGN.search(look or "")
    if match is None:
        return FALLBACK_TARGET
    x, y = int(match.group(1)), int(match.group(2))
    return x, y - 1 if y > 0 else y + 1


def _quote(text: str | None) -> str:
    flat = " ".join((text or "no observation").split())
    return flat if len(flat) <= QUOTE_CHARS else flat[: QUOTE_CHARS - 1] + "…"


def _summary(observations: Mapping[str, str]) -> str:
    look = observations.get(LOOK_ID)
    seen = [m.group(1) for m in _NAMES.finditer(look or "")]
    rejected = _quote(observations.get(BAD_MOVE_ID))
    parts = [
        "I looked around" + (f" and saw {', '.join(seen)}" if seen else "") + ".",
        f"My first move_to, with {INVALID_MOVE_ARGUMENTS}, was rejected: {rejected}",
        f"Then I moved: {_quote(observations.get(MOVE_ID))}",
        f"Then I spoke: {_quote(observations.get(SAY_ID))}",
        DISCLAIMER,
    ]
    return " ".join(parts)


def decide(body: Mapping[str, Any]) -> ScriptedTurn:
    """The scripted reply to one chat-completions request body (a decoded JSON object)."""
    messages = body.get("messages")
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        messages = []
    if not _offered_tools(body) >= REQUIRED_TOOLS:
        return ScriptedTurn(
            "Hello from the scripted demo model. It only drives the sandbox tools "
            "(look_around, move_to, say), and they were not offered. " + DISCLAIMER
        )
    step = sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")
    observations = _observations(messages)
    if step == 0:
        return ScriptedTurn(None, ((LOOK_ID, "look_around", "{}"),))
    if step == 1:
        return ScriptedTurn(None, ((BAD_MOVE_ID, "move_to", INVALID_MOVE_ARGUMENTS),))
    if step == 2:
        x, y = _target(observations.get(LOOK_ID))
        x, y = min(max(x, 0), _GRID_MAX), min(max(y, 0), _GRID_MAX)
        return ScriptedTurn(None, ((MOVE_ID, "move_to", json.dumps({"x": x, "y": y})),))
    if step == 3:
        greeting = "Hello from Scout! I am driven by a scripted demo model, not a real one."
        return ScriptedTurn(None, ((SAY_ID, "say", json.dumps({"text": greeting})),))
    return ScriptedTurn(_summary(observations))


def respond(request: RecordedRequest) -> Reply:
    """A :class:`Reply` for the fake endpoint: the scripted turn, with deterministic usage."""
    try:
        body = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        return Reply.error(400, "scripted model: the request body is not JSON")
    if not isinstance(body, Mapping):
        return Reply.error(400, "scripted model: the request body is not a JSON object")
    turn = decide(body)
    completion_tokens = 1 + len(turn.text or "") // 4 + 12 * len(turn.tool_calls)
    return Reply.completion(
        turn.text,
        tool_calls=turn.tool_calls,
        usage=(max(1, len(request.body) // 4), completion_tokens),
    )
