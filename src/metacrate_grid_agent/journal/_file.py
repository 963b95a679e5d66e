"""The embedded journal: :class:`FileJournal`, one file per run in a directory.

Files. The run ``<session>-g<gen>-r<run>`` is journaled in ``<run id>.journal`` (mode 0600,
created exclusively, opened relative to the directory's descriptor with ``O_NOFOLLOW``: never
through a symbolic link), one line per record (:mod:`._format`), appended with one
``write`` each: a record survives the death of the process as soon as ``append`` returns.
``commit`` then calls ``fdatasync`` (and, on a run's first commit, ``fsync`` on the
directory, so the file's name is durable too): the only syncs are a mutating call's intent
and the finish. Each session also has ``<session>.generation``, the newest generation that
created or claimed one of its runs (written, not synced).

Descriptors. An open run holds one descriptor, its file (the lock); the directory and the
generation file are opened when needed and closed at once. A process running N journaled
sessions needs N descriptors for them, besides its connections: raise ``ulimit -n`` for
more than about a thousand (opening past the limit is a
:class:`~metacrate_grid_agent.errors.JournalError` saying so, before any action).

Exclusivity. ``create`` and ``claim`` take ``flock(LOCK_EX | LOCK_NB)`` on the run's file
and hold it until ``close`` (or the process's death: the kernel releases it). A second
process gets :class:`~metacrate_grid_agent.errors.JournalLockedError` and does nothing. A
stopped process keeps its lock, so nobody takes its run over while it lives.

Fencing. Before committing a mutating intent, the run reads its session's generation file:
if a newer generation has started since (the operator replaced the session while this
process was stopped or cut off), the commit raises
:class:`~metacrate_grid_agent.errors.JournalFencedError` without writing, and the call does
not run.

Writes are synchronous (one short ``write`` per record, done in the calling task: the page
cache takes it at once). A sync, and a run's file creation (which waits for the file
system's own journal while other runs sync), run on the process's journal threads
(:data:`SYNC_THREADS`) while the event loop serves other sessions; the commit returns once
the sync has (if it fails, the commit raises and the action it guards does not run).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import os
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, TypeVar

from metacrate_grid_agent._aio._journal import JournalRun
from metacrate_grid_agent._core._journal import Call, Header, Record, parse_run_id
from metacrate_grid_agent.config import Secret
from metacrate_grid_agent.errors import JournalError, JournalFencedError, JournalLockedError
from metacrate_grid_agent.journal._format import MAX_JOURNAL_BYTES, LineWriter, read_records

__all__ = ["SUFFIX", "FileJournal", "FileJournalRun"]

#: The name of a run's journal file: ``<run id>`` and this.
SUFFIX: Final = ".journal"
#: The name of a session's generation file: ``<session id>`` and this.
GENERATION_SUFFIX: Final = ".generation"
_OPEN: Final = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
_MODE: Final = 0o600
_READ: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Largest generation file read (a decimal integer).
_GENERATION_BYTES: Final = 32
_T = TypeVar("_T")
_FINISH_PREFIX: Final = b'{"type":"finish"'
#: Threads that sync journals, shared by every run of the process: concurrent syncs of
#: different runs reach the disk together (the file system folds them into one commit), so
#: a thousand sessions' intents are not made durable one after another; more wait in line.
#: Sixteen keep a thousand sessions' records/s (64 measured no faster: the disk folds
#: what is pending into each commit) and each thread costs memory (its stack, its
#: interpreter state and frame stack).
SYNC_THREADS: Final = 16
_SYNCER: list[ThreadPoolExecutor] = []
_SYNCER_LOCK: Final = threading.Lock()


def _syncer() -> ThreadPoolExecutor:
    """The process's sync threads (started on first use; idle threads cost no CPU)."""
    if not _SYNCER:
        with _SYNCER_LOCK:
            if not _SYNCER:
                _SYNCER.append(
                    ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="grid-agent-journal-sync")
                )
    return _SYNCER[0]


# A child process forked after the threads started has none of them: it starts its own.
os.register_at_fork(after_in_child=_SYNCER.clear)


async def _done(pending: Future[_T]) -> _T:
    """Wait for a journal thread's work; a cancelled wait leaves it running (its outcome
    then read by whoever cleans up)."""
    waiter = asyncio.wrap_future(pending)
    waiter.add_done_callback(_read_outcome)
    return await asyncio.shield(waiter)


def _read_outcome(waiter: asyncio.Future[Any]) -> None:
    if not waiter.cancelled():
        waiter.exception()


def _open_dir(path: str) -> int:
    """A descriptor of the directory ``path`` (never through a symbolic link), for one use."""
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            why = "not a directory (a symbolic link is not followed)"
        raise JournalError(f"cannot open the journal directory: {why}") from None


def _sync(fd: int, directory: str | None) -> None:
    """Make the run's file durable, and its name (in ``directory``) on its first sync: the
    directory is opened here, so a sync waiting for a thread holds no descriptor of its
    own."""
    os.fdatasync(fd)
    if directory is not None:
        dir_fd = _open_dir(directory)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _refused(run_id: str, exc: OSError) -> JournalError:
    if exc.errno == errno.ELOOP:
        why = "it is a symbolic link; refusing to write through it"
    elif exc.errno in (errno.EMFILE, errno.ENFILE):
        why = (
            "too many open files (each running journaled session holds one descriptor: "
            "raise the process's limit, ulimit -n, above the sessions plus connections)"
        )
    else:
        why = exc.strerror or type(exc).__name__
    return JournalError(f"run {run_id}: cannot open its journal: {why}", run_id=run_id)


class FileJournalRun:
    """One run's journal file, held under its lock (see :class:`FileJournal`)."""

    __slots__ = (
        "_dir_synced", "_directory", "_fd", "_generation", "_pending", "_run_id",
        "_session_id", "_writer", "syncs",
    )  # fmt: skip

    def __init__(
        self,
        fd: int,
        directory: str,
        header: Header,
        writer: LineWriter,
        *,
        new: bool,
    ) -> None:
        self._fd: int | None = fd
        self._directory = directory
        # What the run needs of its header, not the header (its configuration, tools and
        # history would stay in memory as long as the session runs).
        self._run_id = header.run_id
        self._session_id = header.session_id
        self._generation = header.generation
        self._writer = writer
        self._dir_synced = not new
        self._pending: Future[None] | None = None
        self.syncs = 0
        """How many times the journal was made durable (one per commit)."""

    def __repr__(self) -> str:
        return f"FileJournalRun({self.run_id!r}, open={self._fd is not None})"

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self._run_id

    async def append(self, record: Record) -> None:
        """Write ``record``'s line (one ``write``); see :class:`~._journal.JournalRun`."""
        self._write(record)

    def append_now(self, record: Record) -> None:
        """:meth:`append` as a plain call (it never waits): the loop's recorder uses it,
        saving a coroutine per record (and a frame: the write is inlined here)."""
        fd = self._fd
        if fd is None:
            raise JournalError(f"run {self.run_id}: its journal is closed", run_id=self.run_id)
        line = self._writer.line(record)
        try:
            written = os.write(fd, line)  # _write_all's first write, inlined
        except OSError as exc:
            raise _not_written(self._run_id, exc) from None
        if written < len(line):
            _write_all(fd, line[written:], self._run_id)

    async def commit(self, record: Record) -> None:
        """Write ``record`` and ``fdatasync`` (off the event loop); a mutating intent is
        fenced first. Returns once the sync has; cancelled while it runs, it raises and the
        sync still finishes (``close`` waits for it)."""
        if isinstance(record, Call) and record.mutating:
            newest = self._newest_generation()
            if newest is not None and newest > self._generation:
                raise JournalFencedError(
                    f"run {self.run_id}: generation {newest} of the session started since "
                    f"this run (generation {self._generation}) began; call "
                    f"{record.call_id} was not run",
                    run_id=self.run_id,
                )
        fd = self._write(record)
        pending = _syncer().submit(_sync, fd, None if self._dir_synced else self._directory)
        self._pending = pending
        try:
            await _done(pending)
        except (OSError, JournalError) as exc:
            why = exc.message if isinstance(exc, JournalError) else exc.strerror
            raise JournalError(
                f"run {self.run_id}: the journal could not be made durable "
                f"({why or type(exc).__name__}); the action was not taken",
                run_id=self.run_id,
            ) from None
        self._dir_synced = True
        self.syncs += 1

    async def close(self) -> None:
        """Wait for a sync still running, release the lock and close the files; idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        pending, self._pending = self._pending, None
        try:
            if pending is not None and not pending.done():
                with contextlib.suppress(OSError, JournalError):
                    await _done(pending)
        finally:
            os.close(fd)  # releases the flock

    def _newest_generation(self) -> int | None:
        """The session's generation file, read now (reopened: a few microseconds against
        the sync that follows, and one descriptor per open run instead of three)."""
        session_id = self._session_id
        try:
            dir_fd = _open_dir(self._directory)
            try:
                fd = os.open(session_id + GENERATION_SUFFIX, _READ, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _refused(session_id, exc) from None
        try:
            _require_regular(fd, f"session {session_id}: its generation file")
            return _read_generation(fd)
        finally:
            os.close(fd)

    def _write(self, record: Record) -> int:
        fd = self._fd
        if fd is None:
            raise JournalError(f"run {self.run_id}: its journal is closed", run_id=self.run_id)
        _write_all(fd, self._writer.line(record), self._run_id)
        return fd


class FileJournal:
    """Durable sessions in a directory: one journal file per run, mode 0600.

    Pass it as ``journal`` to :meth:`ToolLoop.run <metacrate_grid_agent.ToolLoop.run>` and
    to :meth:`ToolLoop.resume <metacrate_grid_agent.ToolLoop.resume>`. ``directory`` is
    created (mode 0700) if missing and is never followed if it is a symbolic link.
    ``secret`` is the key to redact from every record (pass ``llm_config.api_key``).
    The journal holds prompts, replies, arguments and results: user data.
    """

    def __init__(self, directory: str | os.PathLike[str], *, secret: Secret | str | None = None):
        self._path = os.fspath(directory)
        # One key guard for all its runs (each run's writer shares it: a guard per run was
        # a few hundred bytes per session; its cache of clear texts is bounded).
        self._template = LineWriter.for_secret(secret)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self._path, 0o700)
        os.close(_open_dir(self._path))

    def __repr__(self) -> str:
        return f"FileJournal({self._path!r})"

    @property
    def directory(self) -> str:
        """The directory's path."""
        return self._path

    async def create(self, header: Header) -> JournalRun:
        """Create the run's file exclusively, lock it and write the header.

        The file's creation runs on a journal thread: creating a file waits for the file
        system's own journal, which other sessions' syncs keep busy, and the event loop
        serves them meanwhile. Cancelled while it runs, the file is removed once made.
        """
        _check_run_id(header.run_id)
        writer = self._template.fresh()
        line = writer.line(header)
        made = _syncer().submit(self._create_file, header, line)
        try:
            fd = await _done(made)
        except asyncio.CancelledError:
            made.add_done_callback(functools.partial(self._discard, header.run_id))
            raise
        return FileJournalRun(fd, self._path, header, writer, new=True)

    def _create_file(self, header: Header, line: bytes) -> int:
        """The run's new file, locked, its generation claimed and its header written."""
        run_id = header.run_id
        dir_fd = _open_dir(self._path)
        try:
            fd = _create(dir_fd, run_id)
            try:
                os.fchmod(fd, _MODE)
                _lock(fd, run_id)
                _claim_generation(dir_fd, header.session_id, header.generation)
                _write_all(fd, line, header.run_id)
            except BaseException:
                os.close(fd)
                raise
        finally:
            os.close(dir_fd)
        return fd

    def _discard(self, run_id: str, made: Future[int]) -> None:
        """Remove the file a cancelled ``create`` made (still locked: nobody else wrote)."""
        if made.cancelled() or made.exception() is not None:
            return
        fd = made.result()
        try:
            dir_fd = _open_dir(self._path)
            try:
                os.unlink(run_id + SUFFIX, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
        except (OSError, JournalError):
            pass  # left as a run with a header only: its resume starts it from there
        finally:
            os.close(fd)

    async def claim(self, run_id: str) -> tuple[JournalRun, tuple[Record, ...]]:
        """Lock the run's file and read its records back (a cut last line is cut off)."""
        _check_run_id(run_id)
        dir_fd = _open_dir(self._path)
        try:
            try:
                fd = os.open(run_id + SUFFIX, _OPEN, dir_fd=dir_fd)
            except FileNotFoundError:
                raise JournalError(f"run {run_id} has no journal here", run_id=run_id) from None
            except OSError as exc:
                raise _refused(run_id, exc) from None
            try:
                lines, records, header = _load(fd, run_id)
                _claim_generation(dir_fd, header.session_id, header.generation)
            except BaseException:
                os.close(fd)
                raise
        finally:
            os.close(dir_fd)
        writer = self._template.fresh()
        writer.resume_after(lines, records)
        run = FileJournalRun(fd, self._path, header, writer, new=False)
        return run, records

    async def pending(self) -> tuple[str, ...]:
        """The run ids in the directory whose journal has no finish record, sorted."""
        return tuple(self.iter_pending())

    def iter_pending(self) -> Iterator[str]:
        """:meth:`pending`, one run id at a time: each journal's tail is read only when the
        next id is asked for, so a recovery starts its first run before the directory's
        10,000th journal is read (:meth:`ToolLoop.resume_pending
        <metacrate_grid_agent.ToolLoop.resume_pending>` uses it). The directory is listed
        once, at the first id; close the iterator (or exhaust it) to release it."""
        dir_fd = _open_dir(self._path)
        try:
            for name in sorted(os.listdir(dir_fd)):
                run_id = name.removesuffix(SUFFIX)
                if name == run_id or parse_run_id(run_id) is None:
                    continue
                try:
                    fd = os.open(name, _READ, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    unfinished = stat.S_ISREG(os.fstat(fd).st_mode) and not _finished(fd)
                finally:
                    os.close(fd)
                if unfinished:
                    yield run_id
        finally:
            os.close(dir_fd)

    async def newest_generation(self, session_id: str) -> int | None:
        """The newest generation that created or claimed a run of ``session_id``."""
        dir_fd = _open_dir(self._path)
        try:
            fd = os.open(session_id + GENERATION_SUFFIX, _READ, dir_fd=dir_fd)
        except OSError:
            return None
        finally:
            os.close(dir_fd)
        try:
            return _read_generation(fd)
        finally:
            os.close(fd)


def _write_all(fd: int, line: bytes, run_id: str) -> None:
    """Write ``line`` (one ``write``, unless it comes back short) to the run's file."""
    try:
        written = os.write(fd, line)
        if written < len(line):  # a short write (a signal, a full disk): the rest
            view = memoryview(line)[written:]
            while view:
                view = view[os.write(fd, view) :]
    except OSError as exc:
        raise _not_written(run_id, exc) from None


def _not_written(run_id: str, exc: OSError) -> JournalError:
    return JournalError(
        f"run {run_id}: the journal could not be written "
        f"({exc.strerror or type(exc).__name__}); the action was not taken",
        run_id=run_id,
    )


def _create(dir_fd: int, run_id: str) -> int:
    """The run's new file, created exclusively (0600, not through a link)."""
    try:
        return os.open(run_id + SUFFIX, _OPEN | os.O_CREAT | os.O_EXCL, _MODE, dir_fd=dir_fd)
    except FileExistsError:
        raise JournalError(
            f"run {run_id} already has a journal: resume it, or start a new generation",
            run_id=run_id,
        ) from None
    except OSError as exc:
        raise _refused(run_id, exc) from None


def _claim_generation(dir_fd: int, session_id: str, generation: int) -> None:
    """Raise the session's generation file to ``generation`` if lower (created if missing)."""
    name = session_id + GENERATION_SUFFIX
    try:
        fd = os.open(
            name,
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            _MODE,
            dir_fd=dir_fd,
        )
    except OSError as exc:
        raise _refused(session_id, exc) from None
    try:
        _require_regular(fd, f"session {session_id}: its generation file")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            newest = _read_generation(fd)
            if newest is None or generation > newest:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(generation).encode(), 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _require_regular(fd: int, what: str) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise JournalError(f"{what} is not a regular file")


def _load(fd: int, run_id: str) -> tuple[tuple[str, ...], tuple[Record, ...], Header]:
    """Lock the run's open file and read it back, cutting off a line a crash cut."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise JournalError(f"run {run_id}: its journal is not a regular file", run_id=run_id)
    _lock(fd, run_id)
    data = _read_all(fd, MAX_JOURNAL_BYTES + 1)
    lines, records, end = read_records(data, run_id)
    if not records:
        raise JournalError(
            f"run {run_id}: its journal holds no record (the process ended before anything "
            "was durable); start the session again",
            run_id=run_id,
        )
    header = records[0]
    if not isinstance(header, Header) or header.run_id != run_id:
        raise JournalError(f"run {run_id}: its journal is of another run", run_id=run_id)
    if end < len(data):
        os.ftruncate(fd, end)  # the line a crash cut off
    return lines, records, header


def _check_run_id(run_id: str) -> None:
    if parse_run_id(run_id) is None:
        raise JournalError("a run id is <session>-g<generation>-r<run> (letters, digits, . _ : -)")


def _lock(fd: int, run_id: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise JournalLockedError(
            f"run {run_id} is held by another process (running or resuming it); nothing was "
            "done. Resume it once that process has ended",
            run_id=run_id,
        ) from None


def _read_all(fd: int, limit: int) -> bytes:
    chunks = []
    offset = 0
    while offset < limit:
        chunk = os.pread(fd, min(1 << 20, limit - offset), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _read_generation(fd: int) -> int | None:
    text = os.pread(fd, _GENERATION_BYTES, 0).strip()
    return int(text) if text.isdigit() else None


def _finished(fd: int) -> bool:
    """Whether the journal's last complete line is its finish record."""
    size = os.fstat(fd).st_size
    window = 1 << 16
    while True:
        start = max(0, size - window)
        data = os.pread(fd, size - start, start)
        end = data.rfind(b"\n")
        if end < 0:
            return False
        begin = data.rfind(b"\n", 0, end) + 1
        if begin > 0 or start == 0:
            return data[begin:end].startswith(_FINISH_PREFIX)
        if window >= MAX_JOURNAL_BYTES:
            return False
        window *= 16
