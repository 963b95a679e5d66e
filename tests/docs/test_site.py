"""The documentation site reads well: an Install page, table keys that never break mid-word,
long code lines that scroll, a reference that lists every member of every enum and orders
each page by importance, and a benchmarks page that opens with the current figures (the
README's agreeing with them) and keeps the history as an appendix.

What a browser shows was checked by hand in headless Chromium on the built site; these
tests pin what makes it so, in the sources the build reads.
"""

from __future__ import annotations

import ast
import enum
import importlib
import re
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
DOCS: Final = ROOT / "docs"
REFERENCE: Final = DOCS / "reference"
#: Each reference page and the public module it documents.
PAGE_OF: Final = {
    "index.md": "metacrate_grid_agent",
    "config.md": "metacrate_grid_agent.config",
    "errors.md": "metacrate_grid_agent.errors",
    "testing.md": "metacrate_grid_agent.testing",
    "transcript.md": "metacrate_grid_agent.transcript",
    "safety.md": "metacrate_grid_agent.safety",
    "mcp.md": "metacrate_grid_agent.mcp",
    "otel.md": "metacrate_grid_agent.otel",
    "journal.md": "metacrate_grid_agent.journal",
    "dbos.md": "metacrate_grid_agent.dbos",
}
#: What a reader of each page looks for first, in order: it leads the page.
FIRST: Final = {
    "index.md": ["LLMClient", "ToolLoop"],
    "config.md": ["AgentConfig", "LLMConfig"],
    "errors.md": ["GridAgentError"],
    "journal.md": ["FileJournal", "Journal"],
    "testing.md": ["FakeEndpoint", "Reply"],
    "transcript.md": ["TranscriptWriter"],
    "safety.md": ["display_safe"],
    "mcp.md": ["McpToolset", "McpServer"],
    "otel.md": ["GenAITelemetry"],
    "dbos.md": ["DurableSessions", "take_over"],
}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _directives(page: str) -> list[str]:
    return re.findall(r"^::: ([\w.]+)", _text(REFERENCE / page), re.M)


def test_the_install_page_is_the_readmes_install_section() -> None:
    """The site has an Install page, in the navigation, made of the README's own Install
    section (one text, included); no page sends a reader to "Install in the README"."""
    readme = _text(ROOT / "README.md")
    section = readme.split("<!-- --8<-- [start:install] -->", 1)[1]
    section = section.split("<!-- --8<-- [end:install] -->", 1)[0]
    assert "uv sync --extra mcp" in section
    assert '--8<-- "README.md:install"' in _text(DOCS / "install.md")
    assert "install.md" in _text(ROOT / "mkdocs.yml")
    pages = [p for p in DOCS.rglob("*.md") if "Install in the README" in _text(p)]
    assert pages == []


def _public_enums() -> list[type[enum.Enum]]:
    found = []
    for module in PAGE_OF.values():
        public = importlib.import_module(module)
        for name in public.__all__:
            value = getattr(public, name)
            if isinstance(value, type) and issubclass(value, enum.Enum) and value not in found:
                found.append(value)
    return found


@pytest.mark.parametrize("enum_type", _public_enums(), ids=lambda e: e.__name__)
def test_every_member_of_a_public_enum_is_documented(enum_type: type[enum.Enum]) -> None:
    """The reference lists the members that have a docstring: every member of every public
    enum has one (``Outcome`` showed 4 of its 12)."""
    (cls,) = [
        node
        for path in (ROOT / "src").rglob("*.py")
        for node in ast.parse(_text(path)).body
        if isinstance(node, ast.ClassDef) and node.name == enum_type.__name__
    ]
    documented = {
        target.id
        for statement, following in zip(cls.body, cls.body[1:], strict=False)
        if isinstance(statement, ast.Assign)
        for target in statement.targets
        if isinstance(target, ast.Name)
        and isinstance(following, ast.Expr)
        and isinstance(following.value, ast.Constant)
        and isinstance(following.value.value, str)
    }
    assert sorted(set(enum_type.__members__) - documented) == []


@pytest.mark.parametrize("page", sorted(PAGE_OF))
def test_each_reference_page_lists_every_public_name_once_by_importance(page: str) -> None:
    """A reference page opens with its module's docstring, then documents each name of the
    module's ``__all__`` exactly once, in an order of importance written on the page (the
    client and the loop before a message type), never ``__all__``'s alphabetical one."""
    module = PAGE_OF[page]
    first, *members = _directives(page)
    assert first == module
    names = [m.removeprefix(module + ".") for m in members]
    assert sorted(names) == sorted(importlib.import_module(module).__all__)
    assert names[: len(FIRST[page])] == FIRST[page]
    if page == "index.md":
        assert names.index("ToolLoop") < names.index("ToolOutcome") < names.index("Message")


def test_the_site_keeps_table_keys_whole_and_lets_long_code_scroll() -> None:
    """The site's stylesheet (listed in ``mkdocs.yml``) keeps a table's first-column code
    on one line (``endpoint_url`` broke as ``endpoint_ur|l``) and gives long code lines a
    scrollbar that is always shown instead of a cut."""
    config = _text(ROOT / "mkdocs.yml")
    assert re.search(r"^extra_css:\n  - stylesheets/extra\.css$", config, re.M)
    css = re.sub(r"/\*.*?\*/", "", _text(DOCS / "stylesheets" / "extra.css"), flags=re.S)
    rules = dict(re.findall(r"([^{}]+)\{([^}]*)\}", css))
    first_column = next(v for k, v in rules.items() if "td:first-child code" in k)
    assert "white-space: nowrap" in first_column
    code = next(v for k, v in rules.items() if "pre > code" in k)
    assert "overflow-x: auto" in code
    assert "scrollbar-color" in code


#: A row of the current-figures table: figure, value, target, verdict, date, commit, status,
#: and the command that measured it.
ROW: Final = re.compile(
    r"^\| (?P<figure>[^|]+) \| (?P<value>[^|]+) \| (?P<target>[^|]+) \| (?P<verdict>[^|]+) "
    r"\| (?P<date>\d{4}-\d{2}-\d{2}) \| `(?P<commit>[0-9a-f]{7,40})` \| (?P<status>[^|]+) "
    r"\| (?P<command>[^|]+) \|$",
    re.M,
)
#: How a figure's command reads: one of the benchmark modules, as the table quotes it.
COMMAND: Final = re.compile(r"`python -m benchmarks(\.bench_\w+)?( [^`]*)?`")


def test_the_benchmarks_page_opens_with_the_current_figures() -> None:
    """The benchmarks page opens with one table of figures, each with the date and commit
    it was measured on, whether it is current and the command that measured it; the
    history (``BENCHMARKS.md``) follows as an appendix; every ratio the README states is a
    current figure of that table."""
    page = _text(DOCS / "benchmarks.md")
    headings = re.findall(r"^## (.+)$", page, re.M)
    assert headings[0] == "Current figures"
    assert headings[-1].startswith("Appendix")
    table = page.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = [m.groupdict() for m in ROW.finditer(table)]
    assert len(rows) >= 8
    assert len(rows) == table.count("\n| ") - 1  # every row but the heading matches
    # Every figure says the command that produced it, so that it can be re-run.
    assert [r["figure"] for r in rows if not COMMAND.search(r["command"])] == []
    assert {r["status"].strip() for r in rows} <= {"current", "not current"}
    current = " ".join(r["value"] for r in rows if r["status"].strip() == "current")
    intro = _text(ROOT / "README.md").split("## Two commands", 1)[0]
    ratios = re.findall(r"\b\d+(?:\.\d+)?x\b", intro)
    assert ratios
    assert [r for r in ratios if r not in current] == []
    assert page.index('--8<-- "BENCHMARKS.md:3:"') > page.index("## Appendix")
