"""The exit statuses of the `npumem` command, the same for every subcommand."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitStatus"]


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
