"""Tidy checks: the things reviewers forget, checked on every run."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from metacrate_grid_agent.config import LLM_SETTINGS, TOOL_LOOP_SETTINGS, Setting
from metacrate_grid_agent.errors import error_kinds

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "metacrate_grid_agent"
# Every module of the package, its sub-packages included (the command, the test kit, mcp, otel).
MODULES = sorted(PACKAGE.rglob("*.py"))
# Where the configuration reference and the error kinds are documented for operators.
CONFIGURATION_PAGE = ROOT / "docs" / "guide" / "configuration.md"
ERRORS_PAGE = ROOT / "docs" / "guide" / "errors.md"


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_every_module_has_a_docstring(path: Path) -> None:
    """Each module says what it is for in its first lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert ast.get_docstring(tree), f"{_relative(path)} has no module docstring"


def test_architecture_names_every_module_and_only_existing_ones() -> None:
    """The codemap in ARCHITECTURE.md matches the modules on disk, both ways, each named by its
    path inside the package (``cli/_main.py``, ``testing/__init__.py``)."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(?:metacrate_grid_agent/)?((?:_?[a-z]+/)?_?[a-z_]+\.py)`", text))
    on_disk = {_relative(p) for p in MODULES}
    assert named - on_disk == set(), "ARCHITECTURE.md names modules that do not exist"
    assert on_disk - named == set(), "modules missing from the ARCHITECTURE.md codemap"


def _human(setting: Setting, value: float) -> str:
    if setting.kind is int and setting.unit == "bytes":
        for size, unit in ((1 << 20, "MiB"), (1 << 10, "KiB")):
            if value >= size and value % size == 0:
                return f"{int(value) // size} {unit}"
        return f"{int(value)} B"
    if setting.kind is int:
        return str(int(value))
    return f"{value:g} s"


@pytest.mark.parametrize("setting", LLM_SETTINGS + TOOL_LOOP_SETTINGS, ids=lambda s: s.name)
def test_docs_document_every_setting_as_the_code_has_it(setting: Setting) -> None:
    """The configuration reference (docs/guide/configuration.md) shows each key's real
    default and limits."""
    page = CONFIGURATION_PAGE.read_text(encoding="utf-8")
    row = (
        f"| `{setting.name}` | {_human(setting, setting.default)} | "
        f"{_human(setting, setting.minimum)} | {_human(setting, setting.ceiling)} | "
        f"{setting.reason} |"
    )
    assert row in page


def test_settings_tables_match_the_struct_defaults() -> None:
    """The documented defaults are the ones the config structs actually use."""
    from metacrate_grid_agent.config import LLMConfig, Secret, ToolLoopConfig

    llm = LLMConfig(endpoint_url="http://127.0.0.1:1/", api_key=Secret("k"))
    loop = ToolLoopConfig()
    assert {s.name: s.default for s in LLM_SETTINGS} == {
        s.name: getattr(llm, s.name) for s in LLM_SETTINGS
    }
    assert {s.name: s.default for s in TOOL_LOOP_SETTINGS} == {
        s.name: getattr(loop, s.name) for s in TOOL_LOOP_SETTINGS
    }


def test_docs_document_every_switch_with_its_default() -> None:
    """Every true/false setting of the config structs has a row with its default in the
    configuration reference."""
    import msgspec

    from metacrate_grid_agent.config import LLMConfig, Secret, ToolLoopConfig

    page = CONFIGURATION_PAGE.read_text(encoding="utf-8")
    llm = LLMConfig(endpoint_url="http://127.0.0.1:1/", api_key=Secret("k"))
    switches = {
        field.name: getattr(config, field.name)
        for config in (llm, ToolLoopConfig())
        for field in msgspec.structs.fields(config)
        if field.type is bool
    }
    assert set(switches) >= {"mint_missing_call_ids", "reissue_reused_call_ids"}
    for name, default in switches.items():
        assert f"| `{name}` | `{str(default).lower()}` | " in page, name


@pytest.mark.parametrize("kind", sorted(error_kinds()))
def test_docs_list_every_error_kind(kind: str) -> None:
    """Every error kind the library can raise is documented for operators
    (docs/guide/errors.md)."""
    page = ERRORS_PAGE.read_text(encoding="utf-8")
    assert f"| `{kind}` | {error_kinds()[kind].__name__} |" in page


def test_no_skipped_test_without_a_reason() -> None:
    """A skip or xfail always says why."""
    pattern = re.compile(r"pytest\.(?:mark\.)?(?:skip|xfail|skipif)\(([^)]*)\)")
    offenders = [
        f"{path.name}: {match.group(0)}"
        for path in (ROOT / "tests").rglob("*.py")
        for match in pattern.finditer(path.read_text(encoding="utf-8"))
        if "reason" not in match.group(1) and not match.group(1).strip().startswith(('"', "'"))
    ]
    assert offenders == []


def test_version_is_in_one_place() -> None:
    """The build reads the version from _version.py; nothing else hard-codes it."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject
    assert 'path = "src/metacrate_grid_agent/_version.py"' in pyproject


def test_nothing_names_this_machine() -> None:
    """No committed text names a local path of a developer machine."""
    pattern = re.compile(r"/(?:work|root|home)/[A-Za-z]")
    paths = [*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md"), *MODULES]
    paths += [*(ROOT / "benchmarks").glob("*.py"), ROOT / "mkdocs.yml"]
    offenders = [p.name for p in paths if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


CORE = "metacrate_grid_agent._core"
AIO = "metacrate_grid_agent._aio"
#: What the sans-I/O core never imports: an event loop, a socket, a clock, a thread, a file
#: system or a process.
IO_MODULES = {
    "asyncio", "aiohttp", "socket", "time", "ssl", "selectors", "threading", "os", "pathlib",
    "subprocess", "io", "datetime",
}  # fmt: skip
#: Every module of the core folder: the tidy rule is the folder's, not a list's.
CORE_MODULES = sorted((PACKAGE / "_core").glob("*.py"))


def _stdlib_imports(path: Path) -> set[str]:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module)
    return {m.split(".")[0] for m in imported}


@pytest.mark.parametrize("path", CORE_MODULES, ids=_relative)
def test_the_pure_core_imports_no_io(path: Path) -> None:
    """Each module of ``_core/`` imports no event loop, socket, clock or file system, and of
    ours only the core itself and the vocabulary below it (``config``, ``errors``)."""
    assert _stdlib_imports(path) & IO_MODULES == set()
    allowed = {"metacrate_grid_agent.config", "metacrate_grid_agent.errors"}
    modules = {_module_name(p) for p in MODULES}
    ours = {n for n in _imports_of(path) & modules if not _in(CORE, {n})}
    assert ours - allowed == set()


def test_the_core_folder_is_what_the_tidy_rule_walks() -> None:
    """The folder rule sees the modules it guards, so an empty answer above is no blind walk."""
    names = {p.stem for p in CORE_MODULES}
    assert {"_wire", "_retry", "_compaction", "_loop", "_schema"} <= names


#: The layers of the package, lowest first: a module imports only from its own layer or
#: below (the parent packages Python loads on the way are not imports). Within a layer,
#: the folders do not import each other unless listed in the same set.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset(
        {
            "metacrate_grid_agent.errors",
            "metacrate_grid_agent._version",
            "metacrate_grid_agent._public",
        }
    ),
    frozenset({"metacrate_grid_agent._files"}),
    frozenset(
        {
            "metacrate_grid_agent.config",
            "metacrate_grid_agent._settings",
            "metacrate_grid_agent._mcp_config",
            "metacrate_grid_agent._secret",
        }
    ),
    frozenset({CORE}),
    frozenset({AIO}),
    frozenset({"metacrate_grid_agent.journal"}),
    frozenset({"metacrate_grid_agent"}),
    frozenset({"metacrate_grid_agent.testing"}),
    frozenset({"metacrate_grid_agent.transcript", "metacrate_grid_agent.otel"}),
    frozenset({"metacrate_grid_agent.mcp", "metacrate_grid_agent.dbos"}),
    frozenset({"metacrate_grid_agent.cli"}),
    frozenset({"metacrate_grid_agent.__main__"}),
)


def _layer(name: str) -> int:
    """The index in LAYERS of the most specific part holding ``name``."""
    best, depth = -1, -1
    for index, parts in enumerate(LAYERS):
        for part in parts:
            if _in(part, {name}) and part.count(".") > depth:
                best, depth = index, part.count(".")
    assert best >= 0, f"{name} is in no layer"
    return best


def _direct() -> dict[str, set[str]]:
    """Each module of ours and the modules of ours it imports; its own parent packages are
    left out (Python loads them first anyway; ``from pkg import _sub`` names one)."""
    modules = {_module_name(p): p for p in MODULES}
    return {
        name: {n for n in _imports_of(path) & modules.keys() if not name.startswith(n + ".")}
        - {name}
        for name, path in modules.items()
    }


def test_no_import_runs_from_a_lower_layer_to_a_higher_one() -> None:
    """The vocabulary, the pure core, the I/O edges, the public API, the test kit, the
    transcript and tracing, MCP, the command: each imports only what stands below it."""
    upward = sorted(
        (name, imported)
        for name, imports in _direct().items()
        for imported in imports
        if _layer(imported) > _layer(name)
    )
    assert upward == []


def test_the_package_has_no_import_cycle() -> None:
    """No module reaches itself through its imports (parents implied by Python aside)."""
    direct = _direct()
    cycles = []
    for start in direct:
        seen: set[str] = set()
        todo = list(direct[start])
        while todo:
            name = todo.pop()
            if name == start:
                cycles.append(start)
                break
            if name not in seen:
                seen.add(name)
                todo.extend(direct[name])
    assert cycles == []


# The three parts of the package: the library (the modules directly in the package, and the
# optional mcp/ and otel/), the command (cli/) and the test kit (testing/).
COMMAND = "metacrate_grid_agent.cli"
TEST_KIT = "metacrate_grid_agent.testing"
# The only library modules that reach the test kit, by design: the transcript package, whose
# replay re-runs a recorded session on the test kit's FakeEndpoint (importing any of its
# modules loads the package, which re-exports ``replay``).
TRANSCRIPT = "metacrate_grid_agent.transcript"
# ``python -m metacrate_grid_agent`` is the command's entry point, not library.
COMMAND_ENTRY = "metacrate_grid_agent.__main__"


def _module_name(path: Path) -> str:
    parts = ["metacrate_grid_agent", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_of(path: Path) -> set[str]:
    """Every module of ours that ``path`` names in an import, wherever it stands."""
    own = _module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] == "metacrate_grid_agent"}


def _reach() -> dict[str, set[str]]:
    """For each module of the package, every module of ours it loads, directly or not."""
    modules = {_module_name(p): p for p in MODULES}
    direct = {name: _imports_of(path) & modules.keys() for name, path in modules.items()}
    for name in modules:  # importing a module first imports the packages above it
        parent = name.rpartition(".")[0]
        if parent in modules:
            direct[name].add(parent)
    reach: dict[str, set[str]] = {}
    for start in modules:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in direct[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        reach[start] = seen - {start}
    return reach


def _in(part: str, names: set[str]) -> set[str]:
    return {n for n in names if n == part or n.startswith(part + ".")}


def test_the_library_imports_neither_the_command_nor_the_test_kit() -> None:
    """The library (core, mcp/, otel/) never loads the command, nor the test kit except for
    the transcript replay, which runs on the fake endpoint by design."""
    reach = _reach()
    library = {
        name
        for name in reach
        if not _in(COMMAND, {name}) and not _in(TEST_KIT, {name}) and name != COMMAND_ENTRY
    }
    assert "metacrate_grid_agent._aio._transport" in library
    assert "metacrate_grid_agent.mcp._toolset" in library
    assert {n for n in library if _in(COMMAND, reach[n])} == set()
    replay_on_the_test_kit = _in(TRANSCRIPT, set(reach))
    assert len(replay_on_the_test_kit) >= 5
    assert {n for n in library if _in(TEST_KIT, reach[n])} == replay_on_the_test_kit


def test_the_test_kit_never_imports_the_command() -> None:
    """The fake endpoint stands alone: it builds on the library, never on the command."""
    reach = _reach()
    kit = _in(TEST_KIT, set(reach))
    assert kit >= {TEST_KIT, f"{TEST_KIT}._fake_endpoint", f"{TEST_KIT}._fake_wire"}
    assert {n for n in kit if _in(COMMAND, reach[n])} == set()


def test_the_import_walk_sees_the_edges_it_guards() -> None:
    """The walk above finds real edges, so an empty answer means no edge, not a blind walk."""
    reach = _reach()
    assert _in(COMMAND, reach[COMMAND_ENTRY])
    assert _in(TEST_KIT, reach[f"{COMMAND}._run"])
    assert _in(TEST_KIT, reach["metacrate_grid_agent.transcript._replay"])


def _private(name: str) -> bool:
    """Whether a module of ours is private: a part of its name after the package's own
    begins with an underscore (``_core._wire``, ``_files``)."""
    return any(part.startswith("_") for part in name.split(".")[1:])


def test_the_command_imports_only_the_public_api() -> None:
    """Every module of ``cli/`` imports, of the library, only public modules (the package,
    ``config``, ``errors``, ``safety``, ``testing``, ``transcript``...), like any other
    application; its own private modules are its business."""
    modules = {_module_name(p): p for p in MODULES}
    command = _in(COMMAND, set(modules))
    imported = {
        (name, other)
        for name in command
        for other in _imports_of(modules[name]) & modules.keys()
        if not _in(COMMAND, {other})
    }
    assert {(n, o) for n, o in imported if _private(o)} == set()
    assert {o for _, o in imported} >= {"metacrate_grid_agent", "metacrate_grid_agent.safety"}


#: Libraries the package once used and no longer needs: the client speaks HTTP itself.
DROPPED_LIBRARIES = {"aiohttp", "yarl", "multidict"}


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_no_module_imports_aiohttp_or_yarl(path: Path) -> None:
    """The client's HTTP is its own (``_aio/_http.py`` on llhttp): no module of the package
    imports aiohttp or its URL and header types, so neither is a runtime dependency."""
    assert _stdlib_imports(path) & DROPPED_LIBRARIES == set()


def _asyncio_private_uses(tree: ast.AST) -> list[str]:
    """Every private name of asyncio that ``tree`` imports or reads off the module."""
    aliases = {"asyncio"}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "asyncio":
                    aliases.add(alias.asname or "asyncio")
                    if any(part.startswith("_") for part in alias.name.split(".")):
                        found.append(alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "asyncio":
            parts = [*(node.module or "").split("."), *(a.name for a in node.names)]
            if any(part.startswith("_") for part in parts):
                found.append(node.module or "")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            root: ast.expr = node
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in aliases:
                found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_no_module_uses_a_private_name_of_asyncio(path: Path) -> None:
    """No ``asyncio._x``, ``asyncio.events._y`` or ``from asyncio import _z`` anywhere: what the
    client needs of the event loop (buffered reads, timers, TLS) is asyncio's public API."""
    assert _asyncio_private_uses(ast.parse(path.read_text(encoding="utf-8"))) == []


def test_the_private_name_check_sees_what_it_guards() -> None:
    """The check above finds each form it forbids, so an empty answer is no blind walk."""
    source = (
        "import asyncio\nimport asyncio as aio\nfrom asyncio import _get_running_loop\n"
        "asyncio._set_running_loop\naio.events._event_loop_policy\nasyncio.get_running_loop\n"
    )
    assert _asyncio_private_uses(ast.parse(source)) == [
        "asyncio",
        "asyncio._set_running_loop",
        "aio.events._event_loop_policy",
    ]


#: The HTTP edge: the modules that hold sockets, transports, TLS objects and the parser.
HTTP_EDGE = ["_aio/_http.py", "_aio/_transport.py", "_aio/_translate.py", "_aio/_slots.py"]


@pytest.mark.parametrize("name", HTTP_EDGE)
def test_the_http_edge_reads_private_names_only_on_itself(name: str) -> None:
    """In the HTTP edge, ``._x`` is read on ``self`` only: never on a transport, a socket, an
    SSL object, the parser or the event loop (whose private parts change without notice)."""
    tree = ast.parse((PACKAGE / name).read_text(encoding="utf-8"))
    offenders = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not (node.attr.startswith("__") and node.attr.endswith("__"))
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]
    assert offenders == []
