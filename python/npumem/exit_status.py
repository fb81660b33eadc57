"""What the `npumem` command gives back to the shell: its exit statuses, the same for every
subcommand, and each error as one line on stderr."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitStatus", "one_line"]


class ExitStatus(IntEnum):
    """What `npumem` and its subcommands return to the shell."""

    OK = 0
    """The job ran and met its goal."""

    NOT_MET = 1
    """The job ran and its goal was not met (`plan --capacity` not reached, a demo request
    rejected, a replayed allocation that fails), or it could not finish for a reason that is
    not its input (a demo whose pool stayed paused, host memory that could not be mapped)."""

    USAGE = 2
    """Bad arguments or an unreadable input file (`argparse` exits with 2 as well)."""


def one_line(message: object) -> str:
    """`message` as one line: an error's text may span lines (a library's list of signatures),
    and a command prints each error on one."""
    return " ".join(str(message).split())
