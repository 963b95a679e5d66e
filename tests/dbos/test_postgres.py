"""The throwaway Postgres cluster itself: the DBOS tier's tests stand on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.dbos.postgres import Postgres

pytestmark = pytest.mark.slow


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
