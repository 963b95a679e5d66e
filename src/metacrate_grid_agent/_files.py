"""Files we read and files we write, each side held to one rule.

Read (:func:`read_regular`): only a regular file. A symbolic link to one is followed (secrets
are often mounted that way), but a FIFO, a device, a socket or a directory is refused before
it is opened, and again on the opened descriptor (opened non-blocking) in case the path was
swapped in between: a FIFO would block the reader forever and ``/dev/zero`` would feed it
without end. At most ``limit + 1`` bytes are read, so the caller can tell "too large".

Write (:func:`open_private`): the file ends up with mode 0600, whatever the umask. A new file
is created so; an existing regular file (the operator re-running the same command) is made
0600 and only then truncated and rewritten. A symbolic link at the path, dangling or not, is
never written through, and anything but a regular file is refused without blocking.

Refusals are :class:`RefusedFileError`, an :class:`OSError` whose ``strerror`` says what the
path is ("it is a FIFO, not a regular file"), so callers word every failure alike.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Final, NamedTuple, TextIO

__all__ = ["PRIVATE_MODE", "ReadFile", "RefusedFileError", "open_private", "read_regular"]

#: The mode of every file we write: readable and writable by its owner only.
PRIVATE_MODE: Final = 0o600
#: Open to read without blocking on a FIFO (no writer) and without leaking into children.
_READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
#: Open to write: create if absent (0600), never through a final symbolic link, never
#: blocking on a FIFO; truncated only after the checks.
_WRITE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: What a file that is not regular is, by its type bits.
_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_LINK: Final = "it is a symbolic link; refusing to write through it"


class RefusedFileError(OSError):
    """A path we will not read or write: not a regular file, or a link to write through."""


class ReadFile(NamedTuple):
    """What :func:`read_regular` read: the bytes and the file's permission bits."""

    data: bytes
    mode: int


def _require_regular(mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file either")
    raise RefusedFileError(errno.EINVAL, f"it is {kind}, not a regular file")


def read_regular(path: str | os.PathLike[str], limit: int) -> ReadFile:
    """At most ``limit + 1`` bytes of the regular file at ``path``, and its permission bits.

    Raises :class:`OSError`: :class:`RefusedFileError` when ``path`` (followed if a link) is
    not a regular file, before anything is read from it.
    """
    _require_regular(os.stat(path).st_mode)
    fd = os.open(path, _READ_FLAGS)
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        _require_regular(mode)
        return ReadFile(file.read(limit + 1), stat.S_IMODE(mode))


def open_private(path: str | os.PathLike[str]) -> TextIO:
    """``path`` opened to write UTF-8 text from its start, with mode 0600.

    Raises :class:`OSError`: :class:`RefusedFileError` for a symbolic link at ``path`` or
    an existing file that is not regular; nothing has been changed then.
    """
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISLNK(found.st_mode):
            raise RefusedFileError(errno.ELOOP, _LINK)
        _require_regular(found.st_mode)
    try:
        fd = os.open(path, _WRITE_FLAGS, PRIVATE_MODE)
    except OSError as exc:
        # A link planted since the check above: O_NOFOLLOW refused it (ELOOP).
        if exc.errno == errno.ELOOP and stat.S_ISLNK(os.lstat(path).st_mode):
            raise RefusedFileError(errno.ELOOP, _LINK) from None
        raise
    try:
        found = os.fstat(fd)
        _require_regular(found.st_mode)
        if stat.S_IMODE(found.st_mode) != PRIVATE_MODE:
            os.fchmod(fd, PRIVATE_MODE)
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
