"""What the `npumem` command gives back to the shell: its exit statuses, the same for every
subcommand, and each error as one line on stderr.

An output file that cannot be written follows one rule in every subcommand
(`write_error_status`): status 2 when the path given cannot hold the file, status 1 when the
write fails for a reason of the moment. A signal that comes once a command's result is final
(its files in place, its report printed) does not change its status (`npumem.cli.main`).
"""

from __future__ import annotations

import errno
from enum import IntEnum

__all__ = ["ExitStatus", "one_line", "write_error_status"]


class ExitStatus(IntEnum):
    """What `npumem` and its subcommands return to the shell."""

    OK = 0
    """The job ran and met its goal."""

    NOT_MET = 1
    """The job ran and its goal was not met (`plan --capacity` not reached, a demo request
    rejected, a replayed allocation that fails), or it could not finish for a reason that is
    not its input: a demo whose pool stayed paused, host memory that ran out or could not be
    mapped, an output file that could not be written although its path is fine (a full disk
    or quota, an I/O error: `write_error_status`), a stdout that could not be written."""

    USAGE = 2
    """Bad arguments or an unreadable input file (`argparse` exits with 2 as well). An output
    path that cannot hold the file is a bad argument (`write_error_status`)."""


_PATH_ERRORS = frozenset(
    {
        errno.ENOENT,  # a folder on the way does not exist
        errno.ENOTDIR,  # a folder on the way is a file
        errno.EISDIR,  # a directory in the file's place
        errno.EINVAL,  # a FIFO or a device in its place (`npumem.fileio`), or a name refused
        errno.ENAMETOOLONG,
        errno.ELOOP,  # a loop of symbolic links
        errno.EACCES,  # a folder this user may not write in
        errno.EPERM,
        errno.EROFS,  # a read-only file system
    }
)


def write_error_status(error: OSError) -> ExitStatus:
    """The exit status of a command whose output file (or folder) could not be written, from
    the `OSError` that says why.

    `USAGE` (2) when the path given cannot hold the file, whenever the command would run: a
    folder on the way that does not exist or is a file, a directory or a file that is not a
    regular one in its place (a FIFO, a device), a name too long, a loop of symbolic links, a
    folder this user may not write in, a read-only file system (`ENOENT`, `ENOTDIR`, `EISDIR`,
    `EINVAL`, `ENAMETOOLONG`, `ELOOP`, `EACCES`, `EPERM`, `EROFS`). `NOT_MET` (1) for any other
    error: the path is fine and the write failed for a reason of the moment, a full disk or
    quota, an I/O error, too many open files (`ENOSPC`, `EDQUOT`, `EIO`, `EMFILE`), as when
    host memory runs out while the file is written.

    Either way the command prints one line, `npumem COMMAND: error: cannot write PATH:
    REASON`, leaves the file that was there as it was and leaves no temporary file.
    """
    return ExitStatus.USAGE if error.errno in _PATH_ERRORS else ExitStatus.NOT_MET


def one_line(message: object) -> str:
    """`message` as one line: an error's text may span lines (a library's list of signatures),
    and a command prints each error on one."""
    return " ".join(str(message).split())
