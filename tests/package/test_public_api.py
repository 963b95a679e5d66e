"""The public API stands on its own: it says where it lives, and every type it names can be
imported from a public module.

Every class and function a public module exports gives that module (or another public module
exporting it) as its ``__module__``, so reprs, tracebacks, docs and pickles show the import
path users write, never a private one; it still pickles by reference and still resolves its
annotations there.

A public module is one whose ``__all__`` is pinned in ``test_exports.py`` (plus ``errors``
and ``mcp``, ``otel`` and ``dbos``, walked when their extras are installed).
Walked: every class and function in a public ``__all__``, the signatures of their public
methods (``__init__`` and ``__call__`` included, properties' return types too), and the
annotations of their fields. Every class of this package that any of them names, resolved
or written as a name, must be importable from a public module; so must every alias
written in a signature (a ``Literal`` alias excepted: its values are the contract). No
aiohttp type may appear at all.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import pickle
import types
import typing
from typing import Any, Final

import pytest

if typing.TYPE_CHECKING:
    from collections.abc import Callable, Iterator

PACKAGE: Final = "metacrate_grid_agent"
#: The public modules, those of an optional extra only when it is installed.
PUBLIC_MODULES: Final = (
    PACKAGE,
    f"{PACKAGE}.config",
    f"{PACKAGE}.errors",
    f"{PACKAGE}.journal",
    f"{PACKAGE}.safety",
    f"{PACKAGE}.testing",
    f"{PACKAGE}.transcript",
    *((f"{PACKAGE}.mcp",) if importlib.util.find_spec("mcp") else ()),
    *((f"{PACKAGE}.otel",) if importlib.util.find_spec("opentelemetry") else ()),
    *((f"{PACKAGE}.dbos",) if importlib.util.find_spec("dbos") else ()),
)
#: Libraries whose types never appear in our API: the HTTP client is an implementation detail.
FORBIDDEN_LIBRARIES: Final = ("aiohttp",)
#: Dunder methods whose signatures users call.
PUBLIC_DUNDERS: Final = ("__init__", "__call__")


def _public_objects() -> dict[int, str]:
    """Every object some public module exports, by identity: where it is exported."""
    found: dict[int, str] = {}
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for exported in module.__all__:
            found.setdefault(id(getattr(module, exported)), f"{name}.{exported}")
    return found


def _exported() -> Iterator[tuple[str, object]]:
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for exported in module.__all__:
            yield f"{name}.{exported}", getattr(module, exported)


def _functions_of(cls: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The public methods of ``cls``, its own and those inherited from this package."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith(PACKAGE):
            continue
        for name, value in vars(klass).items():
            if name in seen or (name.startswith("_") and name not in PUBLIC_DUNDERS):
                continue
            seen.add(name)
            function = value
            if isinstance(function, staticmethod | classmethod):
                function = function.__func__
            elif isinstance(function, property):
                function = function.fget
            if inspect.isfunction(function):
                yield f"{cls.__qualname__}.{name}", function


def _classes_in(annotation: object) -> Iterator[type]:
    """Every class an evaluated annotation names, however deeply nested."""
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        yield annotation
    origin = typing.get_origin(annotation)
    if isinstance(origin, type):
        yield origin
    if origin is not typing.Literal:
        for argument in typing.get_args(annotation):
            if isinstance(argument, list):  # Callable[[A, B], R]
                for item in argument:
                    yield from _classes_in(item)
            else:
                yield from _classes_in(argument)


def _names_in(annotation: str) -> Iterator[str]:
    """The dotted names written in an annotation string (``msgspec.Struct``, ``Hook``)."""
    todo: list[ast.AST] = [ast.parse(annotation, mode="eval")]
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            yield f"{node.value.id}.{node.attr}"
        else:
            todo.extend(ast.iter_child_nodes(node))


def _resolve(name: str, namespace: dict[str, Any]) -> object:
    head, _, rest = name.partition(".")
    value = namespace[head] if head in namespace else getattr(builtins, head)
    return getattr(value, rest) if rest else value


def _problems_in(where: str, hints: dict[str, Any], public: dict[int, str]) -> list[str]:
    problems = []
    for key, annotation in hints.items():
        for cls in _classes_in(annotation):
            module = cls.__module__
            if module.startswith(PACKAGE) and id(cls) not in public:
                problems.append(f"{where} ({key}): {module}.{cls.__qualname__} is private")
            if module.split(".")[0] in FORBIDDEN_LIBRARIES:
                problems.append(f"{where} ({key}): {module}.{cls.__qualname__} leaks")
    return problems


def _alias_problems(where: str, function: Callable[..., Any], public: dict[int, str]) -> list[str]:
    """Aliases written in a signature (``Hook`` for ``Callable[[Event], None]``) that no
    public module exports; ``get_type_hints`` would have expanded them out of sight."""
    problems = []
    for key, annotation in inspect.get_annotations(function).items():
        if not isinstance(annotation, str):
            continue
        for name in _names_in(annotation):
            value = _resolve(name, inspect.unwrap(function).__globals__)
            origin = typing.get_origin(value)
            if origin not in (None, typing.Literal) and id(value) not in public:
                problems.append(f"{where} ({key}): the alias {name} is private")
    return problems


def test_no_private_type_in_a_public_signature() -> None:
    """Every class and alias a public signature or field names is importable from a public
    module, and no aiohttp type appears: a user can spell every type the API hands over."""
    public = _public_objects()
    problems: list[str] = []
    for where, obj in _exported():
        functions: list[tuple[str, Callable[..., Any]]] = []
        if isinstance(obj, type):
            fields = typing.get_type_hints(obj, include_extras=True)
            public_fields = {k: v for k, v in fields.items() if not k.startswith("_")}
            problems += _problems_in(f"{where} fields", public_fields, public)
            functions += _functions_of(obj)
        elif inspect.isfunction(obj):
            functions.append((where, obj))
        for name, function in functions:
            hints = typing.get_type_hints(function, include_extras=True)
            problems += _problems_in(name, hints, public)
            problems += _alias_problems(name, function, public)
    assert problems == []


def test_the_signature_walk_sees_what_it_guards() -> None:
    """The walk finds the signatures it checks and the names in them, so an empty answer
    above is no blind walk."""
    from metacrate_grid_agent import LLMClient, ToolLoop

    methods = dict(_functions_of(ToolLoop))
    assert {"ToolLoop.__init__", "ToolLoop.run", "ToolLoop.registry"} <= set(methods)
    assert "on_progress" in inspect.get_annotations(LLMClient.__init__)
    assert list(_names_in("Hook | msgspec.Struct | None")) == ["Hook", "msgspec.Struct"]
    assert {dict, list, int, str} == set(_classes_in(dict[str, list[int]]))


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_each_public_module_is_walked(module_name: str) -> None:
    """Every public module walked here imports and exports something to walk."""
    assert importlib.import_module(module_name).__all__


def _classes_and_functions() -> list[tuple[str, Any]]:
    return [
        (where, obj)
        for where, obj in _exported()
        if isinstance(obj, type) or inspect.isfunction(obj)
    ]


def test_every_exported_class_and_function_names_a_public_module() -> None:
    """``__module__`` of every exported class and function is a public module that exports
    it: ``<class 'metacrate_grid_agent.ToolCall'>``, never ``..._core._types.ToolCall``."""
    exporters: dict[int, set[str]] = {}
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for exported in module.__all__:
            exporters.setdefault(id(getattr(module, exported)), set()).add(name)
    misplaced = [
        f"{where} says {obj.__module__}"
        for where, obj in _classes_and_functions()
        if obj.__module__ not in exporters[id(obj)]
    ]
    assert misplaced == []


@pytest.mark.parametrize(
    "obj", [pytest.param(obj, id=where) for where, obj in _classes_and_functions()]
)
def test_every_exported_class_and_function_pickles_by_reference(obj: Any) -> None:
    """Pickle finds each class and function again at the module and name it gives, so a
    pickled value of a public type loads in another process."""
    assert pickle.loads(pickle.dumps(obj)) is obj  # noqa: S301 - our own bytes


def test_every_exported_class_resolves_its_annotations_where_it_says_it_lives() -> None:
    """``typing.get_type_hints`` (which msgspec also uses to decode a struct) resolves every
    exported class's fields, though its names are looked up in the module it names."""
    unresolved = []
    for where, obj in _classes_and_functions():
        if isinstance(obj, type):
            try:
                typing.get_type_hints(obj, include_extras=True)
            except NameError as exc:
                unresolved.append(f"{where}: {exc}")
    assert unresolved == []


def _values() -> list[object]:
    from metacrate_grid_agent import (
        AssistantMessage,
        AttemptRecord,
        Denied,
        Effect,
        ImagePart,
        Outcome,
        ProgressEvent,
        Success,
        TextPart,
        Tool,
        ToolCall,
        ToolLoopConfig,
        Usage,
        UserMessage,
    )
    from metacrate_grid_agent.config import LLM_SETTINGS
    from metacrate_grid_agent.testing import Reply

    call = ToolCall.create("c1", "look", "{}")
    return [
        call,
        AssistantMessage(content="x", tool_calls=(call,)),
        UserMessage(content=(TextPart("hi"), ImagePart.of("https://example.test/a.png"))),
        Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3),
        Success("ok"),
        Denied("no"),
        Effect.MUTATING,
        Outcome.COMPLETED,
        ToolLoopConfig(),
        Tool(
            name="look", description="Look.", parameters={"type": "object"}, effect=Effect.READ_ONLY
        ),
        ProgressEvent(kind="attempt", request_id="r1", attempt=1, elapsed_s=0.0),
        AttemptRecord(1, "ok", 200, None, 0.1, None, None),
        LLM_SETTINGS[0],
        Reply.completion("hi"),
    ]


@pytest.mark.parametrize("value", _values(), ids=lambda v: type(v).__name__)
def test_values_of_public_types_round_trip_through_pickle(value: object) -> None:
    """A value of a public type (msgspec struct, frozen dataclass, enum) pickles and loads
    equal, as it did when its class named its private module."""
    assert pickle.loads(pickle.dumps(value)) == value  # noqa: S301 - our own bytes
