"""Edges of tool registration and call checking that the schema tests do not pin.

Each test holds one boundary or one piece of a rejection's text exactly: what the model
is told when a call is refused, and what an operator is told when a tool is refused, are
the library's only way to explain itself, so a change to either must be deliberate.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Final

import pytest

import metacrate_grid_agent._core._check as check_module
from metacrate_grid_agent._core._check import (
    MAX_ARGUMENT_DEPTH,
    MAX_LISTED_TOOLS,
    Rejection,
    check_call,
)
from metacrate_grid_agent._core._redact import TRUNCATION_MARKER, bounded_text
from metacrate_grid_agent._core._schema import (
    MAX_REPORTED_PROBLEMS,
    MAX_SCHEMA_DEPTH,
    ToolRegistry,
    error_detail,
    json_pointer,
    quoted_excerpt,
    validate_tools,
)
from metacrate_grid_agent._core._tools import Effect, Tool, ValidatedCall
from metacrate_grid_agent._core._types import ToolCall
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import ToolDefinitionError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

CONFIG: Final = ToolLoopConfig()
LIST_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string"}}},
}


def registry(parameters: Mapping[str, Any] = LIST_SCHEMA, name: str = "t") -> ToolRegistry:
    """A registry of one read-only tool with these parameters."""
    return ToolRegistry.build([Tool(name, "d", parameters, Effect.READ_ONLY)], CONFIG)


def problems(parameters: Any, config: ToolLoopConfig = CONFIG) -> str:
    """The message registering one tool with these parameters fails with."""
    with pytest.raises(ToolDefinitionError) as caught:
        ToolRegistry.build([Tool("t", "d", parameters, Effect.READ_ONLY)], config)
    return str(caught.value)


def check(arguments: str, *, observation: int = 4096, **limits: int) -> ValidatedCall | Rejection:
    """Check a call of tool ``t`` with these raw arguments."""
    call = ToolCall.create("c1", "t", arguments)
    return check_call(registry(), call, max_observation_bytes=observation, **limits)


def observation(arguments: str, **limits: int) -> str:
    """The observation of a call that must be rejected."""
    result = check(arguments, **limits)
    assert isinstance(result, Rejection), result
    return result.observation


def _nested(depth: int, opening: str = '{"a":', closing: str = "}") -> str:
    return opening * (depth - 1) + "{}" + closing * (depth - 1)


# --- call checking ---------------------------------------------------------------------------


def test_limits_must_be_positive_and_one_byte_is_allowed() -> None:
    """A zero limit is a programming error; a limit of one byte is a (strict) limit."""
    with pytest.raises(ValueError, match=r"^max_observation_bytes and max_argument_bytes must"):
        check("{}", max_argument_bytes=0)
    assert observation("{}", max_argument_bytes=1) == (
        "the arguments for t are larger than 1 bytes; send a smaller JSON object"
    )


def test_arguments_of_exactly_the_limit_pass() -> None:
    """The argument limit is inclusive, in characters and in UTF-8 bytes."""
    assert isinstance(check("{}", max_argument_bytes=2), ValidatedCall)
    text = '{"items": ["é"]}'
    assert isinstance(check(text, max_argument_bytes=len(text.encode())), ValidatedCall)
    assert observation(text, max_argument_bytes=len(text.encode()) - 1).startswith(
        "the arguments for t are larger than"
    )


def test_a_lone_surrogate_is_named() -> None:
    """Arguments that are not UTF-8 are malformed JSON, and the model is told why."""
    assert observation('{"items": ["\ud800"]}') == (
        "the arguments for t are not valid JSON: they contain a lone surrogate (not UTF-8); "
        "send the arguments as one JSON object, for example {}"
    )


def test_nesting_is_allowed_to_exactly_the_depth_limit() -> None:
    """Arguments nested exactly MAX_ARGUMENT_DEPTH deep pass; one more level is refused."""
    assert isinstance(check(_nested(MAX_ARGUMENT_DEPTH)), ValidatedCall)
    assert observation(_nested(MAX_ARGUMENT_DEPTH + 1)) == (
        f"the arguments for t are nested more than {MAX_ARGUMENT_DEPTH} levels deep; "
        "send a flatter JSON object"
    )


def test_nesting_at_the_limit_beside_another_container_is_walked_and_passes() -> None:
    """With more containers than MAX_ARGUMENT_DEPTH (so the nesting is walked, not ruled
    out by the bracket count), arguments exactly MAX_ARGUMENT_DEPTH deep still pass: the
    walk counts the outer object as level one and each container one level more."""
    deep = '{"b": {}, "a":' + _nested(MAX_ARGUMENT_DEPTH - 1) + "}"
    assert deep.count("{") > MAX_ARGUMENT_DEPTH
    assert isinstance(check(deep), ValidatedCall)


def test_nesting_past_the_decoders_own_limit_is_named_as_too_deep() -> None:
    """Arguments nested so deep that the JSON decoder gives up (its recursion limit) are
    refused as oversized with the same words, naming the tool, as any too-deep call."""
    depth = 100_000
    assert observation('{"a":' + "[" * depth + "]" * depth + "}") == (
        f"the arguments for t are nested more than {MAX_ARGUMENT_DEPTH} levels deep; "
        "send a flatter JSON object"
    )


def test_arguments_over_the_limit_only_in_utf8_bytes_name_the_limit() -> None:
    """Arguments within the limit in characters but over it in UTF-8 bytes are refused
    with the limit itself in the observation."""
    text = '{"items": ["é"]}'
    limit = len(text.encode()) - 1
    assert len(text) <= limit
    assert observation(text, max_argument_bytes=limit) == (
        f"the arguments for t are larger than {limit} bytes; send a smaller JSON object"
    )


def test_a_cut_observation_ends_with_the_marker_and_no_space_before_it() -> None:
    """A rejection cut to ``max_observation_bytes`` ends with the truncation marker right
    after the text kept (no space before it): every byte of the bound but the marker's
    holds the observation."""
    kept = 5
    result = check("[]", observation=len(TRUNCATION_MARKER.encode()) + kept)
    assert isinstance(result, Rejection)
    assert result.observation == "the a" + TRUNCATION_MARKER


def test_many_brackets_with_shallow_nesting_are_valid() -> None:
    """More than MAX_ARGUMENT_DEPTH brackets in total, but shallow: the call is valid."""
    shallow = json.dumps({"other": [[] for _ in range(3 * MAX_ARGUMENT_DEPTH)]})
    assert isinstance(check(shallow), ValidatedCall)


def test_malformed_arguments_quote_the_bytes_around_the_error() -> None:
    """The observation names the tool and quotes up to 16 bytes either side of the error."""
    assert observation('{"items": 5,, "x": 12345678901234567890123}') == (
        "the arguments for t are not valid JSON (JSON is malformed: object keys must be "
        'strings (byte 12), near \'{"items": 5,, "x": 123456789\'); they must be one JSON '
        "object, for example {}"
    )
    assert observation('{"items": ["abcdefghijklmnop"],, "x": 12345678901234567890123}') == (
        "the arguments for t are not valid JSON (JSON is malformed: object keys must be "
        'strings (byte 31), near \'defghijklmnop"],, "x": 123456789\'); they must be '
        "one JSON object, for example {}"
    )


def test_blank_arguments_are_called_empty() -> None:
    """Whitespace only: the model is told the arguments are empty."""
    assert observation("   ") == (
        "the arguments for t are not valid JSON (the arguments are empty); they must be one "
        "JSON object, for example {}"
    )


def test_schema_errors_are_listed_then_counted() -> None:
    """Three errors spelled out, the rest counted: one more, several more, at least 1000."""
    one_more = observation(json.dumps({"items": [1, 2, 3, 4]}))
    assert one_more.endswith('- at /items/2: 3 is not of type "string"\n- and 1 more error')
    assert observation(json.dumps({"items": [1] * 5})).endswith("- and 2 more errors")
    assert observation(json.dumps({"items": [1] * 1100})).endswith(
        "- and at least 1000 more errors"
    )
    assert observation(json.dumps({"items": [1] * 1003})).endswith(
        "- and at least 1000 more errors"
    )
    assert observation(json.dumps({"items": [1] * 1002})).endswith("- and 999 more errors")
    assert observation(json.dumps({"items": [1, 2, 3]})).endswith(
        '- at /items/2: 3 is not of type "string"'
    )


def test_large_arguments_report_their_first_error_only() -> None:
    """Above 4096 bytes only the first error is listed; exactly 4096 still lists several."""
    base = json.dumps({"items": [1, 2]})
    exact = base[:-1] + " " * (4096 - len(base)) + "}"
    assert len(exact.encode()) == 4096
    assert observation(exact).endswith('- at /items/1: 2 is not of type "string"')
    large = base[:-1] + " " * (4097 - len(base)) + "}"
    assert observation(large).endswith(
        "- further errors, if any, are not listed for arguments this large"
    )


def test_unknown_tool_lists_exactly_the_cap_without_a_count() -> None:
    """With exactly MAX_LISTED_TOOLS tools all are listed and none is counted as more."""
    tools = [Tool(f"t{i}", "d", LIST_SCHEMA, Effect.READ_ONLY) for i in range(MAX_LISTED_TOOLS)]
    many = ToolRegistry.build(tools, CONFIG)
    result = check_call(many, ToolCall.create("c", "fly", "{}"), max_observation_bytes=4096)
    assert isinstance(result, Rejection)
    assert result.observation.endswith(f"t{MAX_LISTED_TOOLS - 1}")


# --- repeated keys ---------------------------------------------------------------------------


def test_a_repeat_is_looked_for_after_the_depth_check_and_before_the_schema() -> None:
    """Too deep wins over a repeat; a repeat wins over a schema error, whichever value is last.

    The depth check first keeps the second parse within :data:`MAX_ARGUMENT_DEPTH`.
    """
    deepest = (
        '{"a":' * (MAX_ARGUMENT_DEPTH - 1) + '{"b": 1, "b": 2}' + "}" * (MAX_ARGUMENT_DEPTH - 1)
    )
    repeated_b = (
        "the arguments for t repeat the key 'b' within one object; each key may appear only "
        "once: send them again as one JSON object without the repeated key"
    )
    assert observation(deepest) == repeated_b
    assert observation('{"a":' + deepest + "}").startswith("the arguments for t are nested more")
    assert check('{"items": 1, "items": ["a"]}') == check('{"items": ["a"], "items": 1}')
    assert observation('{"items": ["a"], "items": 1}') == repeated_b.replace("'b'", "'items'")


def test_a_repeated_key_is_quoted_as_a_short_excerpt() -> None:
    """The repeated key reaches the model escaped and cut like any text it wrote."""
    key = "\x1b" + "k" * 100
    text = json.dumps({"items": []})[:-1] + f", {json.dumps(key)}: 1, {json.dumps(key)}: 2}}"
    assert observation(text).startswith(
        f"the arguments for t repeat the key {key[:64]!r}… within one object;"
    )


class Calls:
    """Wraps a function and counts its calls."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.count = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return self.function(*args, **kwargs)


@pytest.mark.parametrize(
    ("arguments", "walks", "parses"),
    [
        ('{"items": ["a", "b"]}', 0, 0),
        ('{"a": {}, "items": []}', 0, 0),
        ('{"items": ["12:30"], "a:b": 1}', 1, 0),
        ('{"a": {"b": 1}}', 1, 0),
        ('{"a": [{"k": "1:"}, [{"k": 2}]], "b": {"k:": {}}}', 1, 0),
        ('{"items": ["\\u003a"], "x": "a:b"}', 0, 1),
        ('{"items": ["\\u003A"], "x": "a:b"}', 0, 1),
    ],
)
def test_repeats_are_ruled_out_by_the_cheapest_check_that_can(
    monkeypatch: pytest.MonkeyPatch, arguments: str, walks: int, parses: int
) -> None:
    """The hot path stays cheap: one object and no colon in a string costs a byte count.

    Otherwise a walk of the decoded value accounts for every colon (kept keys, colons in
    kept strings); only a colon spelled as an escape costs a second parse of the text.
    """
    walk = Calls(check_module._accounted_colons)
    parse = Calls(json.loads)
    monkeypatch.setattr(check_module, "_accounted_colons", walk)
    monkeypatch.setattr(check_module, "json", SimpleNamespace(loads=parse))
    assert check(arguments) == ValidatedCall("c1", "t", json.loads(arguments), Effect.READ_ONLY)
    assert (walk.count, parse.count) == (walks, parses)


@pytest.mark.parametrize("escape", ["\\u003a", "\\u003A"])
def test_a_colon_spelled_as_an_escape_cannot_hide_a_repeat(escape: str) -> None:
    """The decoded colon of a kept string must not stand in for a dropped pair's colon."""
    assert observation(f'{{"items": 1, "items": "{escape}"}}').startswith(
        "the arguments for t repeat the key 'items'"
    )


# --- registration ----------------------------------------------------------------------------


def test_problem_counts_are_spelled_with_their_noun() -> None:
    """One problem, two problems; beyond the cap the rest are counted."""
    one = problems({"type": "array"})
    assert one.startswith("invalid tool definitions (1 problem): ")
    assert one.endswith("""parameters must have "type": "object" at the top level, got 'array'""")
    assert problems({"properties": {}}).endswith("got nothing")
    config = ToolLoopConfig()
    bad: list[Any] = [object()] * 2
    with pytest.raises(ToolDefinitionError, match=r"^invalid tool definitions \(2 problems\)"):
        ToolRegistry.build(bad, config)
    with pytest.raises(ToolDefinitionError) as caught:
        ToolRegistry.build([object()] * MAX_REPORTED_PROBLEMS, config)  # type: ignore[list-item]
    assert "more" not in str(caught.value)
    with pytest.raises(ToolDefinitionError) as caught:
        ToolRegistry.build([object()] * (MAX_REPORTED_PROBLEMS + 1), config)  # type: ignore[list-item]
    assert str(caught.value).endswith("; and 1 more")


def test_exactly_max_tools_tools_are_accepted() -> None:
    """``max_tools`` is inclusive."""
    config = ToolLoopConfig(max_tools=2)
    tools = [Tool(f"t{i}", "d", LIST_SCHEMA, Effect.READ_ONLY) for i in range(2)]
    assert len(ToolRegistry.build(tools, config)) == 2


def test_validate_tools_uses_the_given_limits_else_the_defaults() -> None:
    """``validate_tools`` checks under ``config``'s limits, or the defaults when it is None.

    Protects: an application checking its table at start-up gets the verdict ``ToolLoop``
    would give under the same configuration, and the wire definitions it would send.
    """
    tools = [Tool(f"t{i}", "d", LIST_SCHEMA, Effect.READ_ONLY) for i in range(2)]
    definitions = validate_tools(tools)
    assert definitions == ToolRegistry.build(tools, CONFIG).definitions
    assert [definition.function.name for definition in definitions] == ["t0", "t1"]
    assert validate_tools(tools, None) == definitions
    assert validate_tools(tools, ToolLoopConfig(max_tools=2)) == definitions
    with pytest.raises(ToolDefinitionError, match="max_tools"):
        validate_tools(tools, ToolLoopConfig(max_tools=1))


def test_tools_sharing_an_invalid_name_are_not_called_duplicates() -> None:
    """An invalid name is reported once per tool, never also as a duplicate."""
    tools = [Tool("bad name", "d", LIST_SCHEMA, Effect.READ_ONLY)] * 2
    with pytest.raises(ToolDefinitionError) as caught:
        ToolRegistry.build(tools, CONFIG)
    assert "(2 problems)" in str(caught.value)
    assert "duplicates" not in str(caught.value)


def test_timeout_and_description_problems_quote_the_value() -> None:
    """A bad timeout is quoted; a description with a lone surrogate is named."""
    tool = Tool("t", "d\ud800", LIST_SCHEMA, Effect.READ_ONLY, timeout_s=-1)
    with pytest.raises(ToolDefinitionError) as caught:
        ToolRegistry.build([tool], CONFIG)
    assert "at most 600, got -1;" in str(caught.value)
    assert str(caught.value).endswith(
        "description is not valid UTF-8 (it contains a lone surrogate)"
    )


def test_parameters_of_the_wrong_type_are_named() -> None:
    """Parameters that are not a mapping name their type."""
    assert problems([1]).endswith("parameters must be a JSON object (a Mapping), got list")


def _deep_default(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth - 1):  # the schema itself is the first level
        value = [value]
    return {"type": "object", "default": value}


def test_schema_depth_is_allowed_to_exactly_the_limit_for_nested_lists() -> None:
    """Lists nested to exactly MAX_SCHEMA_DEPTH pass; one more level is refused, located."""
    assert len(registry(_deep_default(MAX_SCHEMA_DEPTH))) == 1
    message = problems(_deep_default(MAX_SCHEMA_DEPTH + 1))
    assert message.endswith(f"nested more than {MAX_SCHEMA_DEPTH} levels deep")
    assert "parameters/default/0/0/" in message


def test_schema_depth_is_allowed_to_exactly_the_limit_for_nested_objects() -> None:
    """Objects nested to exactly MAX_SCHEMA_DEPTH pass; one more level is refused."""

    def deep(depth: int) -> dict[str, Any]:
        value: Any = 1
        for _ in range(depth - 1):
            value = {"a": value}
        return {"type": "object", "default": value}

    assert len(registry(deep(MAX_SCHEMA_DEPTH))) == 1
    assert problems(deep(MAX_SCHEMA_DEPTH + 1)).endswith(
        f"nested more than {MAX_SCHEMA_DEPTH} levels deep"
    )


def test_schema_of_exactly_max_schema_bytes_is_accepted() -> None:
    """``max_schema_bytes`` is inclusive."""
    schema = {"type": "object"}
    size = len(json.dumps(schema, separators=(",", ":")))
    config = ToolLoopConfig(max_schema_bytes=size)
    assert len(ToolRegistry.build([Tool("t", "d", schema, Effect.READ_ONLY)], config)) == 1


def test_float_values_are_copied_as_floats() -> None:
    """A schema's float (a maximum, say) reaches the wire definition as the same float."""
    schema = {"type": "object", "properties": {"r": {"type": "number", "maximum": 1.5}}}
    (definition,) = registry(schema).definitions
    assert definition.function.parameters["properties"]["r"]["maximum"] == 1.5


def test_patterns_under_any_of_and_pattern_properties_are_checked() -> None:
    """An invalid pattern inside anyOf, or as a patternProperties key, is found and located."""
    any_of = {"type": "object", "anyOf": [{}, {"properties": {"a": {"pattern": "("}}}]}
    assert problems(any_of).endswith(
        "parameters/anyOf/1/properties/a/pattern: '(' is not a valid regular expression"
    )
    pattern_properties = {"type": "object", "patternProperties": {"(": {}}}
    assert problems(pattern_properties).endswith(
        "parameters/patternProperties/(: '(' is not a valid regular expression"
    )


def test_data_keywords_are_skipped_but_the_schema_after_them_is_not() -> None:
    """A pattern-like value in ``default`` is data; a real pattern after it is still checked."""
    schema = {"type": "object", "default": {"pattern": "("}, "properties": {"a": {"pattern": "("}}}
    assert problems(schema).endswith(
        "tools[0] 't': parameters/properties/a/pattern: '(' is not a valid regular expression"
    )


def test_patterns_in_vendor_extensions_are_not_schema() -> None:
    """A ``pattern`` inside an unknown keyword is not a schema keyword: nothing to check."""
    assert len(registry({"type": "object", "x-doc": {"pattern": "("}})) == 1


def test_a_non_local_reference_under_items_is_refused() -> None:
    """A remote ``$ref`` in a subschema keyword is refused at registration, located."""
    assert problems({"type": "object", "items": {"$ref": "https://evil.example/s"}}).endswith(
        "parameters/items/$ref: $ref 'https://evil.example/s' is not local (only '#...' "
        "references are allowed): schema compilation must never touch the network or the "
        "file system"
    )


def test_meta_schema_problems_are_located_and_explained() -> None:
    """A meta-schema violation names its place; an unknown draft names the $schema."""
    assert problems({"type": "object", "properties": {"a": {"type": 5}}}).endswith(
        "parameters/properties/a/type do not conform to the JSON Schema meta-schema: 5 is "
        "not valid under any of the schemas listed in the 'anyOf' keyword"
    )
    assert problems({"type": "object", "$schema": "http://example.com/custom"}).endswith(
        "parameters: $schema 'http://example.com/custom' is not a draft jsonschema_rs knows "
        "(4, 6, 7, 2019-09, 2020-12); meta-schemas are never fetched"
    )


def test_the_registry_cannot_be_changed() -> None:
    """Setting or deleting an attribute is refused, naming it."""
    built = registry()
    with pytest.raises(AttributeError, match=r"^ToolRegistry is immutable; cannot delete 'names'$"):
        del built.names


# --- text helpers ----------------------------------------------------------------------------


def _bound(text: str, limit: int) -> str:
    """``bounded_text`` as ``check_call`` applies it to a rejection's observation."""
    return bounded_text(text, limit, marker=TRUNCATION_MARKER, bare_head=True)


def test_bound_keeps_text_of_exactly_the_limit_and_cuts_cleanly() -> None:
    """Exactly ``limit`` bytes are kept; a cut drops a split character and adds the marker."""
    assert _bound("x" * 40, 40) == "x" * 40
    marker = len(TRUNCATION_MARKER.encode())
    assert _bound("x" * 100, marker) == "x" * marker
    assert _bound("é" * 20, marker + 3) == "é" + TRUNCATION_MARKER
    assert _bound("é" * 20, 3) == "é"
    assert _bound("a\ud800" * 30, 20).startswith("a?a?")
    unknown = ToolCall.create("c1", "zz", "{}")
    rejected = check_call(registry(), unknown, max_observation_bytes=marker)
    assert isinstance(rejected, Rejection)
    assert rejected.observation == "unknown tool 'zz'"[:marker]


def test_excerpt_quotes_up_to_64_characters() -> None:
    """64 characters are quoted whole; more are cut at 64 with an ellipsis."""
    assert quoted_excerpt("a" * 64) == repr("a" * 64)
    assert quoted_excerpt("a" * 65) == repr("a" * 64) + "…"


def test_detail_keeps_the_first_line_up_to_200_characters() -> None:
    """An error's first line only, cut at 200 characters with an ellipsis."""
    assert error_detail(ValueError("first\nsecond\nthird")) == "first"
    assert error_detail(ValueError("d" * 200)) == "d" * 200
    assert error_detail(ValueError("d" * 201)) == "d" * 200 + "…"


def test_pointer_escapes_tilde_and_slash() -> None:
    """JSON Pointer escaping: "~" as "~0", "/" as "~1", in that order."""
    assert json_pointer(("a/b", "c~d", 3, "~1")) == "/a~1b/c~0d/3/~01"


def test_a_schema_that_does_not_compile_is_refused_with_the_engines_reason() -> None:
    """A schema that passes its meta-schema and every pattern check and still does not
    compile (a local reference to nothing) is refused with the engine's own reason, which
    names what is missing: the operator sees which reference to mend."""
    message = problems({"type": "object", "$ref": "#/definitions/missing"})
    assert "parameters do not compile: Pointer '/definitions/missing' does not exist" in message
