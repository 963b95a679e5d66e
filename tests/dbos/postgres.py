"""A throwaway PostgreSQL cluster for the DBOS tier, started by the suite itself.

The cluster comes from the server binaries of Debian's ``postgresql`` package (``initdb`` and
``pg_ctl``, found on ``PATH`` or under ``/usr/lib/postgresql/<major>/bin``). It lives in a
temporary directory, listens on a free loopback port (and a socket in that directory only),
trusts local connections (nothing but this machine's loopback reaches it) and is stopped and
removed at the end. ``initdb`` refuses to run as root: as root, the cluster is made and run as
the ``postgres`` user, which owns the directory.

Without the binaries, or when the cluster does not start, the tier is skipped with the reason;
with ``GRID_AGENT_POSTGRES=required`` (CI) that is a failure instead.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Set to ``required`` to fail, rather than skip, when Postgres cannot start.
REQUIRED_ENV: Final = "GRID_AGENT_POSTGRES"
#: The account that owns and runs the cluster when the suite runs as root.
POSTGRES_USER: Final = "postgres"
#: Bound on ``initdb`` (a few seconds on a busy two-core machine).
INITDB_DEADLINE_S: Final = 120.0
#: Bound on the server's start and on its stop, ``pg_ctl``'s own wait.
PG_CTL_WAIT_S: Final = 60
#: Starts tried when the chosen port was taken before the server bound it.
START_ATTEMPTS: Final = 3
#: Where Debian installs each major version's server binaries.
DEBIAN_BINARIES: Final = Path("/usr/lib/postgresql")


def give_up(reason: str) -> NoReturn:
    """Skip the test, or fail it when the tier is required (CI)."""
    if os.environ.get(REQUIRED_ENV) == "required":
        pytest.fail(f"{REQUIRED_ENV}=required, but {reason}", pytrace=False)
    pytest.skip(reason)


def server_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: on PATH, else Debian's newest major."""
    on_path = shutil.which("initdb")
    if on_path is not None and shutil.which("pg_ctl") is not None:
        return Path(on_path).parent
    majors = sorted(
        (p for p in DEBIAN_BINARIES.glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return majors[-1] if majors else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@dataclass(frozen=True)
class Postgres:
    """A running cluster: where it listens, and the URL of a fresh database on it."""

    port: int
    folder: Path

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy URL (psycopg 3) to ``database`` as the superuser, over loopback."""
        return f"postgresql+psycopg://{POSTGRES_USER}@127.0.0.1:{self.port}/{database}"


class _Cluster:
    """Runs the cluster's commands, as the ``postgres`` user when the suite is root."""

    def __init__(self, binaries: Path, folder: Path) -> None:
        self.binaries = binaries
        self.folder = folder
        self.data = folder / "data"
        self.log = folder / "server.log"
        self.as_root = os.geteuid() == 0

    def run(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", POSTGRES_USER, "--"] if self.as_root else []
        return subprocess.run(  # noqa: S603  (the server's own binaries, fixed arguments)
            [*prefix, str(self.binaries / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.folder,
            env={**os.environ, "LC_ALL": "C", "PGTZ": "UTC", "TZ": "UTC"},
        )

    def initdb(self) -> str | None:
        """The reason the cluster could not be made, or None."""
        if self.as_root:
            try:
                account = pwd.getpwnam(POSTGRES_USER)
            except KeyError:
                return f"running as root and there is no {POSTGRES_USER!r} account to run initdb"
            os.chown(self.folder, account.pw_uid, account.pw_gid)
        done = self.run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            POSTGRES_USER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
            timeout=INITDB_DEADLINE_S,
        )
        if done.returncode != 0:
            return f"initdb failed ({done.returncode}): {done.stderr.strip()[-500:]}"
        return None

    def start(self, port: int) -> bool:
        options = " ".join(
            (
                f"-p {port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.folder}",
                # The cluster lives for one test run: crash tests kill the client, not the
                # server, so skipping the server's own disk syncs changes no outcome.
                "-c fsync=off",
                "-c max_connections=200",
            )
        )
        done = self.run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            str(PG_CTL_WAIT_S),
            "start",
            timeout=PG_CTL_WAIT_S + 10,
        )
        return done.returncode == 0

    def stop(self) -> None:
        """Stop the server (immediate mode); if ``pg_ctl`` fails or overruns, kill the
        postmaster named in its pid file, so no server outlives the run."""
        try:
            done = self.run(
                "pg_ctl",
                "-D",
                str(self.data),
                "-m",
                "immediate",
                "-w",
                "-t",
                str(PG_CTL_WAIT_S),
                "stop",
                timeout=PG_CTL_WAIT_S + 10,
            )
            if done.returncode == 0:
                return
        except subprocess.TimeoutExpired:
            pass
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            return
        if str(self.data).encode() in command:  # that pid is still this cluster's server
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text("utf-8", errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])


def start_postgres() -> Iterator[Postgres]:
    """Make, start, yield, then stop and remove a throwaway cluster (a fixture's body)."""
    binaries = server_binaries()
    if binaries is None:
        give_up(
            "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: install "
            "Debian's postgresql package to run the Postgres tier"
        )
    # Not under pytest's own temporary root: that one is private to this user, and the
    # postgres account must reach its directory.
    folder = Path(tempfile.mkdtemp(prefix="grid-agent-pg-"))
    cluster = _Cluster(binaries, folder)
    try:
        reason = cluster.initdb()
        if reason is not None:
            give_up(reason)
        for _attempt in range(START_ATTEMPTS):
            port = _free_port()
            if cluster.start(port):
                try:
                    yield Postgres(port=port, folder=folder)
                finally:
                    cluster.stop()
                return
            if "address already in use" not in cluster.log_tail().lower():
                break
        pytest.fail(f"PostgreSQL did not start:\n{cluster.log_tail()}", pytrace=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
