"""Tool registration: every tool checked and its schema compiled once, before any request.

:meth:`ToolRegistry.build` validates a set of :class:`~metacrate_grid_agent._core._tools.Tool`\\ s
before any request is made, and raises one :class:`ToolDefinitionError` that lists every
problem it found. Each call the model makes is then checked against the registry by
:func:`~._check.check_call`. Pure: no I/O, no clock, no awaiting.

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
* :func:`validate_tools` is the public way to check a tool table without a client, at an
  application's start-up or in its own tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, NoReturn

import jsonschema_rs
import msgspec

from metacrate_grid_agent._core._tools import Effect, Tool
from metacrate_grid_agent._core._types import ToolDefinition
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import ToolDefinitionError

__all__ = [
    "EXCERPT_CHARS",
    "MAX_DETAIL_CHARS",
    "RegisteredTool",
    "ToolRegistry",
    "error_detail",
    "json_pointer",
    "quoted_excerpt",
    "validate_tools",
]

# --- limits ---------------------------------------------------------------------------------

#: Longest per-tool timeout: a grid action that needs ten minutes is a stuck action.
MAX_TOOL_TIMEOUT_S: Final = 600.0
#: Deepest JSON nesting of a parameters schema; real tool schemas stay under ten levels.
MAX_SCHEMA_DEPTH: Final = 32
#: Problems spelled out in one ToolDefinitionError; the rest are counted.
MAX_REPORTED_PROBLEMS: Final = 20
#: Characters of model-supplied text quoted in an observation or an error message.
EXCERPT_CHARS: Final = 64
#: Characters of one validator message kept (they can quote a whole value).
MAX_DETAIL_CHARS: Final = 200

_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NETWORK_RULE: Final = "schema compilation must never touch the network or the file system"

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


# --- public types ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisteredTool:
    """One validated tool: the tool as given, its wire definition, and its compiled schema."""

    tool: Tool
    definition: ToolDefinition
    """The envelope sent to the model; its parameters are the registry's own JSON copy."""
    _validator: jsonschema_rs.Validator = field(repr=False, compare=False)


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
            label += f" {quoted_excerpt(tool.name)}"
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
        found.append(f"parameters{json_pointer(exc.pointer)}: {exc.problem}")
        return None, None
    size = len(msgspec.json.encode(schema))
    if size > limit:
        found.append(f"parameters are {size} bytes of JSON, more than max_schema_bytes ({limit})")
        return None, None
    before = len(found)
    if schema.get("type") != "object":
        got = quoted_excerpt(str(schema["type"])) if "type" in schema else "nothing"
        found.append(f'parameters must have "type": "object" at the top level, got {got}')
    refs: list[tuple[tuple[str | int, ...], str, str]] = []
    patterns: list[tuple[tuple[str | int, ...], str]] = []
    _walk(schema, (), refs, patterns, in_schema=True)
    for pointer, keyword, target in refs:
        found.append(
            f"parameters{json_pointer(pointer)}: {keyword} {quoted_excerpt(target)} is not local "
            f"(only '#...' references are allowed): {_NETWORK_RULE}"
        )
    checked: dict[str, str | None] = {}
    for pointer, pattern in patterns:
        if pattern not in checked:
            checked[pattern] = _regex_problem(pattern)
        problem = checked[pattern]
        if problem is not None:
            found.append(
                f"parameters{json_pointer(pointer)}: {quoted_excerpt(pattern)} "
                f"is not a valid regular expression{problem}"
            )
    meta_problem = _meta_problem(schema)
    if meta_problem is not None:
        found.append(meta_problem)
    if len(found) > before:
        return None, None
    try:
        validator = _compile(schema)
    except ValueError as exc:  # jsonschema_rs.ValidationError is a ValueError
        found.append(f"parameters do not compile: {error_detail(exc)}")
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
        detail = error_detail(exc)
        return "" if detail.endswith('is not a "regex"') else f" ({detail})"
    return None


def _meta_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` fails its draft's meta-schema (checked offline), or None."""
    try:
        jsonschema_rs.meta.validate(schema, registry=_OFFLINE_REGISTRY)
    except jsonschema_rs.ValidationError as exc:
        return (
            f"parameters{json_pointer(exc.instance_path)} do not conform to the JSON Schema "
            f"meta-schema: {error_detail(exc)}"
        )
    except jsonschema_rs.ReferencingError:
        return (
            f"parameters: $schema {quoted_excerpt(str(schema.get('$schema')))} is not a draft "
            "jsonschema_rs knows (4, 6, 7, 2019-09, 2020-12); meta-schemas are never fetched"
        )
    return None


# --- text helpers ---------------------------------------------------------------------------


def quoted_excerpt(text: str) -> str:
    """A short, quoted, escaped excerpt of text that came from outside (``repr`` escapes)."""
    if len(text) <= EXCERPT_CHARS:
        return repr(text)
    return repr(text[:EXCERPT_CHARS]) + "…"


def error_detail(exc: BaseException) -> str:
    """The first line of an error's message, cut to :data:`MAX_DETAIL_CHARS`."""
    message = exc.message if isinstance(exc, jsonschema_rs.ValidationError) else str(exc)
    line = message.strip().split("\n", 1)[0]
    return line if len(line) <= MAX_DETAIL_CHARS else line[:MAX_DETAIL_CHARS] + "…"


def json_pointer(parts: Sequence[str | int]) -> str:
    """A JSON Pointer (RFC 6901) for a path; empty for the root."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
