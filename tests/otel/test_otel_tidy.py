"""Tracing stays optional: only ``metacrate_grid_agent.otel`` imports OpenTelemetry.

The rest of the package never imports OpenTelemetry or the ``otel`` sub-package, so without
the extra (or without a provider) there is no tracing work at all, and the package imports
and runs without it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "metacrate_grid_agent"
OTEL = PACKAGE / "otel"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


#: The one module outside ``otel/`` that imports it: the command's tracing, inside functions
#: run only when the ``OTEL_*`` variables ask for an export.
COMMAND_TRACING = PACKAGE / "cli" / "_tracing.py"


def _otel_import(name: str) -> bool:
    return name == "metacrate_grid_agent.otel" or name.startswith("metacrate_grid_agent.otel.")


def _names(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    return {base, *(f"{base}.{alias.name}" for alias in node.names)}


def test_only_the_otel_subpackage_imports_opentelemetry() -> None:
    """No module outside ``otel/`` imports ``opentelemetry``, and none imports
    ``metacrate_grid_agent.otel`` but the command's tracing module."""
    offenders = [
        f"{path.name}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if OTEL not in path.parents
        for name in _imports(path)
        if name.split(".")[0] == "opentelemetry" or (_otel_import(name) and path != COMMAND_TRACING)
    ]
    assert offenders == []


def test_the_command_imports_otel_only_inside_functions() -> None:
    """``cli/_tracing.py`` imports ``metacrate_grid_agent.otel`` only inside functions (or
    for type checking), so loading the command imports no OpenTelemetry."""
    tree = ast.parse(COMMAND_TRACING.read_text(encoding="utf-8"))
    lazy: list[str] = []
    at_top = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom) and any(map(_otel_import, _names(node)))
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            lazy += [
                ast.unparse(inner)
                for inner in ast.walk(node)
                if isinstance(inner, ast.Import | ast.ImportFrom)
                and any(map(_otel_import, _names(inner)))
            ]
    assert at_top == []
    assert lazy  # the walk sees the imports it guards


BLOCKED = textwrap.dedent(
    """
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Block())
    import importlib.util
    _orig = importlib.util.find_spec
    importlib.util.find_spec = lambda name, package=None: (
        None if name.split(".")[0] == "opentelemetry" else _orig(name, package))
    """
)


@pytest.mark.slow
def test_the_package_imports_and_runs_without_opentelemetry() -> None:
    """With OpenTelemetry absent, the package, the transcript and the CLI import; ``otel``
    says which extra to install."""
    script = BLOCKED + textwrap.dedent(
        """
        import metacrate_grid_agent, metacrate_grid_agent.transcript, metacrate_grid_agent.cli
        assert not [m for m in sys.modules if m.startswith("opentelemetry")], "imported"
        try:
            import metacrate_grid_agent.otel
        except ImportError as exc:
            assert "metacrate-grid-agent[otel]" in str(exc), exc
        else:
            raise AssertionError("otel imported without OpenTelemetry")
        print("ok")
        """
    )
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr
