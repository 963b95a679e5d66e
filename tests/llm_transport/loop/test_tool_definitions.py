"""Bad tool definitions are refused when the loop is built, before anything is sent.

``ToolLoop(...)`` raises :class:`ToolDefinitionError` naming each problem: names,
duplicates, schemas that are not objects, that break the JSON Schema meta-schema, that
hold invalid regular expressions or non-JSON values. Schema compilation never fetches
anything: a remote ``$ref`` (or ``$schema``) pointing at a second loopback endpoint is
refused, and that endpoint records no connection at all.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, cast

import msgspec
import pytest

from metacrate_grid_agent import (
    Effect,
    Outcome,
    Tool,
    ToolLoop,
    ToolLoopConfig,
    validate_tools,
)
from metacrate_grid_agent.errors import ToolDefinitionError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    LOOK,
    MOVE,
    TOOLS,
    RecordingExecutor,
    call,
    calls_reply,
    loop_config,
    make_loop,
    run_loop,
    tool_definition,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.llm_transport.conftest import ClientFactory

NAME_RULE = "name must be 1 to 64 ASCII letters, digits, '_' or '-'"
META = "do not conform to the JSON Schema meta-schema"
REGEX = "is not a valid regular expression"
TOP_OBJECT = 'parameters must have "type": "object" at the top level'


def with_parameters(parameters: Any) -> Tool:
    """``look`` with other parameters."""
    return dataclasses.replace(LOOK, parameters=parameters)


def object_with(prop: dict[str, Any]) -> dict[str, Any]:
    """An object schema with one property ``p`` of schema ``prop``."""
    return {"type": "object", "properties": {"p": prop}}


#: case id -> (tools, text the error message must contain)
BAD_DEFINITIONS: dict[str, tuple[list[Any], str]] = {
    "empty_name": ([dataclasses.replace(LOOK, name="")], NAME_RULE),
    "name_with_space": ([dataclasses.replace(LOOK, name="look around")], NAME_RULE),
    "name_too_long": ([dataclasses.replace(LOOK, name="l" * 65)], NAME_RULE),
    "name_not_ascii": ([dataclasses.replace(LOOK, name="regarder_là")], NAME_RULE),
    "name_with_dot": ([dataclasses.replace(LOOK, name="grid.look")], NAME_RULE),
    "duplicate_name": (
        [LOOK, MOVE, dataclasses.replace(MOVE, description="again")],
        "tools[2] 'move': name duplicates tools[1]",
    ),
    "array_schema": ([with_parameters({"type": "array"})], TOP_OBJECT),
    "untyped_schema": ([with_parameters({"properties": {}})], TOP_OBJECT),
    "list_parameters": ([with_parameters([])], "parameters must be a JSON object (a Mapping)"),
    "unknown_type": ([with_parameters(object_with({"type": "vector"}))], META),
    "negative_min_length": ([with_parameters(object_with({"minLength": -1}))], META),
    "required_not_array": ([with_parameters({"type": "object", "required": "x"})], META),
    "bad_pattern": ([with_parameters(object_with({"pattern": "(unclosed"}))], REGEX),
    "bad_pattern_property": (
        [with_parameters({"type": "object", "patternProperties": {"[a-": {}}})],
        REGEX,
    ),
    "bad_pattern_in_unused_defs": (
        [with_parameters({"type": "object", "$defs": {"unused": {"pattern": "a{2,1}"}}})],
        REGEX,
    ),
    "nan_in_schema": (
        [with_parameters(object_with({"maximum": math.nan}))],
        "is not a JSON number",
    ),
    "non_json_value": ([with_parameters(object_with({"enum": {1, 2}}))], "are not JSON"),
    "effect_not_enum": (
        [dataclasses.replace(LOOK, effect=cast("Any", "read_only"))],
        "effect must be an Effect",
    ),
    "zero_timeout": ([dataclasses.replace(LOOK, timeout_s=0)], "timeout_s must be None"),
    "huge_timeout": ([dataclasses.replace(LOOK, timeout_s=601.0)], "timeout_s must be None"),
    "description_too_long": (
        [dataclasses.replace(LOOK, description="d" * 2000)],
        "description is 2000 bytes",
    ),
    "not_a_tool": ([LOOK, {"name": "move"}], "tools[1]: is a dict, not a Tool"),
}


@pytest.mark.parametrize(
    ("tools", "expected"), list(BAD_DEFINITIONS.values()), ids=list(BAD_DEFINITIONS)
)
async def test_bad_definition_is_refused_before_any_request(
    client_factory: ClientFactory, tools: list[Any], expected: str
) -> None:
    """Building a loop with a bad tool raises ToolDefinitionError naming the problem.

    Protects: a tool the model could misuse (or the validator misread) never goes out;
    the error says which tool and what is wrong; nothing reaches the endpoint.
    """
    executor = RecordingExecutor()
    async with FakeEndpoint([Reply.completion("unused")]) as ep:
        client = client_factory(ep.url)
        with pytest.raises(ToolDefinitionError) as info:
            ToolLoop(client, tools, executor)

    assert expected in str(info.value)
    assert info.value.kind == "tool_definition"
    assert ep.requests == []
    assert ep.connections == []
    assert executor.calls == []


async def test_every_problem_is_reported_at_once(client_factory: ClientFactory) -> None:
    """Several bad tools give one error listing each of them.

    Protects: a developer fixes all definitions in one pass, not one error at a time.
    """
    tools = [
        dataclasses.replace(LOOK, name="bad name"),
        with_parameters({"type": "array"}),
        dataclasses.replace(MOVE, timeout_s=-1.0),
    ]
    async with FakeEndpoint() as ep:
        with pytest.raises(ToolDefinitionError) as info:
            ToolLoop(client_factory(ep.url), tools, RecordingExecutor())

    message = str(info.value)
    assert message.startswith("invalid tool definitions (3 problems): ")
    assert "tools[0] 'bad name': " + NAME_RULE in message
    assert "tools[1] 'look': " + TOP_OBJECT in message
    assert "tools[2] 'move': timeout_s must be None" in message
    assert ep.connections == []


async def test_too_many_tools_are_refused(client_factory: ClientFactory) -> None:
    """More tools than ``max_tools`` are refused at construction.

    Protects: the tool list sent with every request is bounded.
    """
    async with FakeEndpoint() as ep:
        with pytest.raises(ToolDefinitionError) as info:
            ToolLoop(
                client_factory(ep.url),
                [LOOK, MOVE],
                RecordingExecutor(),
                config=loop_config(max_tools=1),
            )

    assert "tools: 2 tools, more than max_tools (1)" in str(info.value)
    assert ep.connections == []


REMOTE_PLACES: dict[str, Callable[[str], dict[str, Any]]] = {
    "ref": lambda url: object_with({"$ref": url}),
    "ref_in_defs": lambda url: {"type": "object", "$defs": {"p": {"$ref": url}}},
    "ref_in_items": lambda url: object_with({"type": "array", "items": {"$ref": url}}),
    "ref_in_vendor_extension": lambda url: {"type": "object", "x-grid": {"$ref": url}},
    "dynamic_ref": lambda url: object_with({"$dynamicRef": url}),
    "meta_schema": lambda url: {"$schema": url, "type": "object"},
}


@pytest.mark.parametrize("place", list(REMOTE_PLACES), ids=list(REMOTE_PLACES))
async def test_remote_reference_is_refused_without_fetching(
    client_factory: ClientFactory, place: str
) -> None:
    """A schema pointing at another server is refused, and that server is never contacted.

    Protects Rule 1 of schema compilation: no network and no file access, whatever the
    schema says (a tool definition must not make the agent fetch attacker-chosen URLs).
    """
    async with FakeEndpoint() as schema_host, FakeEndpoint() as ep:
        url = schema_host.origin + "/schemas/point.json"
        with pytest.raises(ToolDefinitionError) as info:
            ToolLoop(
                client_factory(ep.url),
                [with_parameters(REMOTE_PLACES[place](url))],
                RecordingExecutor(),
            )

    message = str(info.value)
    assert "tools[0] 'look'" in message
    assert schema_host.connections == []
    assert schema_host.requests == []
    assert ep.connections == []


async def test_file_reference_is_refused(client_factory: ClientFactory) -> None:
    """A ``file://`` reference is refused like a network one.

    Protects: a schema cannot make the agent read local files either.
    """
    async with FakeEndpoint() as ep:
        with pytest.raises(ToolDefinitionError) as info:
            ToolLoop(
                client_factory(ep.url),
                [with_parameters(object_with({"$ref": "file:///etc/passwd"}))],
                RecordingExecutor(),
            )

    assert "is not local" in str(info.value)
    assert ep.connections == []


async def test_local_reference_compiles_and_validates(client_factory: ClientFactory) -> None:
    """A local ``$ref`` is accepted, and calls are validated through it.

    Protects: refusing remote references does not break ordinary schemas that reuse
    their own definitions; a value violating the referenced schema is still rejected.
    """
    goto = Tool(
        name="goto",
        description="Walk to a point.",
        parameters={
            "type": "object",
            "$defs": {"coord": {"type": "number", "minimum": 0, "maximum": 256}},
            "properties": {"x": {"$ref": "#/$defs/coord"}, "y": {"$ref": "#/$defs/coord"}},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        effect=Effect.MUTATING,
    )
    executor = RecordingExecutor()
    script = [
        calls_reply(
            call("g-1", "goto", '{"x": -1, "y": 2}'), call("g-2", "goto", '{"x": 1, "y": 2}')
        ),
        Reply.completion("done"),
    ]
    async with FakeEndpoint(script) as ep:
        loop = make_loop(client_factory(ep.url), executor, tools=[goto])
        assert loop.registry.names == ("goto",)
        run = await run_loop(loop)

    assert run.result.outcome is Outcome.COMPLETED
    assert executor.call_ids == ["g-2"]
    rejected = run.result.calls[0]
    assert (rejected.call_id, rejected.status) == ("g-1", "rejected")
    assert "- at /x: " in rejected.observation


def test_validate_tools_checks_a_table_without_a_client() -> None:
    """``validate_tools`` gives the same verdict as ``ToolLoop``, with no client or endpoint.

    Protects: an application can check its tool table at start-up or in its own tests;
    a good table gives the wire definitions the loop would send, a bad one every problem.
    """
    definitions = validate_tools(TOOLS)
    assert [msgspec.to_builtins(d) for d in definitions] == [tool_definition(t) for t in TOOLS]
    tools = [dataclasses.replace(LOOK, name="bad name"), with_parameters({"type": "array"})]
    with pytest.raises(ToolDefinitionError) as info:
        validate_tools(tools)
    assert str(info.value).startswith("invalid tool definitions (2 problems): ")
    with pytest.raises(ToolDefinitionError):
        validate_tools(TOOLS, ToolLoopConfig(max_tools=1))
