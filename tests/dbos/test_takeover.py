"""``grid-agent takeover`` and ``take_over()``: a dead executor's pending sessions go to a
live one; the system database's URL (it may hold a password) is never printed.

The fleet test kills executor A inside a read-only call (tests/dbos/worker.py, a real
child process and SIGKILL), take its session over with the command, and let executor B,
another process, resume it from the journal: the end is the uncrashed one, each mutating
call ran once. The others run the command in this process against databases that fail
(SQLite files, a closed port).
"""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING, Any, Final

import pytest
import sqlalchemy as sa

from metacrate_grid_agent.cli import main
from metacrate_grid_agent.dbos import take_over
from metacrate_grid_agent.errors import JournalError
from tests.dbos.crash import finish, kill_inside, ledger, spawn
from tests.dbos.worker import FINAL_TEXT

if TYPE_CHECKING:
    from pathlib import Path

RUN_ID: Final = "avatar-7-g1-r1"
#: The variable the tests hand the URL in (``--database-env``).
URL_ENV: Final = "GRID_AGENT_TEST_SYSTEM_DATABASE"
#: A password that must never be printed.
PASSWORD: Final = "pw-CANARY-7d1e9b40c2"
#: A loopback port nothing listens on (the discard port needs root to bind, and no test
#: machine runs a discard server): the connection is refused at once.
CLOSED_PORT: Final = 9


def takeover(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``grid-agent takeover ARGS`` in this process: status, stdout, stderr."""
    status = main(["takeover", *args])
    out, err = capsys.readouterr()
    return status, out, err


def with_password(url: str) -> str:
    """``url`` (a Postgres URL as the suite's cluster gives it) with :data:`PASSWORD`: the
    cluster trusts loopback, so the password is sent and ignored."""
    return sa.make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_the_command_hands_a_dead_executors_session_to_a_live_one(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Executor A dies (SIGKILL) inside ``look``; ``grid-agent takeover executor-a`` names
    the session it handed over; executor B, started afterwards, picks it off the queue and
    ends it as uncrashed: ``build`` ran once. A second takeover finds nothing.

    Protects: the operator's command (and ``take_over()`` under it, from a process that runs
    no workflow and builds no loop) that resumes a dead executor's pending sessions on a
    live one, on the fleet's database (Postgres, with a password in the URL: never printed;
    the command's failures are tested on SQLite below, in the fast tier).
    """
    url = with_password(database_url)
    (tmp_path / "hang").write_text("look")
    kill_inside(spawn("start", url, tmp_path), tmp_path)
    monkeypatch.setenv(URL_ENV, url)
    status, out, err = takeover(
        capsys, "executor-a", "--database-env", URL_ENV, "--json", "--verbose"
    )
    assert (status, err) == (0, "")
    assert json.loads(out) == {
        "executor_id": "executor-a",
        "queue": "grid_agent_sessions",
        "taken": [RUN_ID],
    }
    done = finish(spawn("recover", url, tmp_path, "--run", RUN_ID, "--executor", "executor-b"))
    assert done["outcome"]["outcome"] == "completed"
    assert done["outcome"]["final_text"] == FINAL_TEXT
    assert ledger(tmp_path) == ["look", "look", "build"]
    status, out, err = takeover(capsys, "executor-a", "--database-env", URL_ENV)
    assert status == 0
    assert out == "no pending session of executor executor-a: nothing to take over\n"
    assert PASSWORD not in out + err


def test_no_database_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --database, --database-env or DBOS_SYSTEM_DATABASE_URL: status 2, saying
    where the URL is looked for; an empty variable is refused too."""
    monkeypatch.delenv("DBOS_SYSTEM_DATABASE_URL", raising=False)
    status, out, err = takeover(capsys, "host-17")
    assert (status, out) == (2, "")
    assert "DBOS_SYSTEM_DATABASE_URL is not set" in err
    monkeypatch.setenv(URL_ENV, " ")
    status, out, err = takeover(capsys, "host-17", "--database-env", URL_ENV, "--json")
    assert status == 2
    assert json.loads(out)["kind"] == "configuration"
    assert f"{URL_ENV} is empty" in json.loads(out)["message"]


def test_a_missing_sqlite_file_is_refused_and_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SQLite URL naming no file: status 1 (a journal error, nothing taken over), and no
    empty database left behind (SQLite would create one)."""
    path = tmp_path / "system.sqlite"
    status, out, err = takeover(capsys, "host-17", "--database", f"sqlite:///{path}", "--json")
    assert (status, err) == (1, "")
    answer = json.loads(out)
    assert answer["kind"] == "journal"
    assert "does not exist" in answer["message"]
    assert not path.exists()


def test_a_database_that_is_not_a_dbos_one_fails_with_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An SQLite file DBOS never set up: status 1, a journal error naming no path or
    statement, and the file left as it was."""
    path = tmp_path / "other.sqlite"
    sqlite3.connect(path).close()
    before = path.read_bytes()
    status, out, err = takeover(capsys, "host-17", "--database", f"sqlite:///{path}")
    assert (status, out) == (1, "")
    assert err.startswith("grid-agent takeover: journal: the system database failed (")
    assert str(path) not in err
    assert path.read_bytes() == before


@pytest.mark.parametrize("extra", [[], ["--json"], ["--verbose"]])
def test_a_password_in_the_url_is_never_printed(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A Postgres URL with a password, on a port where nothing listens: status 1, and the
    password (nor the URL) appears in no output, with --json or --verbose (DBOS's own log
    records) either."""
    url = f"postgresql://grid:{PASSWORD}@127.0.0.1:{CLOSED_PORT}/grid"
    status, out, err = takeover(capsys, "host-17", "--database", url, *extra)
    assert status == 1
    assert PASSWORD not in out + err
    assert PASSWORD[-10:] not in out + err
    assert "127.0.0.1" not in out + err or "--verbose" in extra


async def test_take_over_raises_a_journal_error_without_the_url() -> None:
    """The library call: an unreachable database is a JournalError (a typed error, never
    the driver's own) whose message holds neither the URL nor its password."""
    url = f"postgresql://grid:{PASSWORD}@127.0.0.1:{CLOSED_PORT}/grid"
    with pytest.raises(JournalError) as caught:
        await take_over(url, "host-17")
    shown: Any = (str(caught.value), repr(caught.value), caught.value.message)
    assert all(PASSWORD not in text and url not in text for text in shown)
    assert caught.value.__cause__ is None


def test_a_usage_error_does_not_echo_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    """A command line argparse refuses (an unknown option, the executor missing) exits 2
    without echoing the URL given with --database."""
    url = f"postgresql://grid:{PASSWORD}@127.0.0.1:{CLOSED_PORT}/grid"
    for argv in (["takeover", "--database", url], ["takeover", "h", "--database", url, url]):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        out, err = capsys.readouterr()
        assert stopped.value.code == 2
        assert err.startswith("usage: grid-agent")
        assert PASSWORD not in out + err
