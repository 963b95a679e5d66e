"""``grid-agent takeover``: hand a dead executor's pending durable sessions to the live fleet.

::

    grid-agent takeover EXECUTOR_ID [--database URL | --database-env NAME] [--queue NAME]
                        [--json] [--verbose]

Calls :func:`metacrate_grid_agent.dbos.take_over` (the ``dbos`` extra): the pending sessions
of executor ``EXECUTOR_ID``, and their pending approvals, go back on their queue in the
fleet's DBOS system database, where a live executor of the same application version picks
each up and resumes it from its journal. No workflow runs in this process.

The database URL comes from ``--database``, else from the environment variable named by
``--database-env``, else from ``DBOS_SYSTEM_DATABASE_URL`` (the variable DBOS itself reads).
It may hold a password: it is a secret, never printed (every line is scrubbed of it and of
its password), and ``--database-env`` keeps it off the command line (where other users of
the host can read it). Exit 0 when the takeover went through (also when there was nothing
to take), 1 when the database failed, 2 for a usage error (no URL, no ``dbos`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._common import EXIT_FAILURE, EXIT_OK, UsageError, usage_failure
from metacrate_grid_agent.cli._config import hide_secrets
from metacrate_grid_agent.cli._output import Console, RedactingFormatter
from metacrate_grid_agent.errors import JournalError

__all__ = ["DATABASE_ENV", "cmd_takeover"]

#: The environment variable read when neither --database nor --database-env is given: the
#: one DBOS itself (and its own command) reads for the system database.
DATABASE_ENV: Final = "DBOS_SYSTEM_DATABASE_URL"
#: DBOS's logger: its records (a failed connection) go through the command's redaction.
DBOS_LOGGER: Final = "dbos"
#: The queue the sessions go back on by default (``DurableSessions``'s default queue).
DEFAULT_QUEUE: Final = "grid_agent_sessions"
#: Longest executor id accepted (DBOS keeps it in a text column; ids are host names).
MAX_EXECUTOR_CHARS: Final = 256


def database_url(args: argparse.Namespace) -> str:
    """The system database's URL, from the command line or the environment."""
    if args.database is not None and args.database_env is not None:
        raise UsageError("name the database once: --database URL or --database-env NAME")
    if args.database is not None:
        url: str | None = args.database
        where = "--database"
    else:
        name = args.database_env or DATABASE_ENV
        url = os.environ.get(name)
        where = f"the environment variable {name}"
        if url is None:
            raise UsageError(
                f"no system database: {where} is not set (give --database URL, or "
                "--database-env NAME naming a variable that holds it)"
            )
    if url is None or not url.strip():
        raise UsageError(f"no system database: {where} is empty")
    return url


def secrets_of(url: str) -> list[str]:
    """What to scrub from every line: the URL itself and its password (as typed and
    decoded)."""
    found = [url]
    try:
        password = urlsplit(url).password
    except ValueError:  # a malformed port: the URL alone is scrubbed
        return found
    if password:
        found += [password, unquote(password)]
    return found


def _check_executor(executor_id: str) -> str:
    if not executor_id.strip():
        raise UsageError("EXECUTOR_ID is empty")
    if len(executor_id) > MAX_EXECUTOR_CHARS:
        raise UsageError(f"EXECUTOR_ID is longer than {MAX_EXECUTOR_CHARS} characters")
    return executor_id


@contextlib.contextmanager
def _dbos_logs(console: Console, *, verbose: bool) -> Iterator[None]:
    """DBOS's own log records, while the takeover runs: to stderr through the redaction with
    ``--verbose``, else nowhere (the command reports a failure itself); as they were after."""
    logger = logging.getLogger(DBOS_LOGGER)
    saved = (list(logger.handlers), logger.propagate)
    if verbose:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(RedactingFormatter(console.redactor))
    else:
        handler = logging.NullHandler()
    logger.handlers = [handler]
    logger.propagate = False
    try:
        yield
    finally:
        logger.handlers, logger.propagate = saved


def cmd_takeover(args: argparse.Namespace, console: Console) -> int:
    """``grid-agent takeover``: take the executor's pending sessions over, say which."""
    try:
        url = database_url(args)
        hide_secrets(console.redactor, secrets_of(url))
        executor_id = _check_executor(args.executor_id)
    except UsageError as exc:
        return usage_failure(console, args, str(exc))
    try:
        from metacrate_grid_agent import dbos  # noqa: PLC0415 - the optional extra
    except ImportError:
        return usage_failure(
            console,
            args,
            "takeover needs the dbos extra: pip install 'metacrate-grid-agent[dbos]'",
        )
    try:
        with _dbos_logs(console, verbose=bool(args.verbose)):
            taken = asyncio.run(dbos.take_over(url, executor_id, queue=args.queue))
    except JournalError as exc:
        if args.json:
            console.json(output.error_json(exc.kind, exc.message))
        else:
            console.err(f"grid-agent takeover: {exc.kind}: {output.printable(exc.message)}")
        return EXIT_FAILURE
    _report(console, args, executor_id, taken)
    return EXIT_OK


def _report(
    console: Console, args: argparse.Namespace, executor_id: str, taken: tuple[str, ...]
) -> None:
    """What was handed over (the sessions' workflow ids and their approvals'): one JSON
    object, or a line per workflow."""
    if args.json:
        data: dict[str, Any] = {"executor_id": executor_id, "queue": args.queue, "taken": taken}
        console.json(data)
        return
    shown = output.printable(executor_id)
    if not taken:
        console.out(f"no pending session of executor {shown}: nothing to take over")
        return
    console.out(
        f"took over {len(taken)} pending workflow(s) of executor {shown} (sessions and their "
        f"approvals): a live executor resumes each session from its journal "
        f"(queue {output.printable(args.queue)})"
    )
    for workflow in taken:
        console.out(f"  {output.printable(workflow)}")
