"""Fixtures of the DBOS tier: a throwaway Postgres cluster for the whole run, and a fresh
database per test on it or on SQLite."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import pytest

from tests.dbos.postgres import Postgres, start_postgres

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytest.importorskip("dbos", reason="the DBOS tier needs the dbos extra: uv sync --extra dbos")

#: Numbers the databases made on the cluster during one run.
_DATABASES = itertools.count(1)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A Postgres cluster on a free loopback port, stopped and removed at the end of the run."""
    yield from start_postgres()


def fresh_postgres_database(postgres: Postgres) -> str:
    """A new, empty database on the cluster: its URL (as DBOS takes it)."""
    import psycopg

    name = f"grid_agent_test_{next(_DATABASES)}"
    with psycopg.connect(
        host="127.0.0.1", port=postgres.port, user="postgres", dbname="postgres", autocommit=True
    ) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    return postgres.url(name)


def drop_postgres_database(postgres: Postgres, url: str) -> None:
    """Drop the database of ``url`` (made by :func:`fresh_postgres_database`): a run makes
    about a hundred, each a copy of the template, and the cluster's folder is removed at
    the end."""
    import psycopg
    import sqlalchemy as sa

    name = sa.make_url(url).database
    with psycopg.connect(
        host="127.0.0.1", port=postgres.port, user="postgres", dbname="postgres", autocommit=True
    ) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh system database for one test: a SQLite file, or a database on the cluster
    (dropped after the test)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'system.sqlite'}"
        return
    postgres: Postgres = request.getfixturevalue("postgres")
    url = fresh_postgres_database(postgres)
    yield url
    drop_postgres_database(postgres, url)
