"""Fixtures for the MCP tier; every module here skips itself when the extra is missing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.llm_transport.conftest import client_factory

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["client_factory"]


@pytest.fixture(params=["stdio", "http"])
def kind(request: pytest.FixtureRequest) -> str:
    """Each test runs against the server over stdio and over streamable HTTP."""
    return str(request.param)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    """Where the test server writes its event log."""
    return tmp_path / "events.log"
