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


def test_only_the_otel_subpackage_imports_opentelemetry() -> None:
    """No core module imports ``opentelemetry`` or ``metacrate_grid_agent.otel``."""
    offenders = [
        f"{path.name}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if OTEL not in path.parents
        for name in _imports(path)
        if name.split(".")[0] == "opentelemetry" or name.startswith("metacrate_grid_agent.otel")
    ]
    assert offenders == []


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
