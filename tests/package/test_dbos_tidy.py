"""DBOS stays optional: only ``metacrate_grid_agent.dbos`` imports DBOS and its database
drivers, and the rest of the package imports and runs without them."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "metacrate_grid_agent"
ADAPTER = PACKAGE / "dbos"
#: What the ``dbos`` extra brings that only the adapter may import.
ENGINE_MODULES = frozenset({"dbos", "sqlalchemy", "psycopg", "psycopg_binary"})


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_only_the_dbos_subpackage_imports_the_engine() -> None:
    """No module outside ``dbos/`` imports DBOS, SQLAlchemy or psycopg, nor the adapter.

    Protects: the ``dbos`` extra stays optional; the core never pays for it.
    """
    offenders = sorted(
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        if ADAPTER not in path.parents
        for name in _imports(path)
        if name.split(".")[0] in ENGINE_MODULES
        or name == "metacrate_grid_agent.dbos"
        or name.startswith("metacrate_grid_agent.dbos.")
    )
    assert offenders == []


# Runs in a fresh interpreter in which the engine's modules fail to import, as if the extra
# were not installed; prints what it found.
_PROBE = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    class _NoEngine:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"dbos", "sqlalchemy", "psycopg"}:
                raise ImportError("the dbos extra is not installed")
            return None

    sys.meta_path.insert(0, _NoEngine())
    import metacrate_grid_agent
    skipped = {"metacrate_grid_agent.dbos", "metacrate_grid_agent.__main__"}
    for info in pkgutil.iter_modules(metacrate_grid_agent.__path__, "metacrate_grid_agent."):
        if info.name not in skipped:
            importlib.import_module(info.name)
    loaded = sorted(n for n in sys.modules if n.split(".")[0] in {"dbos", "sqlalchemy"})
    print("loaded:", loaded)
    try:
        import metacrate_grid_agent.dbos
    except ImportError as exc:
        print("adapter:", exc)
    """
)


@pytest.mark.slow
def test_the_package_imports_without_the_dbos_extra() -> None:
    """Every other module imports with DBOS missing, and the adapter says what to install.

    Protects: a user without the extra loses nothing else, and one who forgot it gets the
    install hint rather than a bare ModuleNotFoundError.
    """
    result = subprocess.run(  # noqa: S603 - our own interpreter and a fixed script
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "loaded: []" in result.stdout.splitlines()
    assert "install metacrate-grid-agent[dbos]" in result.stdout
