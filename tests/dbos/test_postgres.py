"""The throwaway Postgres cluster itself: the DBOS tier's tests stand on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.dbos.postgres import Postgres


@pytest.mark.slow
def test_the_cluster_answers_on_loopback(postgres: Postgres) -> None:
    """The suite's own cluster accepts a connection on 127.0.0.1 and runs a query.

    Protects: the Postgres tier runs against a real server started by the suite (initdb as
    the postgres account when the suite is root), not against a fake or an outside host.
    """
    psycopg = pytest.importorskip("psycopg", reason="the dbos extra brings psycopg")
    with psycopg.connect(
        host="127.0.0.1", port=postgres.port, user="postgres", dbname="postgres"
    ) as connection:
        row = connection.execute("SELECT 1 + 1, current_setting('listen_addresses')").fetchone()
    assert row == (2, "127.0.0.1")


def test_without_postgres_the_tier_skips_saying_why_unless_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where Postgres cannot start, the tier is skipped with the reason; with
    ``GRID_AGENT_POSTGRES=required`` (CI) the same reason fails it.

    Protects: CI never passes with the Postgres half silently skipped.
    """
    from tests.dbos.postgres import REQUIRED_ENV, give_up

    monkeypatch.delenv(REQUIRED_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="initdb is missing"):
        give_up("initdb is missing")
    monkeypatch.setenv(REQUIRED_ENV, "required")
    with pytest.raises(pytest.fail.Exception, match="GRID_AGENT_POSTGRES=required, but initdb"):
        give_up("initdb is missing")
