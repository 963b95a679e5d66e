"""Tidy checks of the README and the documentation pages: what a reviewer would forget.

The guarantees name the tests that protect them, and those tests exist; the README stays a
first screen; the reference documents the public modules only; every page is reachable;
links from the README and the pages' includes point at what is there.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
DOCS: Final = ROOT / "docs"
README: Final = ROOT / "README.md"
GUARANTEES: Final = DOCS / "guarantees.md"
#: The README is the first screen; the rest lives in docs/. 15 KB, in bytes.
README_MAX_BYTES: Final = 15_000
#: A test named as ``tests/<path>.py::<name>`` (or ``::<Class>::<name>``).
TEST_NAME: Final = re.compile(r"`(tests/[\w/]+\.py)::((?:\w+::)?test_\w+)`")
#: The public modules (STYLE: the package root, errors, config, testing; and the optional
#: and versioned parts): each has a reference page, and nothing else does.
PUBLIC_MODULES: Final = frozenset(
    {
        "metacrate_grid_agent",
        "metacrate_grid_agent.config",
        "metacrate_grid_agent.errors",
        "metacrate_grid_agent.testing",
        "metacrate_grid_agent.transcript",
        "metacrate_grid_agent.safety",
        "metacrate_grid_agent.journal",
        "metacrate_grid_agent.mcp",
        "metacrate_grid_agent.otel",
        "metacrate_grid_agent.dbos",
    }
)
PAGES: Final = (README, *sorted(DOCS.rglob("*.md")))


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_the_readme_is_a_first_screen() -> None:
    """The README stays under 15 KB: what it is, the two commands, how to install it, an
    example, what a trace looks like, where the rest lives."""
    size = len(README.read_bytes())
    assert size < README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/"
    headings = re.findall(r"^## (.+)$", _text(README), re.M)
    assert headings == [
        "Two commands", "Install", "Example", "Tracing", "Works with", "Documentation"
    ]  # fmt: skip


def _defined_tests(path: Path) -> set[str]:
    """``name`` and ``Class::name`` of every test function defined in ``path``."""
    found: set[str] = set()
    for node in ast.parse(_text(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            found.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return found


@pytest.mark.slow
def test_every_test_named_in_the_guarantees_exists() -> None:
    """A guarantee never points at a test that was renamed or removed."""
    named = TEST_NAME.findall(_text(GUARANTEES))
    assert len(named) > 50
    missing = [
        f"{path}::{name}"
        for path, name in named
        if not (ROOT / path).is_file() or name not in _defined_tests(ROOT / path)
    ]
    assert missing == []


def _guarantees() -> list[str]:
    """Each bullet of the guarantees page, its continuation lines joined."""
    items: list[list[str]] = []
    current: list[str] | None = None
    for line in _text(GUARANTEES).splitlines():
        if line.startswith("- "):
            current = [line[2:]]
            items.append(current)
        elif current is not None and line.startswith("  ") and line.strip():
            current.append(line.strip())
        else:
            current = None
    return [" ".join(parts) for parts in items]


def test_every_guarantee_names_the_tests_that_protect_it() -> None:
    """Each guarantee ends with ``*Tests:*`` and at least one test, so none is a promise
    without a check."""
    items = _guarantees()
    assert len(items) >= 25
    bare = [item[:80] for item in items if "*Tests:*" not in item or not TEST_NAME.search(item)]
    assert bare == []


def test_the_reference_documents_exactly_the_public_modules() -> None:
    """One reference page per public module (its first directive), each other directive a
    member of that module, and no private module documented."""
    pages = [
        re.findall(r"^::: ([\w.]+)", _text(page), re.M)
        for page in (DOCS / "reference").glob("*.md")
    ]
    assert {first for first, *_ in pages} == PUBLIC_MODULES
    assert [
        member
        for first, *members in pages
        for member in members
        if member.rpartition(".")[0] != first
    ] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_docs_import_only_public_paths(page: Path) -> None:
    """Examples and prose name public import paths only: private modules may move (a
    dunder such as ``__version__`` is public)."""
    private = re.findall(r"metacrate_grid_agent(?:\.\w+)*\._(?!_)\w+", _text(page))
    assert private == []


def test_every_page_is_in_the_navigation() -> None:
    """A page missing from ``mkdocs.yml`` would be built but unreachable; a name there
    without a page would fail the build."""
    config = _text(ROOT / "mkdocs.yml")
    listed = set(re.findall(r"^\s+- (?:[^:\n]+: )?([\w/.-]+\.md)$", config, re.M))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert listed == on_disk


def test_the_links_of_the_readme_lead_to_files() -> None:
    """Relative links in the README (read on the forge, not built) point at real files."""
    targets = re.findall(r"\]\((?!https?:)([^)#\s]+)", _text(README))
    assert "docs/guide/works-with.md" in targets
    assert [t for t in targets if not (ROOT / t).exists()] == []


def test_the_readme_keeps_the_works_with_section_the_model_hint_names() -> None:
    """An endpoint that wants a ``model`` member gets an error pointing to "Works with" in
    the README (``tests/llm_transport/client/test_hints.py``): that section is there, says what to
    do, and leads to the full recipe."""
    readme = _text(README)
    section = readme.split("## Works with", 1)[1].split("\n## ", 1)[0]
    assert "put LiteLLM in front" in section
    assert "/openai/deployments/MODEL_NAME/chat/completions" in section
    assert "model_list:" in _text(DOCS / "guide" / "works-with.md")


def test_each_included_file_starts_with_its_title_then_a_blank_line() -> None:
    """Pages include ``ARCHITECTURE.md``, ``BENCHMARKS.md`` and ``CHANGELOG.md`` from their
    third line, under a title of their own: the first two lines must be the title and a
    blank line, or the include would drop or repeat text."""
    includes = [
        (page, match)
        for page in DOCS.rglob("*.md")
        for match in re.findall(r'^--8<-- "([^":]+):3:"$', _text(page), re.M)
    ]
    assert sorted(name for _, name in includes) == [
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "CHANGELOG.md",
    ]
    for page, name in includes:
        first, second = _text(ROOT / name).splitlines()[:2]
        assert (first.startswith("# "), second) == (True, ""), name
        assert _text(page).startswith(first + "\n"), page


def test_the_reference_hook_shows_rest_roles_as_code() -> None:
    """The docstrings' reST roles render as plain code on the reference pages, not as
    ``:class:`` text; the other pages are left as written."""
    spec = importlib.util.spec_from_file_location("rest_roles", DOCS / "_hooks" / "rest_roles.py")
    assert spec is not None
    assert spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    html = (
        "<p>See :class:<code>~a.b.Tool</code>, :meth:<code>ToolLoop.run &lt;a.ToolLoop.run&gt;"
        "</code> and :mod:<code>a.errors</code> per event::</p>"
    )
    expected = (
        "<p>See <code>Tool</code>, <code>ToolLoop.run</code> and <code>a.errors</code>"
        " per event:</p>"
    )

    class Page:
        def __init__(self, src_uri: str) -> None:
            self.file = type("File", (), {"src_uri": src_uri})()

    assert hook.on_page_content(html, page=Page("reference/index.md")) == expected
    assert hook.on_page_content(html, page=Page("guide/tool-loop.md")) == html
