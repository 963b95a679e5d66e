"""``dbos_config`` pins what a deploy decides about pending sessions: the application
version, the serializer, the executor id."""

from __future__ import annotations

from metacrate_grid_agent import __version__
from metacrate_grid_agent.dbos import MsgspecJSON, application_version, dbos_config


def test_the_application_version_is_the_packages_not_a_hash_of_the_code() -> None:
    """DBOS runs a pending workflow only on an executor of the same application version: the
    configuration pins it to ``grid-agent-<package version>`` (plus the operator's suffix
    for their own tools and prompts), so a deploy that changes neither keeps the pending
    sessions resumable, as the DBOS guide says.

    Protects: DBOS's default version (a hash of the workflow code) would strand every
    pending session on any release of either library.
    """
    assert application_version() == f"grid-agent-{__version__}"
    assert application_version("tools-3") == f"grid-agent-{__version__}+tools-3"
    config = dbos_config(name="harbour", database_url="sqlite:///x.sqlite", version_suffix="b")
    assert config["application_version"] == f"grid-agent-{__version__}+b"


def test_the_configuration_stores_json_and_names_the_executor_only_when_given() -> None:
    """Workflows' data go through :class:`MsgspecJSON` (never pickle); the system database
    is the URL given; the executor id is set only when given (DBOS's default otherwise)."""
    url = "postgresql://grid@db.internal:5432/grid_agent"
    config = dbos_config(name="harbour", database_url=url)
    assert isinstance(config["serializer"], MsgspecJSON)
    assert config["system_database_url"] == url
    assert config["name"] == "harbour"
    assert "executor_id" not in config
    assert (
        dbos_config(name="harbour", database_url=url, executor_id="host-17")["executor_id"]
        == "host-17"
    )
