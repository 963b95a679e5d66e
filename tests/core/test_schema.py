"""Unit and property tests for tool registration (``_schema``) and call checking (``_check``)."""

from __future__ import annotations

import json
import math
import socket
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import jsonschema_rs
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metacrate_grid_agent._core._check import (
    DEFAULT_MAX_ARGUMENT_BYTES,
    MAX_ARGUMENT_DEPTH,
    MAX_LISTED_TOOLS,
    MAX_REPORTED_ERRORS,
    Rejection,
    check_call,
)
from metacrate_grid_agent._core._redact import TRUNCATION_MARKER
from metacrate_grid_agent._core._schema import (
    MAX_REPORTED_PROBLEMS,
    MAX_SCHEMA_DEPTH,
    RegisteredTool,
    ToolRegistry,
    _compile,
    _meta_problem,
)
from metacrate_grid_agent._core._tools import Effect, Tool, ValidatedCall
from metacrate_grid_agent._core._types import ToolCall
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import ToolDefinitionError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from pathlib import Path

CONFIG = ToolLoopConfig()
NETWORK_RULE = "schema compilation must never touch the network or the file system"
LIMIT = 512

MOVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": -100, "maximum": 100},
        "y": {"type": "integer", "minimum": -100, "maximum": 100},
        "run": {"type": "boolean"},
        "tag": {"type": "string", "pattern": "^\\p{L}+$"},
    },
    "required": ["x", "y"],
    "additionalProperties": False,
}


def tool(
    name: str = "look",
    parameters: Mapping[str, Any] | None = None,
    *,
    description: str = "Look around.",
    effect: Effect = Effect.READ_ONLY,
    timeout_s: float | None = None,
) -> Tool:
    """A tool with an object schema unless another is given."""
    schema = {"type": "object"} if parameters is None else parameters
    return Tool(name, description, schema, effect, timeout_s)


def with_property(subschema: Any) -> dict[str, Any]:
    """An object schema with one property ``a`` of this schema."""
    return {"type": "object", "properties": {"a": subschema}}


def registry() -> ToolRegistry:
    """A registry with a mutating ``move`` tool and a read-only ``look`` tool."""
    move = tool("move", MOVE_SCHEMA, description="Walk to x, y.", effect=Effect.MUTATING)
    return ToolRegistry.build([move, tool("look")], CONFIG)


def check(arguments: str, name: str = "move", limit: int = LIMIT) -> ValidatedCall | Rejection:
    """Check one call against :func:`registry`."""
    call = ToolCall.create("call_1", name, arguments)
    return check_call(registry(), call, max_observation_bytes=limit)


def rejected(arguments: str, name: str = "move", limit: int = LIMIT) -> Rejection:
    """The rejection of a call that must be rejected, its observation within ``limit``."""
    result = check(arguments, name, limit)
    assert isinstance(result, Rejection)
    assert len(result.observation.encode("utf-8")) <= limit
    return result


def definition_error(tools: list[Any], config: ToolLoopConfig = CONFIG) -> str:
    """The message of the ToolDefinitionError that registering ``tools`` must raise."""
    with pytest.raises(ToolDefinitionError) as info:
        ToolRegistry.build(tools, config)
    assert info.value.kind == "tool_definition"
    return info.value.message


class ConnectionRecorder:
    """A loopback TCP listener (no asyncio) that records, then drops, every connection."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.02)
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0
        self._finished = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._accept_once()

    def _accept_once(self) -> bool:
        try:
            conn, _ = self.sock.accept()
        except TimeoutError:
            return False
        conn.close()  # a prompt close makes a broken client fail fast instead of hanging
        self.connections += 1
        return True

    def finish(self) -> int:
        """Stop serving, drain the backlog, and return how many connections arrived."""
        if self._finished:
            return self.connections
        self._finished = True
        self._stop.set()
        self._thread.join()
        while self._accept_once():
            pass
        self.sock.close()
        return self.connections


@contextmanager
def recorder() -> Iterator[ConnectionRecorder]:
    """A running :class:`ConnectionRecorder`, always closed."""
    rec = ConnectionRecorder()
    try:
        yield rec
    finally:
        rec.finish()


# --- registration: the good path -------------------------------------------------------------


def test_good_tools_register_in_order_with_wire_definitions() -> None:
    """A valid tool set compiles; definitions and names keep registration order."""
    reg = registry()
    assert len(reg) == 2
    assert reg.names == ("move", "look")
    assert [d.name for d in reg.definitions] == ["move", "look"]
    wire = msgspec.json.decode(msgspec.json.encode(reg.definitions[0]))
    assert wire == {
        "type": "function",
        "function": {"name": "move", "description": "Walk to x, y.", "parameters": MOVE_SCHEMA},
    }
    move = reg.get("move")
    assert isinstance(move, RegisteredTool)
    assert move.tool.effect is Effect.MUTATING
    assert move.definition is reg.definitions[0]
    assert reg.get("jump") is None


def test_empty_tool_set_is_allowed() -> None:
    """No tools is a valid registry (a loop that only talks)."""
    reg = ToolRegistry.build([], CONFIG)
    assert (len(reg), reg.names, reg.definitions) == (0, (), ())


def test_registry_is_immutable_and_owns_its_schemas() -> None:
    """Neither the registry nor later changes to the caller's mappings alter what was built."""
    schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}
    reg = ToolRegistry.build([tool("t", schema)], CONFIG)
    schema["properties"]["a"]["type"] = "string"
    schema["required"] = ["a"]
    assert reg.definitions[0].function.parameters == {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
    }
    assert isinstance(
        check_call(reg, ToolCall.create("c", "t", "{}"), max_observation_bytes=LIMIT), ValidatedCall
    )
    with pytest.raises(AttributeError):
        reg.names = ()
    with pytest.raises(AttributeError):
        del reg.definitions


def test_mapping_and_tuple_values_are_copied_as_json() -> None:
    """Any Mapping and tuples are accepted and become plain JSON objects and arrays."""
    from types import MappingProxyType

    schema = MappingProxyType({"type": "object", "required": ("a",)})
    reg = ToolRegistry.build([tool("t", schema)], CONFIG)
    assert reg.definitions[0].function.parameters == {"type": "object", "required": ["a"]}


@pytest.mark.parametrize("name", ["a", "A-z_09", "x" * 64])
def test_valid_names(name: str) -> None:
    """Names of 1 to 64 ASCII letters, digits, '_' and '-' are accepted."""
    assert ToolRegistry.build([tool(name)], CONFIG).names == (name,)


@pytest.mark.parametrize("timeout_s", [None, 0.001, 30, 600])
def test_valid_timeouts(timeout_s: float | None) -> None:
    """timeout_s may be None or a positive finite number up to 600."""
    assert len(ToolRegistry.build([tool(timeout_s=timeout_s)], CONFIG)) == 1


# --- registration: each bad definition -------------------------------------------------------


@pytest.mark.parametrize("name", ["a b", "", "x" * 65, "ünï", "x\n", "a.b", "tab\t", "١٢"])
def test_bad_names_are_refused(name: str) -> None:
    """A name outside [A-Za-z0-9_-]{1,64}, fully anchored and ASCII-only, is refused."""
    assert "name must be 1 to 64 ASCII letters" in definition_error([tool(name)])


def test_duplicate_names_are_refused() -> None:
    """Two tools with one name would make calls ambiguous."""
    message = definition_error([tool("look"), tool("move"), tool("look")])
    assert "tools[2] 'look': name duplicates tools[0]" in message


def test_too_many_tools_are_refused() -> None:
    """More tools than max_tools is a problem."""
    config = ToolLoopConfig(max_tools=2)
    message = definition_error([tool("a"), tool("b"), tool("c")], config)
    assert "3 tools, more than max_tools (2)" in message


def test_items_must_be_tools_with_effects() -> None:
    """Something that is not a Tool, or a Tool whose effect is not an Effect, is refused."""
    message = definition_error([{"name": "x"}, tool(effect="mutating")])  # type: ignore[arg-type]
    assert "tools[0]: is a dict, not a Tool" in message
    assert "tools[1] 'look': effect must be an Effect, got str" in message


@pytest.mark.parametrize("timeout_s", [0, -1, math.nan, math.inf, 600.5, True, "5"])
def test_bad_timeouts_are_refused(timeout_s: Any) -> None:
    """timeout_s must be None or a positive finite number of at most 600 seconds."""
    assert "timeout_s must be None or a number" in definition_error([tool(timeout_s=timeout_s)])


def test_oversized_description_is_refused() -> None:
    """The description's UTF-8 size (not its length in characters) is bounded."""
    config = ToolLoopConfig(max_description_bytes=10)
    assert len(ToolRegistry.build([tool(description="é" * 5)], config)) == 1
    message = definition_error([tool(description="é" * 6)], config)
    assert "description is 12 bytes, more than max_description_bytes (10)" in message


@pytest.mark.parametrize("description", [None, 5, "\ud800"])
def test_bad_descriptions_are_refused(description: Any) -> None:
    """A description must be a str that encodes to UTF-8."""
    assert "description" in definition_error([tool(description=description)])


def test_oversized_schema_is_refused() -> None:
    """The serialised size of the parameters schema is bounded by max_schema_bytes."""
    config = ToolLoopConfig(max_schema_bytes=100)
    schema = with_property({"description": "d" * 100})
    assert "more than max_schema_bytes (100)" in definition_error([tool("t", schema)], config)


@pytest.mark.parametrize(
    "schema",
    [{}, {"type": "array"}, {"type": ["object", "null"]}, {"properties": {}}],
)
def test_top_level_type_must_be_object(schema: dict[str, Any]) -> None:
    """Tool arguments are a JSON object, so the schema must say "type": "object"."""
    message = definition_error([tool("t", schema)])
    assert 'must have "type": "object" at the top level' in message


@pytest.mark.parametrize("parameters", [None, [], "object"])
def test_parameters_must_be_a_mapping(parameters: Any) -> None:
    """A schema that is not a mapping is refused."""
    bad = Tool("t", "d", parameters, Effect.READ_ONLY)
    assert "parameters must be a JSON object" in definition_error([bad])


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "object", "properties": 5}, "parameters/properties"),
        ({"type": "object", "required": "x"}, "parameters/required"),
        (with_property({"minimum": "zero"}), "parameters/properties/a/minimum"),
        (
            {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "items": 5},
            "parameters/items",
        ),
    ],
)
def test_meta_schema_invalid_schemas_are_refused(schema: dict[str, Any], where: str) -> None:
    """A schema that fails its draft's meta-schema is refused, with the path of the fault."""
    message = definition_error([tool("t", schema)])
    assert f"{where} do not conform to the JSON Schema meta-schema" in message


@pytest.mark.parametrize(
    "schema",
    [
        with_property({"type": "string", "pattern": "("}),
        with_property({"type": "array", "items": {"pattern": "[z-a]"}}),
        {"type": "object", "patternProperties": {"(": {}}},
        {"type": "object", "$defs": {"unused": {"pattern": "("}}},
        {"type": "object", "if": {"pattern": "("}},
    ],
)
def test_invalid_regex_patterns_are_refused(schema: dict[str, Any]) -> None:
    """A bad pattern is refused even where the compiled validator would never look."""
    assert "is not a valid regular expression" in definition_error([tool("t", schema)])


@pytest.mark.parametrize("pattern", ["^\\p{L}+$", "(?<name>a)", "(?=a)a", "^[a-z]{1,8}$"])
def test_valid_ecma_patterns_are_accepted(pattern: str) -> None:
    """Patterns are judged by the validator's own regex dialect, not Python's ``re``."""
    schema = {"type": "object", "patternProperties": {pattern: {"pattern": pattern}}}
    assert len(ToolRegistry.build([tool("t", schema)], CONFIG)) == 1


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({1, 2}, "values of type set are not JSON"),
        (math.nan, "nan is not a JSON number"),
        (math.inf, "inf is not a JSON number"),
        (b"bytes", "values of type bytes are not JSON"),
        (object(), "values of type object are not JSON"),
        ({1: "a"}, "key '1' is not a str"),
        ("\udcff", "a string contains a lone surrogate"),
    ],
)
def test_non_json_values_are_refused(value: Any, problem: str) -> None:
    """Values with no exact JSON form (msgspec would silently turn NaN into null) are refused."""
    message = definition_error([tool("t", with_property({"default": value}))])
    assert f"parameters/properties/a/default: {problem}" in message


def test_deep_and_cyclic_schemas_are_refused_without_recursion_errors() -> None:
    """Nesting is bounded, so a deep or self-containing mapping is a problem, not a crash."""
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"type": "object", "properties": {"a": deep}}
    cyclic: dict[str, Any] = {"type": "object", "properties": {}}
    cyclic["properties"]["a"] = cyclic
    message = definition_error([tool("deep", deep), tool("cyclic", cyclic)])
    assert message.count(f"nested more than {MAX_SCHEMA_DEPTH} levels deep") == 2


def test_unknown_schema_draft_is_refused_without_fetching() -> None:
    """A $schema naming no supported draft is refused, and its meta-schema is never fetched."""
    with recorder() as rec:
        meta_url = f"http://127.0.0.1:{rec.port}/meta.json"
        message = definition_error([tool("t", {"$schema": meta_url, "type": "object"})])
        draft3 = {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object"}
        assert "is not a draft" in definition_error([tool("t", draft3)])
        assert rec.finish() == 0
    assert "meta-schemas are never fetched" in message


# --- registration: references never touch the network or the file system --------------------


@pytest.mark.parametrize(
    "schema",
    [
        with_property({"$ref": "http://127.0.0.1:9/schema.json"}),
        with_property({"$ref": "https://example.com/schema.json#/$defs/x"}),
        with_property({"$ref": "file:///etc/passwd"}),
        with_property({"$ref": "other.json#/x"}),
        with_property({"$ref": "urn:example:thing"}),
        with_property({"$dynamicRef": "https://example.com/meta#node"}),
        with_property({"$recursiveRef": "https://example.com/x"}),
        {"type": "object", "$defs": {"a": {"$ref": "https://example.com/s.json"}}},
        {"type": "object", "x-vendor": {"nested": [{"$ref": "https://example.com/s.json"}]}},
        {"$id": "https://example.com/base/", "type": "object", "properties": {"a": {"$ref": "s"}}},
    ],
)
def test_non_local_references_are_refused(schema: dict[str, Any]) -> None:
    """Only '#...' references are allowed: anything else could fetch or read a file."""
    message = definition_error([tool("t", schema)])
    assert "is not local" in message
    assert NETWORK_RULE in message


def test_remote_reference_is_not_fetched() -> None:
    """A $ref to a live loopback listener is refused, and no connection ever arrives."""
    with recorder() as rec:
        url = f"http://127.0.0.1:{rec.port}/schema.json"
        message = definition_error([tool("t", with_property({"$ref": url}))])
        base = {
            "$id": f"http://127.0.0.1:{rec.port}/base/",
            "type": "object",
            "properties": {"a": {"$ref": "schema.json"}},
        }
        assert NETWORK_RULE in definition_error([tool("t", base)])
        assert rec.finish() == 0
    assert NETWORK_RULE in message


def test_connection_recorder_sees_a_real_connection() -> None:
    """Control for the no-fetch tests: the recorder does notice a connection when one is made."""
    with recorder() as rec:
        socket.create_connection(("127.0.0.1", rec.port), timeout=1).close()
        assert rec.finish() == 1


def test_compiler_refuses_retrieval_even_past_the_walk() -> None:
    """Defence in depth: the compiler itself refuses http(s) and file references."""
    with recorder() as rec:
        remote = with_property({"$ref": f"http://127.0.0.1:{rec.port}/schema.json"})
        with pytest.raises(ValueError, match="refused to retrieve"):
            _compile(remote)
        assert rec.finish() == 0


def test_file_reference_to_an_existing_file_is_not_read(tmp_path: Path) -> None:
    """A file: $ref to a readable schema file is refused by the walk and by the compiler."""
    target = tmp_path / "integer.json"
    target.write_text('{"type": "integer"}', encoding="utf-8")
    schema = with_property({"$ref": target.as_uri()})
    # Control: left to its defaults, jsonschema_rs reads the file and applies it.
    assert not jsonschema_rs.validator_for(schema).is_valid({"a": "text"})
    assert NETWORK_RULE in definition_error([tool("t", schema)])
    with pytest.raises(ValueError, match="refused to retrieve"):
        _compile(schema)


def test_meta_schema_check_is_offline() -> None:
    """Defence in depth: the meta-schema check refuses an unknown $schema without fetching."""
    with recorder() as rec:
        problem = _meta_problem({"$schema": f"http://127.0.0.1:{rec.port}/m", "type": "object"})
        assert rec.finish() == 0
    assert problem is not None
    assert "meta-schemas are never fetched" in problem


def test_local_references_work() -> None:
    """'#/$defs/x', '#anchor' and local refs under a remote $id resolve, with no fetch."""
    with recorder() as rec:
        schema = {
            "$id": f"http://127.0.0.1:{rec.port}/tools/move.json",
            "type": "object",
            "$defs": {
                "coord": {"type": "integer"},
                "name": {"$anchor": "name", "type": "string"},
            },
            "properties": {"x": {"$ref": "#/$defs/coord"}, "who": {"$ref": "#name"}},
        }
        reg = ToolRegistry.build([tool("move", schema)], CONFIG)
        assert rec.finish() == 0
    good = ToolCall.create("c", "move", '{"x": 3, "who": "ann"}')
    bad = ToolCall.create("c", "move", '{"x": "3", "who": 4}')
    assert isinstance(check_call(reg, good, max_observation_bytes=LIMIT), ValidatedCall)
    result = check_call(reg, bad, max_observation_bytes=LIMIT)
    assert isinstance(result, Rejection)
    assert "at /x:" in result.observation
    assert "at /who:" in result.observation


def test_dangling_local_reference_is_refused() -> None:
    """A local reference to nothing fails compilation at registration, not at call time."""
    message = definition_error([tool("t", with_property({"$ref": "#/$defs/missing"}))])
    assert "parameters do not compile" in message


def test_format_is_an_annotation_in_every_draft() -> None:
    """'format' is not asserted, in draft 2020-12 or in draft 7 (one rule for all drafts)."""
    schemas = [
        with_property({"type": "string", "format": "email"}),
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            **with_property({"format": "email"}),
        },
    ]
    for schema in schemas:
        reg = ToolRegistry.build([tool("t", schema)], CONFIG)
        call = ToolCall.create("c", "t", '{"a": "not an email"}')
        assert isinstance(check_call(reg, call, max_observation_bytes=LIMIT), ValidatedCall)


# --- registration: every problem at once ---------------------------------------------------


def test_all_problems_are_reported_at_once() -> None:
    """One error names every tool and every problem, so one fix-up round is enough."""
    tools = [
        tool("a b"),
        tool("ok", {"type": "object", "properties": 5}, timeout_s=0),
        tool("remote", with_property({"$ref": "https://example.com/x.json", "pattern": "("})),
        tool("ok", description=5),  # type: ignore[arg-type]
    ]
    message = definition_error(tools)
    assert message.startswith("invalid tool definitions (7 problems): ")
    for expected in [
        "tools[0] 'a b': name must be",
        "tools[1] 'ok': parameters/properties do not conform",
        "tools[1] 'ok': timeout_s must be",
        "tools[2] 'remote': parameters/properties/a/$ref: $ref 'https://example.com/x.json'",
        "tools[2] 'remote': parameters/properties/a/pattern: '(' is not a valid regular",
        "tools[3] 'ok': name duplicates tools[1]",
        "tools[3] 'ok': description must be a str, got int",
    ]:
        assert expected in message


def test_problem_list_is_bounded() -> None:
    """Past the first few problems the message counts the rest instead of listing them."""
    tools = [tool(f"bad name {i}" + "x" * 500) for i in range(MAX_REPORTED_PROBLEMS + 5)]
    message = definition_error(tools, ToolLoopConfig(max_tools=256))
    assert "(25 problems)" in message
    assert message.endswith("; and 5 more")
    assert message.count("name must be") == MAX_REPORTED_PROBLEMS
    assert len(message) < 200 * MAX_REPORTED_PROBLEMS


# --- call checking -----------------------------------------------------------------------------


def test_valid_call_becomes_a_validated_call() -> None:
    """A known tool with schema-valid object arguments yields its decoded arguments and effect."""
    result = check('{"x": 3, "y": -4, "run": true, "tag": "éa"}')
    assert result == ValidatedCall(
        id="call_1",
        name="move",
        arguments={"x": 3, "y": -4, "run": True, "tag": "éa"},
        effect=Effect.MUTATING,
    )


def test_unknown_tool_lists_available_names() -> None:
    """The model is told which tools exist, so it can correct the name."""
    result = rejected("{}", name="jump")
    assert result.reason == "unknown_tool"
    assert result.observation == "unknown tool 'jump'; the available tools are: move, look"


def test_unknown_tool_list_is_bounded() -> None:
    """Only the first names are listed; the rest are counted."""
    count = MAX_LISTED_TOOLS + 8
    reg = ToolRegistry.build([tool(f"t{i}") for i in range(count)], CONFIG)
    call = ToolCall.create("c", "x" * 1000, "{}")
    result = check_call(reg, call, max_observation_bytes=8192)
    assert isinstance(result, Rejection)
    assert result.reason == "unknown_tool"
    assert f"t{MAX_LISTED_TOOLS - 1}, and 8 more" in result.observation
    assert f"t{MAX_LISTED_TOOLS}," not in result.observation
    assert "x" * 100 not in result.observation


def test_unknown_tool_with_no_tools() -> None:
    """An empty registry says so instead of listing nothing."""
    reg = ToolRegistry.build([], CONFIG)
    result = check_call(reg, ToolCall.create("c", "look", "{}"), max_observation_bytes=LIMIT)
    assert result == Rejection("unknown tool 'look': no tools are available", "unknown_tool")


@pytest.mark.parametrize("arguments", ['{"x": 1,,}', "{", "{'x': 1}", '{"x": 1} trailing', "nul"])
def test_malformed_json_is_rejected_with_a_position_hint(arguments: str) -> None:
    """Malformed arguments are rejected, saying they must be a JSON object and where it broke."""
    result = rejected(arguments)
    assert result.reason == "malformed_json"
    assert "they must be one JSON object" in result.observation
    assert "byte" in result.observation or "truncated" in result.observation


def test_empty_and_non_utf8_arguments_are_malformed() -> None:
    """Empty arguments and lone surrogates are malformed JSON, never an exception."""
    assert rejected("").reason == "malformed_json"
    assert "the arguments are empty" in rejected("  ").observation
    assert rejected('{"x": "\ud800"}').reason == "malformed_json"


@pytest.mark.parametrize(
    ("arguments", "name", "key"),
    [
        ('{"x": 21, "y": 20, "x": 63, "y": 63}', "move", "x"),
        ('{"x": 21, "y": 20, "\\u0078": 63, "\\u0079": 63}', "move", "x"),
        ("{" + '"x": 21, ' * 260 + '"x": 63, "y": 63}', "move", "x"),
        ('{"x": 1, "y": 2, "tag": "a", "t\\u0061g": "b"}', "move", "tag"),
        ('{"a": {"b": {"c": 1, "c": 2}}}', "look", "c"),
        ('{"a": [1, {"k": 1}, [{"k": 1, "j": 2, "k": 3}]]}', "look", "k"),
        ('{"note": "meet at 12:30", "at": "{\\"q\\": 1}", "note": "x"}', "look", "note"),
        ('{"a:b": 1, "a": 2, "a:b": 3}', "look", "a:b"),
        ('{"é": 1, "\\u00e9": 2}', "look", "é"),
    ],
)
def test_a_key_repeated_in_one_object_is_rejected_at_any_depth(
    arguments: str, name: str, key: str
) -> None:
    """Duplicate keys, also equal only after escapes, are refused, never resolved silently.

    A decoder keeps the last value while a reader (or an approval prompt) may see the
    first: the call is ambiguous, so it never reaches approval or the executor.
    """
    result = rejected(arguments, name=name)
    assert result == Rejection(
        f"the arguments for {name} repeat the key {key!r} within one object; each key may "
        "appear only once: send them again as one JSON object without the repeated key",
        "duplicate_key",
    )


@pytest.mark.parametrize(
    "arguments",
    [
        '{"a": {"k": 1}, "b": {"k": 2}}',
        '{"k": {"k": {"k": 1}}}',
        '{"items": [{"k": 1}, {"k": 2}], "k": [{}, {}]}',
        '{"time": "12:30", "url": "http://h:80/"}',
        '{"text": "{\\"k\\": 1, \\"k\\": 2}", "k": "a\\":\\\\"}',
        '{"a:b": 1, "a": 2, "b": {"a:b": {}}}',
        '{"\\u00e9": 1, "e\\u0301": 2}',
        "{}",
    ],
)
def test_the_same_key_in_different_objects_or_inside_strings_is_not_a_repeat(
    arguments: str,
) -> None:
    """No false positive: sibling and nested objects, colons, braces and keys inside strings."""
    result = check(arguments, name="look")
    assert result == ValidatedCall("call_1", "look", json.loads(arguments), Effect.READ_ONLY)


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [("[1, 2]", "an array"), ("3.5", "a number"), ('"x"', "a string"), ("null", "null"),
     ("true", "a boolean")],
)  # fmt: skip
def test_non_object_arguments_are_rejected(arguments: str, kind: str) -> None:
    """Valid JSON that is not an object is 'not_an_object', naming what it was."""
    result = rejected(arguments)
    assert result.reason == "not_an_object"
    assert f"must be a JSON object ({{...}}), got {kind}" in result.observation


def test_schema_mismatch_shows_paths() -> None:
    """Each reported error carries its instance path (JSON Pointer) and message."""
    result = rejected('{"x": "3", "y": 1000}')
    assert result.reason == "schema_mismatch"
    assert result.observation == (
        "the arguments for move do not match its parameters schema:\n"
        '- at /x: "3" is not of type "integer"\n'
        "- at /y: 1000 is greater than the maximum of 100"
    )


def test_schema_mismatch_reports_at_most_a_few_errors() -> None:
    """Past the first few errors the rest are counted; the root is named '(root)'."""
    schema = {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}}},
        "required": ["ids", "why"],
    }
    reg = ToolRegistry.build([tool("pick", schema)], CONFIG)
    call = ToolCall.create("c", "pick", '{"ids": ["a", "b", "c", "d", "e", "f", "g", "h"]}')
    result = check_call(reg, call, max_observation_bytes=LIMIT)
    assert isinstance(result, Rejection)
    assert result.reason == "schema_mismatch"
    lines = result.observation.split("\n")
    assert len(lines) == 1 + MAX_REPORTED_ERRORS + 1
    assert lines == [
        "the arguments for pick do not match its parameters schema:",
        '- at (root): "why" is a required property',
        '- at /ids/0: "a" is not of type "integer"',
        '- at /ids/1: "b" is not of type "integer"',
        "- and 6 more errors",
    ]


def test_huge_argument_values_produce_a_bounded_observation() -> None:
    """A huge value is never echoed in full; the observation is cut with a marker."""
    huge = "q" * 60_000
    for limit in (64, 300, 8192):
        result = rejected(f'{{"x": "{huge}", "y": 1}}', limit=limit)
        assert result.reason == "schema_mismatch"
        assert "q" * 250 not in result.observation
    small = rejected(f'{{"x": "{huge}", "y": 1}}', limit=64)
    assert small.observation.endswith(TRUNCATION_MARKER)


def test_huge_malformed_arguments_are_bounded() -> None:
    """Malformed arguments are quoted only as a short excerpt near the error."""
    result = rejected('{"x": ' + "9" * 50_000 + "z}")
    assert result.reason == "malformed_json"
    assert "9" * 100 not in result.observation


def test_oversized_arguments_are_rejected_before_decoding() -> None:
    """Arguments above max_argument_bytes are 'oversized' (counted in UTF-8 bytes)."""
    reg = registry()
    big = ToolCall.create("c", "move", '{"x": 1, "y": 2, "tag": "' + "é" * 30 + '"}')
    result = check_call(reg, big, max_observation_bytes=LIMIT, max_argument_bytes=60)
    assert isinstance(result, Rejection)
    assert result.reason == "oversized"
    huge = ToolCall.create("c", "move", " " * (DEFAULT_MAX_ARGUMENT_BYTES + 1))
    result = check_call(reg, huge, max_observation_bytes=LIMIT)
    assert isinstance(result, Rejection)
    assert result.reason == "oversized"


@pytest.mark.parametrize("depth", [MAX_ARGUMENT_DEPTH + 1, 5000])
def test_deeply_nested_arguments_are_oversized(depth: int) -> None:
    """Nesting beyond the bound is refused, including depths that would exhaust the stack."""
    nested = "[" * (depth - 1) + "]" * (depth - 1)
    result = rejected(f'{{"x": 1, "y": 2, "deep": {nested}}}', name="look")
    assert result.reason == "oversized"
    assert f"nested more than {MAX_ARGUMENT_DEPTH} levels deep" in result.observation


def test_nesting_at_the_bound_is_accepted() -> None:
    """Exactly MAX_ARGUMENT_DEPTH levels is fine."""
    nested = "[" * (MAX_ARGUMENT_DEPTH - 1) + "]" * (MAX_ARGUMENT_DEPTH - 1)
    assert isinstance(check(f'{{"deep": {nested}}}', name="look"), ValidatedCall)


def test_limits_must_be_positive() -> None:
    """A non-positive byte limit is a programming error, reported at once."""
    call = ToolCall.create("c", "look", "{}")
    with pytest.raises(ValueError, match="must be positive"):
        check_call(registry(), call, max_observation_bytes=0)


# --- property -----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["x", "y", "run", "tag", "zz"]) | st.text(max_size=5),
                      children, max_size=5),
    max_leaves=20,
)  # fmt: skip
json_texts = json_values.map(lambda v: msgspec.json.encode(v).decode("utf-8"))
any_text = st.text(st.characters(exclude_categories=()), max_size=60)  # surrogates too
arguments = st.one_of(st.text(max_size=200), any_text, json_texts, json_texts.map(lambda t: t[:-1]))
names = st.sampled_from(["move", "look"]) | st.text(
    st.characters(exclude_categories=()), min_size=1, max_size=80
)
PROPERTY_REGISTRY = registry()


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(arguments=arguments, name=names, limit=st.integers(min_value=1, max_value=1024))
def test_check_call_never_raises_and_stays_bounded(arguments: str, name: str, limit: int) -> None:
    """For any arguments text, the result is a ValidatedCall or a Rejection within the bound."""
    call = ToolCall.create("c", name, arguments)
    result = check_call(PROPERTY_REGISTRY, call, max_observation_bytes=limit)
    if isinstance(result, ValidatedCall):
        assert result.name in ("move", "look")
        assert isinstance(result.arguments, dict)
    else:
        assert isinstance(result, Rejection)
        assert len(result.observation.encode("utf-8")) <= limit


# A JSON text as a tree that keeps every pair of every object, repeats included:
# ("object", [(key, escape_the_key, child), ...]) or ("array", [child, ...]) or a scalar.
tricky_keys = st.sampled_from(["k", "x", "a:b", "{", '"', "\\", "é", ""])
scalars = st.none() | st.integers() | st.text(':{}[],"\\ké', max_size=6)
trees = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3).map(lambda items: ("array", items))
        | st.lists(st.tuples(tricky_keys, st.booleans(), children), max_size=4).map(
            lambda pairs: ("object", pairs)
        )
    ),
    max_leaves=16,
)
root_objects = st.lists(st.tuples(tricky_keys, st.booleans(), trees), max_size=5).map(
    lambda pairs: ("object", pairs)
)


def render(node: Any) -> str:
    """The JSON text of a tree; an escaped key spells every character as ``\\uXXXX``."""
    if isinstance(node, tuple) and node[0] == "array":
        return "[" + ", ".join(render(child) for child in node[1]) + "]"
    if isinstance(node, tuple):
        pairs = []
        for key, escaped, child in node[1]:
            name = '"' + "".join(f"\\u{ord(c):04x}" for c in key) + '"'
            pairs.append(f"{name if escaped else json.dumps(key)}: {render(child)}")
        return "{" + ", ".join(pairs) + "}"
    return json.dumps(node)


def repeats(node: Any) -> bool:
    """Whether some object of the tree has the same key twice."""
    if isinstance(node, tuple) and node[0] == "array":
        return any(repeats(child) for child in node[1])
    if isinstance(node, tuple):
        keys = [key for key, _, _ in node[1]]
        return len(set(keys)) < len(keys) or any(repeats(child) for _, _, child in node[1])
    return False


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(tree=root_objects)
def test_repeated_keys_are_found_exactly(tree: Any) -> None:
    """A call is refused as ``duplicate_key`` exactly when some object repeats a key.

    Keys and strings full of colons, braces, quotes and backslashes, and keys spelled with
    escapes, neither hide a repeat nor invent one.
    """
    text = render(tree)
    call = ToolCall.create("c", "look", text)
    result = check_call(PROPERTY_REGISTRY, call, max_observation_bytes=LIMIT)
    refused = isinstance(result, Rejection) and result.reason == "duplicate_key"
    assert refused == repeats(tree)
    if not refused:
        assert result == ValidatedCall("c", "look", json.loads(text), Effect.READ_ONLY)


def test_a_huge_mismatch_is_reported_by_its_first_error_without_listing_the_rest() -> None:
    """Large arguments that break the schema everywhere cost one error, not millions.

    jsonschema_rs computes every error before yielding the first; for a megabyte of wrong
    items that took seconds and hundreds of MiB, blocking the event loop.
    """
    reg = ToolRegistry.build(
        [tool("t", with_property({"type": "array", "items": {"type": "string"}}))], CONFIG
    )
    arguments = msgspec.json.encode({"a": [1] * 300_000}).decode()
    result = check_call(reg, ToolCall.create("c", "t", arguments), max_observation_bytes=LIMIT)
    assert isinstance(result, Rejection)
    assert result.reason == "schema_mismatch"
    assert "at /a/0" in result.observation
    assert "not listed" in result.observation
