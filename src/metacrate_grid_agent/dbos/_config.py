"""DBOS's configuration for durable sessions: the serializer and the pinned version.

DBOS runs a pending workflow only on an executor of the same *application version*, and it
computes that version from the workflows' source code unless told. :func:`dbos_config` pins
it to this package's version (plus the operator's own suffix, for their tools and prompts),
so that a deploy that does not change either leaves pending sessions to the new executors,
and one that does leaves them to executors still on the old version: see the durable
sessions guide for what a deploy does to pending sessions.
"""

from __future__ import annotations

from dbos import DBOSConfig
from metacrate_grid_agent._version import __version__
from metacrate_grid_agent.dbos._serializer import MsgspecJSON

__all__ = ["application_version", "dbos_config"]


def application_version(suffix: str = "") -> str:
    """``grid-agent-<package version>``, then ``+<suffix>`` when one is given."""
    version = f"grid-agent-{__version__}"
    return f"{version}+{suffix}" if suffix else version


def dbos_config(
    *,
    name: str,
    database_url: str,
    executor_id: str | None = None,
    version_suffix: str = "",
    log_level: str = "WARNING",
) -> DBOSConfig:
    """A DBOS configuration for durable sessions: the system database (``postgresql://...``
    or ``sqlite:///path``), msgspec JSON instead of pickle, the application version pinned
    (:func:`application_version`), and this process's executor id (unique per process of
    the fleet; DBOS's default, ``local``, suits one process alone)."""
    config: DBOSConfig = {
        "name": name,
        "system_database_url": database_url,
        "serializer": MsgspecJSON(),
        "application_version": application_version(version_suffix),
        "log_level": log_level,
    }
    if executor_id is not None:
        config["executor_id"] = executor_id
    return config
