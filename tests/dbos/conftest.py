"""Fixtures of the DBOS tier: a throwaway Postgres cluster for the whole run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.dbos.postgres import Postgres, start_postgres

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A Postgres cluster on a free loopback port, stopped and removed at the end of the run."""
    yield from start_postgres()
