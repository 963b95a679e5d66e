"""The core never needs an optional extra: it imports, and runs, with the MCP SDK absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter in which every ``import mcp`` fails, as if the extra were
# not installed; prints what it found.
_PROBE = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    class _NoMcp:
        def find_spec(self, name, path=None, target=None):
            if name == "mcp" or name.startswith(("mcp.", "mcp_types")):
                raise ImportError("the mcp extra is not installed")
            return None

    sys.meta_path.insert(0, _NoMcp())
    import metacrate_grid_agent
    for info in pkgutil.iter_modules(metacrate_grid_agent.__path__, "metacrate_grid_agent."):
        if info.name not in ("metacrate_grid_agent.mcp", "metacrate_grid_agent.__main__"):
            importlib.import_module(info.name)
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("mcp", "mcp_types"))
    print("loaded:", loaded)
    try:
        import metacrate_grid_agent.mcp
    except ImportError as exc:
        print("adapter:", exc)
    """
)


def test_core_imports_without_the_mcp_extra() -> None:
    """Every core module imports with the MCP SDK missing, and the adapter says what to install.

    Protects: the ``mcp`` extra stays optional (no core module imports it, even indirectly),
    and a user who forgot it gets the install hint rather than a bare ModuleNotFoundError.
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
    lines = result.stdout.splitlines()
    assert "loaded: []" in lines
    assert "adapter: metacrate_grid_agent.mcp needs the optional MCP SDK: " in result.stdout
    assert "install metacrate-grid-agent[mcp]" in result.stdout
