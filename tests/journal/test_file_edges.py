"""The file journal's directory and lines are edges too: what an operator or another program
leaves there (a symbolic link, a FIFO, a stray file, a second writer) gives a typed error or
is passed over, never a write through a link, a hang or a traceback; and no line holds the key.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent.errors import JournalError, JournalLockedError
from metacrate_grid_agent.journal import Call, FileJournal, Result, decode_record
from metacrate_grid_agent.journal._format import LineWriter
from tests.journal.scenario import KEY, RUN_ID, SESSION
from tests.journal.test_resume import _lines, _run_uncrashed

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(scope="module")
def journaled(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The journal lines of the uncrashed scripted run."""
    import asyncio

    directory = tmp_path_factory.mktemp("uncrashed")
    asyncio.run(_run_uncrashed(directory))
    return _lines(directory)


def test_a_directory_that_is_a_symbolic_link_or_a_file_is_refused(tmp_path: Path) -> None:
    """The journal directory is never reached through a symbolic link, and a file in its
    place is refused, both as a JournalError saying so."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    os.symlink(real, link)
    with pytest.raises(JournalError, match="symbolic link is not followed"):
        FileJournal(link)
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(JournalError, match="not a directory"):
        FileJournal(plain)
    assert os.listdir(real) == []


def test_a_new_directory_is_made_private(tmp_path: Path) -> None:
    """A missing directory is created 0700; the journal's repr names only its path."""
    journal = FileJournal(tmp_path / "new", secret=KEY)
    assert os.stat(tmp_path / "new").st_mode & 0o777 == 0o700
    assert journal.directory == str(tmp_path / "new")
    assert KEY not in repr(journal)


async def test_run_ids_that_are_not_run_ids_are_refused(tmp_path: Path) -> None:
    """A run id must be <session>-g<generation>-r<run>: a path, an empty id or any other
    shape is refused before a file is opened."""
    journal = FileJournal(tmp_path)
    for bad in ("../escape-g0-r1", "", "avatar", "a/b-g0-r1"):
        with pytest.raises(JournalError, match="a run id is"):
            await journal.claim(bad)
    assert os.listdir(tmp_path) == []


async def test_a_run_without_a_journal_says_so(tmp_path: Path) -> None:
    """Claiming a run that has no file here is a JournalError naming the run."""
    with pytest.raises(JournalError, match="has no journal here") as caught:
        await FileJournal(tmp_path).claim(RUN_ID)
    assert caught.value.run_id == RUN_ID


async def test_a_fifo_in_place_of_a_journal_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO named like a run's journal is refused (opened without blocking) and passed
    over by ``pending``."""
    os.mkfifo(tmp_path / f"{RUN_ID}.journal")
    journal = FileJournal(tmp_path)
    with pytest.raises(JournalError, match="not a regular file"):
        await journal.claim(RUN_ID)
    assert await journal.pending() == ()


async def test_pending_lists_only_unfinished_runs_and_passes_over_strays(
    journaled: list[str], tmp_path: Path
) -> None:
    """``pending`` names the runs whose journal has no finish, sorted, and passes over a
    finished run, files that are not journals and names that are not run ids."""
    (tmp_path / f"{RUN_ID}.journal").write_text("".join(journaled))
    cut = RUN_ID.replace("-r1", "-r2")
    (tmp_path / f"{cut}.journal").write_text("".join(journaled[:5]))
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "not a run.journal").write_text("x")
    (tmp_path / "headless-g0-r1.journal").write_text("no line end")
    journal = FileJournal(tmp_path)
    assert await journal.pending() == (cut, "headless-g0-r1")


async def test_an_empty_or_foreign_journal_is_refused(journaled: list[str], tmp_path: Path) -> None:
    """A journal with no record (the process died before anything was durable) and one whose
    header is another run's are typed errors, not resumed."""
    journal = FileJournal(tmp_path)
    (tmp_path / f"{RUN_ID}.journal").write_text("")
    with pytest.raises(JournalError, match="holds no record"):
        await journal.claim(RUN_ID)
    other = RUN_ID.replace("-g0-", "-g5-")
    (tmp_path / f"{other}.journal").write_text("".join(journaled))
    with pytest.raises(JournalError, match="of another run"):
        await journal.claim(other)


async def test_a_second_claim_in_the_same_process_is_locked_out(
    journaled: list[str], tmp_path: Path
) -> None:
    """The run's lock is per open file: a second claim, even from the same process, gets
    ``journal_locked`` until the first closes; closing twice is harmless."""
    (tmp_path / f"{RUN_ID}.journal").write_text("".join(journaled[:5]))
    journal = FileJournal(tmp_path)
    run, records = await journal.claim(RUN_ID)
    assert len(records) == 5
    assert "open=True" in repr(run)
    with pytest.raises(JournalLockedError):
        await journal.claim(RUN_ID)
    await run.close()
    await run.close()
    assert "open=False" in repr(run)
    with pytest.raises(JournalError, match="closed"):
        await run.append(records[1])
    again, _ = await journal.claim(RUN_ID)
    await again.close()


async def test_the_newest_generation_is_read_from_its_file(
    journaled: list[str], tmp_path: Path
) -> None:
    """A session with no generation file has none; a claim records the run's generation."""
    journal = FileJournal(tmp_path)
    assert await journal.newest_generation(SESSION) is None
    (tmp_path / f"{RUN_ID}.journal").write_text("".join(journaled[:5]))
    run, _ = await journal.claim(RUN_ID)
    await run.close()
    assert await journal.newest_generation(SESSION) == 0


def test_a_record_holding_the_key_is_written_with_the_key_redacted() -> None:
    """A record whose text holds the key (an executor's observation echoing it, say) is
    written redacted in both halves of its line, the display and the full record, in any
    of the key's echoed forms; the line still reads back as a record."""
    writer = LineWriter.for_secret(KEY)
    echoed = f"token={KEY} json={json.dumps(KEY)[1:-1]} upper={KEY.upper()}"
    call = Call(t=1.0, call_id="c1", name="look", arguments="{}", effect="read_only")
    writer.line(call)
    line = writer.line(
        Result(t=2.0, call_id="c1", status="success", observation=echoed, latency_s=0.1)
    )
    assert KEY.encode() not in line
    assert KEY.upper().encode() not in line
    kept = decode_record(json.dumps(json.loads(line)["j"]).encode())
    assert isinstance(kept, Result)
    assert "[REDACTED]" in kept.observation
    assert KEY not in kept.observation


def test_a_record_with_text_that_is_not_utf8_is_a_typed_error() -> None:
    """A lone surrogate (text no UTF-8 can hold) makes the record unwritable: a
    JournalError, so the action it gates does not run."""
    writer = LineWriter.for_secret(KEY)
    with pytest.raises(JournalError, match="could not be encoded"):
        writer.line(
            Result(t=1.0, call_id="c1", status="success", observation="\ud800", latency_s=0.0)
        )


@pytest.mark.parametrize("key", ['sk-quote"inside-9f3a7c1e5b', "sk-back\\slash-4d2e8a6b1c"])
def test_a_key_json_escapes_is_found_and_redacted_in_a_line(key: str) -> None:
    """A key holding a character JSON escapes (a quote, a backslash: printable ASCII, so a
    valid key) is found in the line as JSON writes it, and redacted: neither the line's
    bytes nor any text decoded from it holds the key."""
    writer = LineWriter.for_secret(key)
    writer.line(Call(t=1.0, call_id="c1", name="look", arguments="{}", effect="read_only"))
    line = writer.line(
        Result(t=2.0, call_id="c1", status="success", observation=f"echo {key}", latency_s=0.1)
    )
    assert json.dumps(key)[1:-1].encode() not in line
    assert not [text for text in _strings(json.loads(line)) if key in text]


def _strings(data: object) -> list[str]:
    """Every string in decoded JSON, keys and values."""
    if isinstance(data, str):
        return [data]
    if isinstance(data, dict):
        return [s for k, v in data.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(data, list):
        return [s for item in data for s in _strings(item)]
    return []
