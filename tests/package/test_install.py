"""The install section of the README works: the built wheel installs, with each extra, into
a clean virtual environment, and gives the command and the extra's module.

The wheel is built from this tree (``uv build``); each environment gets exactly the locked
versions (``uv export --locked`` as constraints). Needs uv and the package index, as the
README's install lines do.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from metacrate_grid_agent import __version__

ROOT: Final = Path(__file__).resolve().parents[2]
#: uv, found on PATH as the README's lines find it.
UV: Final = shutil.which("uv")
#: Bound on one uv step: a build takes seconds; an install from a warm cache, seconds too.
STEP_TIMEOUT_S: Final = 300
#: Each extra and the module it makes importable (none: the core alone).
EXTRAS: Final = {
    "": "metacrate_grid_agent",
    "otel": "metacrate_grid_agent.otel",
    "mcp": "metacrate_grid_agent.mcp",
    "otel-export": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
}


def _run(*args: str | Path, cwd: Path = ROOT) -> str:
    found = subprocess.run(  # noqa: S603 - uv and the new environment's own programs
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
        check=False,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr[-2000:]
    return found.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this tree."""
    assert UV is not None
    out = tmp_path_factory.mktemp("dist")
    _run(UV, "build", "--wheel", "--quiet", "-o", out)
    (built,) = out.glob("metacrate_grid_agent-*.whl")
    return built


@pytest.mark.slow
@pytest.mark.skipif(UV is None, reason="needs uv, as the README's install lines do")
@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_the_wheel_installs_with_each_extra_into_a_clean_environment(
    extra: str, wheel: Path, tmp_path: Path
) -> None:
    """``pip install 'WHEEL[extra]'`` into a fresh environment gives ``grid-agent --version``
    (this tree's version) and the extra's module imports."""
    assert UV is not None
    locked = tmp_path / "constraints.txt"
    extras = ["--extra", extra] if extra else []
    locked.write_text(
        _run(UV, "export", "--locked", "--no-default-groups", *extras, "--no-hashes",
             "--no-emit-project", "--quiet"),
        encoding="utf-8",
    )  # fmt: skip
    venv = tmp_path / "venv"
    _run(UV, "venv", "--quiet", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    wanted = f"{wheel}[{extra}]" if extra else str(wheel)
    _run(UV, "pip", "install", "--quiet", "--python", python, "-c", locked, wanted)
    assert _run(venv / "bin" / "grid-agent", "--version", cwd=tmp_path) == (
        f"grid-agent {__version__}\n"
    )
    _run(python, "-c", f"import {EXTRAS[extra]}", cwd=tmp_path)
