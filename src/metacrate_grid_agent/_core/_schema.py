"""Tool registration and call checking: every tool schema compiled once, every call checked.

:meth:`ToolRegistry.build` validates a set of :class:`~metacrate_grid_agent._core._tools.Tool`\\ s
before any request is made, and raises one :class:`ToolDefinitionError` that lists every
problem it found. :func:`check_call` turns one model :class:`ToolCall` into a
:class:`ValidatedCall`, or into a :class:`Rejection` whose bounded observation tells the
model what was wrong. Both are pure: no I/O, no clock, no awaiting.

Rule 1: schema compilation never touches the network or the file system. Three layers
hold it, each enough on its own for the cases it covers:

1. the registration walk refuses every ``$ref``, ``$dynamicRef`` and ``$recursiveRef`` that
   is not local (``#...``), before anything is compiled;
2. the meta-schema check runs against an offline :class:`jsonschema_rs.Registry` (without
   one, ``jsonschema_rs.meta.validate`` fetches an unknown ``$schema`` over HTTP);
3. the compiler gets a retriever that refuses every URI (without one, ``jsonschema_rs``
   fetches ``http(s)://`` references and reads ``file://`` ones).

Choices made here, and why:

* ``format`` is an annotation for every draft (``validate_formats=False``): draft 2020-12
  says so, and one rule for all drafts beats a per-draft surprise. A tool that needs a
  checked format uses ``pattern`` or checks in its executor.
* Regular expressions use ``jsonschema_rs``'s own engine (fancy-regex, ECMA-262-like), both
  in the compiled validator and in the walk that checks patterns the validator never
  compiles (an unused ``$defs`` entry, an ``if`` without ``then``). Python's ``re`` is a
  different dialect: it refuses valid ECMA patterns such as ``\\p{L}`` and ``(?<n>x)``.
* The registry keeps its own plain-JSON copy of each schema, so later changes to the
  caller's mappings change neither the wire definitions nor the validators.
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
* :func:`validate_tools` is the public way to check a tool table without a client, at an
  application's start-up or in its own tests.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, NoReturn

import jsonschema_rs
import msgspec

from metacrate_grid_agent._core._redact import TRUNCATION_MARKER, bounded_text
from metacrate_grid_agent._core._tools import Effect, Tool, ValidatedCall
from metacrate_grid_agent._core._types import ToolCall, ToolDefinition
from metacrate_grid_agent._core._wire import OversizedToolCall
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import ToolDefinitionError

__all__ = [
    "RegisteredTool",
    "Rejection",
    "RejectionReason",
    "ToolRegistry",
    "check_call",
    "validate_tools",
]

# --- limits ---------------------------------------------------------------------------------

#: Longest per-tool timeout: a grid action that needs ten minutes is a stuck action.
MAX_TOOL_TIMEOUT_S: Final = 600.0
#: Deepest JSON nesting of a parameters schema; real tool schemas stay under ten levels.
MAX_SCHEMA_DEPTH: Final = 32
#: Problems spelled out in one ToolDefinitionError; the rest are counted.
MAX_REPORTED_PROBLEMS: Final = 20
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
#: Characters of model-supplied text quoted in an observation or an error message.
EXCERPT_CHARS: Final = 64
#: Characters of one validator message kept (they can quote a whole value).
MAX_DETAIL_CHARS: Final = 200

_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NETWORK_RULE: Final = "schema compilation must never touch the network or the file system"
_BYTE_POSITION: Final = re.compile(r"\(byte (\d+)\)")
_DECODER: Final = msgspec.json.Decoder()

# Schema keywords (all drafts) whose value is a schema, or a list of schemas.
_SUBSCHEMA_KEYWORDS: Final = frozenset(
    {
        "additionalItems", "additionalProperties", "allOf", "anyOf", "contains",
        "contentSchema", "else", "if", "items", "not", "oneOf", "prefixItems",
        "propertyNames", "then", "unevaluatedItems", "unevaluatedProperties",
    }
)  # fmt: skip
# Schema keywords whose value maps names to schemas.
_SUBSCHEMA_MAP_KEYWORDS: Final = frozenset(
    {"$defs", "definitions", "dependencies", "dependentSchemas", "patternProperties", "properties"}
)
# Schema keywords whose value is instance data, never a schema.
_DATA_KEYWORDS: Final = frozenset({"const", "default", "enum", "examples"})
_REF_KEYWORDS: Final = ("$ref", "$dynamicRef", "$recursiveRef")

RejectionReason = Literal[
    "unknown_tool", "malformed_json", "not_an_object", "duplicate_key", "schema_mismatch",
    "oversized",
]  # fmt: skip
"""Why :func:`check_call` refused a call."""


# --- public types ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisteredTool:
    """One validated tool: the tool as given, its wire definition, and its compiled schema."""

    tool: Tool
    definition: ToolDefinition
    """The envelope sent to the model; its parameters are the registry's own JSON copy."""
    _validator: jsonschema_rs.Validator = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A tool call that did not pass :func:`check_call`.

    ``observation`` is bounded text for the model, saying what was wrong; it quotes at most a
    short excerpt of anything the model wrote.
    """

    observation: str
    reason: RejectionReason


class ToolRegistry:
    """Validated, compiled tools, ready for use. Immutable after construction.

    Build with :meth:`build`; construction validates everything and raises
    :class:`ToolDefinitionError` listing every problem at once.
    """

    __slots__ = ("_by_name", "definitions", "names")

    _by_name: Mapping[str, RegisteredTool]
    definitions: tuple[ToolDefinition, ...]
    """The wire definitions, in registration order."""
    names: tuple[str, ...]
    """The tool names, in registration order."""

    def __init__(self, tools: Sequence[Tool], config: ToolLoopConfig) -> None:
        registered = _register(tools, config)
        object.__setattr__(self, "_by_name", MappingProxyType({r.tool.name: r for r in registered}))
        object.__setattr__(self, "definitions", tuple(r.definition for r in registered))
        object.__setattr__(self, "names", tuple(r.tool.name for r in registered))

    @classmethod
    def build(cls, tools: Sequence[Tool], config: ToolLoopConfig) -> ToolRegistry:
        """Validate and compile ``tools`` under ``config``'s limits.

        Raises :class:`ToolDefinitionError` naming every tool and problem found (the first
        few spelled out, the rest counted).
        """
        return cls(tools, config)

    def get(self, name: str) -> RegisteredTool | None:
        """The registered tool called ``name``, or None."""
        return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"ToolRegistry(names={self.names!r})"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"ToolRegistry is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"ToolRegistry is immutable; cannot delete {name!r}")


def validate_tools(
    tools: Sequence[Tool], config: ToolLoopConfig | None = None
) -> tuple[ToolDefinition, ...]:
    """Check a tool table as :class:`ToolLoop` would, without a client; the wire definitions.

    Raises one :class:`ToolDefinitionError` listing every problem (names, descriptions,
    schemas against their meta-schema, sizes, references) under ``config``'s limits (the
    defaults when None). Nothing is fetched and nothing is read from disk.
    """
    registry = ToolRegistry.build(tools, ToolLoopConfig() if config is None else config)
    return registry.definitions


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

    def reject(reason: RejectionReason, text: str) -> Rejection:
        observation = bounded_text(
            text, max_observation_bytes, marker=TRUNCATION_MARKER, bare_head=True
        )
        return Rejection(observation=observation, reason=reason)

    registered = registry.get(call.name)
    if registered is None:
        return reject("unknown_tool", _unknown_tool_text(registry, call.name))
    name = registered.tool.name
    raw = call.arguments
    too_large = (
        f"the arguments for {name} are larger than {max_argument_bytes} bytes; "
        "send a smaller JSON object"
    )
    if isinstance(call, OversizedToolCall):
        return reject(
            "oversized",
            f"the arguments for {name} were {call.argument_bytes} bytes, above the client's "
            "max_argument_bytes, and were not read; send a smaller JSON object",
        )
    if len(raw) > max_argument_bytes:
        return reject("oversized", too_large)
    try:
        data = raw.encode("utf-8")
    except UnicodeEncodeError:
        return reject(
            "malformed_json",
            f"the arguments for {name} are not valid JSON: they contain a lone surrogate "
            "(not UTF-8); send the arguments as one JSON object, for example {}",
        )
    if len(data) > max_argument_bytes:
        return reject("oversized", too_large)
    too_deep = (
        f"the arguments for {name} are nested more than {MAX_ARGUMENT_DEPTH} levels deep; "
        "send a flatter JSON object"
    )
    try:
        value = _DECODER.decode(data)
    except RecursionError:
        return reject("oversized", too_deep)
    except msgspec.DecodeError as exc:
        return reject("malformed_json", _malformed_text(name, data, str(exc)))
    if not isinstance(value, dict):
        return reject(
            "not_an_object",
            f"the arguments for {name} must be a JSON object ({{...}}), "
            f"got {_json_kind(value)}; send them as one object, for example {{}}",
        )
    if _exceeds_depth(value, data, MAX_ARGUMENT_DEPTH):
        return reject("oversized", too_deep)
    repeated = _repeated_key(value, data)
    if repeated is not None:
        return reject(
            "duplicate_key",
            f"the arguments for {name} repeat the key {_excerpt(repeated)} within one object; "
            "each key may appear only once: send them again as one JSON object without the "
            "repeated key",
        )
    validator = registered._validator
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
    return reject("schema_mismatch", _mismatch_text(name, first, more))


# --- registration ---------------------------------------------------------------------------


class _NotJSONError(Exception):
    """A value in a schema that has no JSON form; carries where and why."""

    def __init__(self, pointer: tuple[str | int, ...], problem: str) -> None:
        super().__init__(problem)
        self.pointer = pointer
        self.problem = problem


class _RetrievalRefusedError(ValueError):
    """Raised by the retriever handed to jsonschema_rs: nothing is ever fetched."""


def _refuse_retrieval(uri: str, /) -> NoReturn:
    """A jsonschema_rs retriever that refuses every URI (defence in depth)."""
    raise _RetrievalRefusedError(f"refused to retrieve {uri[:EXCERPT_CHARS]!r}: {_NETWORK_RULE}")


# A registry with no resources: the meta-schema check finds the built-in drafts' meta-schemas
# and nothing else, and never retrieves (an unknown ``$schema`` is a ReferencingError).
_OFFLINE_REGISTRY: Final = jsonschema_rs.Registry([], retriever=_refuse_retrieval)


def _register(tools: Sequence[Tool], config: ToolLoopConfig) -> list[RegisteredTool]:
    items = list(tools)
    problems: list[str] = []
    if len(items) > config.max_tools:
        problems.append(f"tools: {len(items)} tools, more than max_tools ({config.max_tools})")
    registered: list[RegisteredTool] = []
    first_index: dict[str, int] = {}
    for index, tool in enumerate(items):
        if not isinstance(tool, Tool):
            problems.append(f"tools[{index}]: is a {type(tool).__name__}, not a Tool")
            continue
        label = f"tools[{index}]"
        if isinstance(tool.name, str):
            label += f" {_excerpt(tool.name)}"
        found: list[str] = []
        name_ok = _check_name(tool.name, found)
        if name_ok:
            if tool.name in first_index:
                found.append(f"name duplicates tools[{first_index[tool.name]}]")
            else:
                first_index[tool.name] = index
        if not isinstance(tool.effect, Effect):
            found.append(f"effect must be an Effect, got {type(tool.effect).__name__}")
        _check_timeout(tool.timeout_s, found)
        if tool.needs_approval is not None and not isinstance(tool.needs_approval, bool):
            found.append(
                f"needs_approval must be None, True or False, got "
                f"{type(tool.needs_approval).__name__}"
            )
        _check_description(tool.description, config.max_description_bytes, found)
        schema, validator = _check_parameters(tool.parameters, config.max_schema_bytes, found)
        problems.extend(f"{label}: {problem}" for problem in found)
        if not found and schema is not None and validator is not None:
            definition = ToolDefinition.create(tool.name, tool.description, schema)
            registered.append(RegisteredTool(tool, definition, validator))
    if problems:
        raise ToolDefinitionError(_problems_message(problems))
    return registered


def _problems_message(problems: list[str]) -> str:
    count = len(problems)
    noun = "problem" if count == 1 else "problems"
    shown = problems[:MAX_REPORTED_PROBLEMS]
    if count > MAX_REPORTED_PROBLEMS:
        shown.append(f"and {count - MAX_REPORTED_PROBLEMS} more")
    return f"invalid tool definitions ({count} {noun}): " + "; ".join(shown)


def _check_name(name: object, found: list[str]) -> bool:
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        found.append("name must be 1 to 64 ASCII letters, digits, '_' or '-'")
        return False
    return True


def _check_timeout(timeout_s: object, found: list[str]) -> None:
    if timeout_s is None:
        return
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not math.isfinite(timeout_s)
        or not 0 < timeout_s <= MAX_TOOL_TIMEOUT_S
    ):
        found.append(
            f"timeout_s must be None or a number above 0 and at most {MAX_TOOL_TIMEOUT_S:g}, "
            f"got {str(timeout_s)[:EXCERPT_CHARS]}"
        )


def _check_description(description: object, limit: int, found: list[str]) -> None:
    if not isinstance(description, str):
        found.append(f"description must be a str, got {type(description).__name__}")
        return
    try:
        size = len(description.encode("utf-8"))
    except UnicodeEncodeError:
        found.append("description is not valid UTF-8 (it contains a lone surrogate)")
        return
    if size > limit:
        found.append(f"description is {size} bytes, more than max_description_bytes ({limit})")


def _check_parameters(
    parameters: object, limit: int, found: list[str]
) -> tuple[dict[str, Any] | None, jsonschema_rs.Validator | None]:
    """Problems with one parameters schema go to ``found``; returns its copy and validator."""
    if not isinstance(parameters, Mapping):
        found.append(
            f"parameters must be a JSON object (a Mapping), got {type(parameters).__name__}"
        )
        return None, None
    try:
        schema: dict[str, Any] = _plain_json(parameters, (), 1)
    except _NotJSONError as exc:
        found.append(f"parameters{_pointer(exc.pointer)}: {exc.problem}")
        return None, None
    size = len(msgspec.json.encode(schema))
    if size > limit:
        found.append(f"parameters are {size} bytes of JSON, more than max_schema_bytes ({limit})")
        return None, None
    before = len(found)
    if schema.get("type") != "object":
        got = _excerpt(str(schema["type"])) if "type" in schema else "nothing"
        found.append(f'parameters must have "type": "object" at the top level, got {got}')
    refs: list[tuple[tuple[str | int, ...], str, str]] = []
    patterns: list[tuple[tuple[str | int, ...], str]] = []
    _walk(schema, (), refs, patterns, in_schema=True)
    for pointer, keyword, target in refs:
        found.append(
            f"parameters{_pointer(pointer)}: {keyword} {_excerpt(target)} is not local "
            f"(only '#...' references are allowed): {_NETWORK_RULE}"
        )
    checked: dict[str, str | None] = {}
    for pointer, pattern in patterns:
        if pattern not in checked:
            checked[pattern] = _regex_problem(pattern)
        problem = checked[pattern]
        if problem is not None:
            found.append(
                f"parameters{_pointer(pointer)}: {_excerpt(pattern)} is not a valid regular "
                f"expression{problem}"
            )
    meta_problem = _meta_problem(schema)
    if meta_problem is not None:
        found.append(meta_problem)
    if len(found) > before:
        return None, None
    try:
        validator = _compile(schema)
    except ValueError as exc:  # jsonschema_rs.ValidationError is a ValueError
        found.append(f"parameters do not compile: {_detail(exc)}")
        return None, None
    return schema, validator


def _compile(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    """The validator for ``schema``'s draft; retrieval refused, ``format`` an annotation."""
    return jsonschema_rs.validator_for(schema, retriever=_refuse_retrieval, validate_formats=False)


def _plain_json(value: Any, pointer: tuple[str | int, ...], depth: int) -> Any:
    """A plain-JSON deep copy of ``value``, or :class:`_NotJSONError` saying what is not JSON."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _NotJSONError(pointer, "a string contains a lone surrogate (not UTF-8)") from None
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJSONError(pointer, f"{value!r} is not a JSON number")
        return float(value)
    if isinstance(value, Mapping | list | tuple):
        if depth > MAX_SCHEMA_DEPTH:
            raise _NotJSONError(pointer, f"nested more than {MAX_SCHEMA_DEPTH} levels deep")
        if isinstance(value, Mapping):
            copy: dict[str, Any] = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise _NotJSONError(pointer, f"key {str(key)[:EXCERPT_CHARS]!r} is not a str")
                copy[str.__str__(key)] = _plain_json(item, (*pointer, key), depth + 1)
            return copy
        return [_plain_json(item, (*pointer, i), depth + 1) for i, item in enumerate(value)]
    raise _NotJSONError(pointer, f"values of type {type(value).__name__} are not JSON")


def _walk(
    node: object,
    pointer: tuple[str | int, ...],
    refs: list[tuple[tuple[str | int, ...], str, str]],
    patterns: list[tuple[tuple[str | int, ...], str]],
    *,
    in_schema: bool,
) -> None:
    """Collect non-local references (anywhere but instance data) and schema patterns.

    Outside schema positions (vendor extensions, unknown keywords) references are still
    refused, conservatively; patterns are only collected where they are keywords.
    """
    if isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, (*pointer, i), refs, patterns, in_schema=in_schema)
        return
    if not isinstance(node, dict):
        return
    for keyword in _REF_KEYWORDS:
        target = node.get(keyword)
        if isinstance(target, str) and not target.startswith("#"):
            refs.append(((*pointer, keyword), keyword, target))
    if not in_schema:
        for key, value in node.items():
            _walk(value, (*pointer, key), refs, patterns, in_schema=False)
        return
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        patterns.append(((*pointer, "pattern"), pattern))
    pattern_properties = node.get("patternProperties")
    if isinstance(pattern_properties, dict):
        patterns.extend(((*pointer, "patternProperties", k), k) for k in pattern_properties)
    for key, value in node.items():
        here = (*pointer, key)
        if key in _DATA_KEYWORDS:
            continue
        if key in _SUBSCHEMA_KEYWORDS:
            _walk(value, here, refs, patterns, in_schema=True)
        elif key in _SUBSCHEMA_MAP_KEYWORDS and isinstance(value, dict):
            for name, subschema in value.items():
                _walk(subschema, (*here, name), refs, patterns, in_schema=True)
        else:
            _walk(value, here, refs, patterns, in_schema=False)


def _regex_problem(pattern: str) -> str | None:
    """None if jsonschema_rs's regex engine compiles ``pattern``; else a detail to append.

    The detail is empty when the engine says only that the pattern "is not a regex".
    """
    try:
        jsonschema_rs.Draft202012Validator({"pattern": pattern}, retriever=_refuse_retrieval)
    except ValueError as exc:
        detail = _detail(exc)
        return "" if detail.endswith('is not a "regex"') else f" ({detail})"
    return None


def _meta_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` fails its draft's meta-schema (checked offline), or None."""
    try:
        jsonschema_rs.meta.validate(schema, registry=_OFFLINE_REGISTRY)
    except jsonschema_rs.ValidationError as exc:
        return (
            f"parameters{_pointer(exc.instance_path)} do not conform to the JSON Schema "
            f"meta-schema: {_detail(exc)}"
        )
    except jsonschema_rs.ReferencingError:
        return (
            f"parameters: $schema {_excerpt(str(schema.get('$schema')))} is not a draft "
            "jsonschema_rs knows (4, 6, 7, 2019-09, 2020-12); meta-schemas are never fetched"
        )
    return None


# --- observations ---------------------------------------------------------------------------


def _unknown_tool_text(registry: ToolRegistry, name: str) -> str:
    names = registry.names
    if not names:
        return f"unknown tool {_excerpt(name)}: no tools are available"
    listed = ", ".join(names[:MAX_LISTED_TOOLS])
    if len(names) > MAX_LISTED_TOOLS:
        listed += f", and {len(names) - MAX_LISTED_TOOLS} more"
    return f"unknown tool {_excerpt(name)}; the available tools are: {listed}"


def _malformed_text(name: str, data: bytes, message: str) -> str:
    hint = message[:MAX_DETAIL_CHARS]
    position = _BYTE_POSITION.search(message)
    if position is not None:
        at = int(position.group(1))
        near = data[max(0, at - 16) : at + 16].decode("utf-8", "replace")
        hint += f", near {_excerpt(near)}"
    elif not data.strip():
        hint = "the arguments are empty"
    return (
        f"the arguments for {name} are not valid JSON ({hint}); they must be one JSON object, "
        "for example {}"
    )


def _mismatch_text(name: str, errors: list[jsonschema_rs.ValidationError], more: int | None) -> str:
    lines = [f"the arguments for {name} do not match its parameters schema:"]
    for error in errors:
        where = _pointer(error.instance_path) or "(root)"
        lines.append(f"- at {where[:MAX_DETAIL_CHARS]}: {_detail(error)}")
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


# --- text helpers ---------------------------------------------------------------------------


def _excerpt(text: str) -> str:
    """A short, quoted, escaped excerpt of text that came from outside (``repr`` escapes)."""
    if len(text) <= EXCERPT_CHARS:
        return repr(text)
    return repr(text[:EXCERPT_CHARS]) + "…"


def _detail(exc: BaseException) -> str:
    """The first line of an error's message, cut to :data:`MAX_DETAIL_CHARS`."""
    message = exc.message if isinstance(exc, jsonschema_rs.ValidationError) else str(exc)
    line = message.strip().split("\n", 1)[0]
    return line if len(line) <= MAX_DETAIL_CHARS else line[:MAX_DETAIL_CHARS] + "…"


def _pointer(parts: Sequence[str | int]) -> str:
    """A JSON Pointer (RFC 6901) for a path; empty for the root."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
