"""Tool-call checking: one call the model made, validated against the registry or rejected.

:func:`check_call` turns one model :class:`ToolCall` into a :class:`ValidatedCall`, or into
a :class:`Rejection` whose bounded observation tells the model what was wrong. It never
raises for anything the model wrote. Pure: no I/O, no clock, no awaiting.

Choices made here, and why:

* Arguments policy: the reply decoder (``_wire``) hands over an absent, empty or blank
  arguments string as ``"{}"`` and an arguments *object* re-serialised as JSON text, so a
  model that sends ``""`` or ``{...}`` unquoted is understood. A call whose arguments were
  over ``max_argument_bytes`` arrives as an ``OversizedToolCall`` (arguments dropped) and is
  rejected as ``oversized``. An empty string given to :func:`check_call` directly (a
  ``ToolCall`` built by hand) is malformed JSON; the observation asks for ``{}``.
* A key repeated within one object, at any depth (``"x"`` twice, or ``"x"`` and
  ``"\\u0078"``, equal once decoded), is refused as ``duplicate_key``: a decoder keeps the
  last value, a reader of the text may see the first, and that ambiguity is how an operator
  could be shown one call and the executor given another. The check costs a byte count
  for a flat object with no colon inside a string, else a walk of the decoded value that
  accounts for every colon of the text; only a repeat (or a colon spelled as an escape)
  makes it parse the text again, with the standard library's decoder and a pairs hook.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

import jsonschema_rs
import msgspec

from metacrate_grid_agent._core._redact import TRUNCATION_MARKER, bounded_text
from metacrate_grid_agent._core._schema import (
    MAX_DETAIL_CHARS,
    ToolRegistry,
    error_detail,
    json_pointer,
    quoted_excerpt,
)
from metacrate_grid_agent._core._tools import ValidatedCall
from metacrate_grid_agent._core._types import ToolCall
from metacrate_grid_agent._core._wire import OversizedToolCall

__all__ = ["Rejection", "RejectionReason", "check_call"]

#: Tool names listed in an "unknown tool" observation; the rest are counted.
MAX_LISTED_TOOLS: Final = 32
#: Schema errors spelled out in a "schema_mismatch" observation; the rest are counted.
MAX_REPORTED_ERRORS: Final = 3
#: Further schema errors counted before giving up counting (bounds the work per call).
MAX_COUNTED_ERRORS: Final = 1000
#: Largest arguments (bytes) for which several schema errors are listed: jsonschema_rs
#: computes all errors at once, which for a 1 MiB array of wrong items takes seconds.
MAX_LISTED_ERRORS_BYTES: Final = 4096
#: Default ceiling of one arguments string: the hard ceiling of ``llm.max_argument_bytes``,
#: which the transport already enforces while decoding a reply; this is a backstop.
DEFAULT_MAX_ARGUMENT_BYTES: Final = 1024 * 1024
#: Deepest JSON nesting of decoded arguments; grid actions are flat or nearly so.
MAX_ARGUMENT_DEPTH: Final = 64

_BYTE_POSITION: Final = re.compile(r"\(byte (\d+)\)")
_DECODER: Final = msgspec.json.Decoder()

RejectionReason = Literal[
    "unknown_tool", "malformed_json", "not_an_object", "duplicate_key", "schema_mismatch",
    "oversized",
]  # fmt: skip
"""Why :func:`check_call` refused a call."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """A tool call that did not pass :func:`check_call`.

    ``observation`` is bounded text for the model, saying what was wrong; it quotes at most a
    short excerpt of anything the model wrote.
    """

    observation: str
    reason: RejectionReason


def check_call(
    registry: ToolRegistry,
    call: ToolCall,
    *,
    max_observation_bytes: int,
    max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
) -> ValidatedCall | Rejection:
    """Check one tool call against the registry; never raises for anything the model wrote.

    In order: the tool must exist (``unknown_tool``); the arguments must be at most
    ``max_argument_bytes`` of UTF-8 (``oversized``), JSON (``malformed_json``), nested at
    most :data:`MAX_ARGUMENT_DEPTH` deep (``oversized``), an object (``not_an_object``),
    with no key repeated within one object (``duplicate_key``), and valid against the
    tool's schema (``schema_mismatch``). The arguments are decoded once (a text that may
    repeat a key is parsed a second time to find it).
    A rejection's observation is at most ``max_observation_bytes`` bytes of UTF-8.
    """
    if max_observation_bytes < 1 or max_argument_bytes < 1:
        raise ValueError("max_observation_bytes and max_argument_bytes must be positive")

    registered = registry.get(call.name)
    if registered is None:
        return _reject(
            max_observation_bytes, "unknown_tool", _unknown_tool_text(registry, call.name)
        )
    name = registered.tool.name
    raw = call.arguments

    if isinstance(call, OversizedToolCall):
        return _reject(
            max_observation_bytes,
            "oversized",
            f"the arguments for {name} were {call.argument_bytes} bytes, above the client's "
            "max_argument_bytes, and were not read; send a smaller JSON object",
        )
    if len(raw) > max_argument_bytes:
        return _too_large(name, max_argument_bytes, max_observation_bytes)
    try:
        data = raw.encode("utf-8")
    except UnicodeEncodeError:
        return _reject(
            max_observation_bytes,
            "malformed_json",
            f"the arguments for {name} are not valid JSON: they contain a lone surrogate "
            "(not UTF-8); send the arguments as one JSON object, for example {}",
        )
    if len(data) > max_argument_bytes:
        return _too_large(name, max_argument_bytes, max_observation_bytes)
    try:
        value = _DECODER.decode(data)
    except RecursionError:
        return _too_deep(name, max_observation_bytes)
    except msgspec.DecodeError as exc:
        return _reject(
            max_observation_bytes, "malformed_json", _malformed_text(name, data, str(exc))
        )
    if not isinstance(value, dict):
        return _reject(
            max_observation_bytes,
            "not_an_object",
            f"the arguments for {name} must be a JSON object ({{...}}), "
            f"got {_json_kind(value)}; send them as one object, for example {{}}",
        )
    if _exceeds_depth(value, data, MAX_ARGUMENT_DEPTH):
        return _too_deep(name, max_observation_bytes)
    repeated = _repeated_key(value, data)
    if repeated is not None:
        return _reject(
            max_observation_bytes,
            "duplicate_key",
            f"the arguments for {name} repeat the key {quoted_excerpt(repeated)} "
            "within one object; "
            "each key may appear only once: send them again as one JSON object without the "
            "repeated key",
        )
    validator = registered._validator  # noqa: SLF001 - compiled by the registry, read by the check
    if validator.is_valid(value):
        return ValidatedCall(id=call.id, name=name, arguments=value, effect=registered.tool.effect)
    # jsonschema_rs builds every error before iter_errors yields the first, so listing
    # several is affordable only for small arguments; large ones get the first error alone.
    more: int | None
    if len(data) <= MAX_LISTED_ERRORS_BYTES:
        errors = validator.iter_errors(value)
        first = list(itertools.islice(errors, MAX_REPORTED_ERRORS))
        more = sum(1 for _ in itertools.islice(errors, MAX_COUNTED_ERRORS))
    else:
        try:
            validator.validate(value)
        except jsonschema_rs.ValidationError as error:
            first, more = [error], None
        else:  # pragma: no cover - is_valid said otherwise
            first, more = [], 0
    return _reject(max_observation_bytes, "schema_mismatch", _mismatch_text(name, first, more))


# --- observations ---------------------------------------------------------------------------


def _reject(max_observation_bytes: int, reason: RejectionReason, text: str) -> Rejection:
    observation = bounded_text(
        text, max_observation_bytes, marker=TRUNCATION_MARKER, bare_head=True
    )
    return Rejection(observation=observation, reason=reason)


def _too_large(name: str, max_argument_bytes: int, max_observation_bytes: int) -> Rejection:
    return _reject(
        max_observation_bytes,
        "oversized",
        f"the arguments for {name} are larger than {max_argument_bytes} bytes; "
        "send a smaller JSON object",
    )


def _too_deep(name: str, max_observation_bytes: int) -> Rejection:
    return _reject(
        max_observation_bytes,
        "oversized",
        f"the arguments for {name} are nested more than {MAX_ARGUMENT_DEPTH} levels "
        "deep; send a flatter JSON object",
    )


def _unknown_tool_text(registry: ToolRegistry, name: str) -> str:
    names = registry.names
    if not names:
        return f"unknown tool {quoted_excerpt(name)}: no tools are available"
    listed = ", ".join(names[:MAX_LISTED_TOOLS])
    if len(names) > MAX_LISTED_TOOLS:
        listed += f", and {len(names) - MAX_LISTED_TOOLS} more"
    return f"unknown tool {quoted_excerpt(name)}; the available tools are: {listed}"


def _malformed_text(name: str, data: bytes, message: str) -> str:
    hint = message[:MAX_DETAIL_CHARS]
    position = _BYTE_POSITION.search(message)
    if position is not None:
        at = int(position.group(1))
        near = data[max(0, at - 16) : at + 16].decode("utf-8", "replace")
        hint += f", near {quoted_excerpt(near)}"
    elif not data.strip():
        hint = "the arguments are empty"
    return (
        f"the arguments for {name} are not valid JSON ({hint}); they must be one JSON object, "
        "for example {}"
    )


def _mismatch_text(name: str, errors: list[jsonschema_rs.ValidationError], more: int | None) -> str:
    lines = [f"the arguments for {name} do not match its parameters schema:"]
    for error in errors:
        where = json_pointer(error.instance_path) or "(root)"
        lines.append(f"- at {where[:MAX_DETAIL_CHARS]}: {error_detail(error)}")
    if more is None:
        lines.append("- further errors, if any, are not listed for arguments this large")
    elif more:
        at_least = "at least " if more >= MAX_COUNTED_ERRORS else ""
        noun = "error" if more == 1 else "errors"
        lines.append(f"- and {at_least}{more} more {noun}")
    return "\n".join(lines)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array"


def _exceeds_depth(value: dict[str, Any], data: bytes, limit: int) -> bool:
    """Whether decoded JSON nests deeper than ``limit`` containers (cheap when it cannot)."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children: Iterator[Any] = iter(node.values() if isinstance(node, dict) else node)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _repeated_key(value: dict[str, Any], data: bytes) -> str | None:
    """The first key that ``data`` repeats within one object, or None.

    Every pair of the text holds one colon outside strings, and every key the decoded
    ``value`` kept stands for at least one pair. So when each colon of the text is
    accounted for by a kept key or by a colon inside a kept string, no pair was dropped,
    and nothing was repeated. A colon written as an escape (``\\u003a``) would be counted
    without being in the text: then, as when colons are left over, the text is parsed
    again to find the repeated key, if any.
    """
    colons = data.count(b":")
    if colons == len(value):
        return None
    if b"\\u003" not in data and colons == _accounted_colons(value):
        return None
    try:
        json.loads(data, object_pairs_hook=_refuse_repeats)
    except _RepeatedKeyError as found:
        return found.key
    return None


def _accounted_colons(value: dict[str, Any]) -> int:
    """One per key kept in decoded JSON ``value``, plus the colons inside its strings."""
    count = 0
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            count += len(node)
            node = itertools.chain(node, node.values())  # the keys are strings too
        for child in node:
            if isinstance(child, str):
                count += child.count(":")
            elif isinstance(child, dict | list):
                stack.append(child)
    return count


class _RepeatedKeyError(Exception):
    """Stops the second parse at the first object that repeats a key; carries the key."""

    def __init__(self, key: str) -> None:
        self.key = key


def _refuse_repeats(pairs: list[tuple[str, Any]]) -> None:
    """The ``object_pairs_hook`` of the second parse: builds nothing, raises at a repeat."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _RepeatedKeyError(key)
        seen.add(key)
