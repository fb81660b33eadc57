"""The entry point of the `npumem` command (the console script, `python -m npumem`).

`npumem.cli.main()` takes Ctrl-C (SIGINT) from the moment it starts; before that the command
is still loading its modules, and Ctrl-C would end it with a traceback. Here it ends the same
way as Ctrl-C while the command works: one line, `npumem: interrupted`, and status 130. (The
`npumem` package itself is loaded before this module, by the interpreter: `npumem._command_start`
covers that part of the start-up.)
"""

from __future__ import annotations

import contextlib
import signal
import sys

__all__ = ["main"]


def main() -> int:
    """Run the `npumem` command with the process's arguments and return its exit status
    (`npumem.cli.main`); Ctrl-C before it takes the signal gives 130 and one line."""
    try:
        from npumem.cli import main as run

        return run()
    except KeyboardInterrupt:
        # Raised while the modules load, or as main() starts, before the part of it that
        # turns a Ctrl-C into its status.
        if sys.stderr is not None:
            with contextlib.suppress(OSError, ValueError):  # no stderr: the status says it
                print("npumem: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
