"""Ctrl-C while the `npumem` command loads the package: one line and status 130.

The interpreter loads the `npumem` package before the command's entry point
(`npumem._entry.main`) runs, and that takes most of the command's start-up. Python's own
SIGINT handler would end a Ctrl-C there with a traceback. The package imports this module
first; in the process of the command itself (the `npumem` console script, or
`python -m npumem`), that calls `hold()`, which puts a handler in Python's place that ends the
process the way the command ends on Ctrl-C: the line `npumem: interrupted` and status 130.
Once the package is loaded, `release()` puts Python's handler back, and the entry point's own
`except KeyboardInterrupt` takes over. A process that imports the package for any other reason
keeps its handler.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from types import FrameType

__all__ = ["hold", "release"]

_held: list[object] = []
"""The handler that `hold()` replaced, while it holds SIGINT."""


def _is_the_command() -> bool:
    """Whether this process is the `npumem` command: its script, or `python -m npumem`."""
    argv = list(getattr(sys, "orig_argv", []))
    if len(argv) >= 2 and os.path.basename(argv[1]) in ("npumem", "npumem.exe"):
        return True
    return _module_run(argv[1:]) == "npumem"


def _module_run(options: list[str]) -> str | None:
    """The module that `python OPTIONS` runs with -m (`None`: a script, -c or standard input).

    Short options may be grouped (`-Bm npumem`, `-mnpumem`); -W, -X and -c take a value, and
    --check-hash-based-pycs the next word.
    """
    i = 0
    while i < len(options):
        arg = options[i]
        if arg == "--check-hash-based-pycs":
            i += 2
            continue
        if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("--"):
            return None
        for k, flag in enumerate(arg[1:], start=1):
            if flag in "mcWX":
                value = arg[k + 1 :] or (options[i + 1] if i + 1 < len(options) else "")
                if flag == "m":
                    return value
                if flag == "c":
                    return None
                i += 0 if arg[k + 1 :] else 1
                break
        i += 1
    return None


def _interrupted(signum: int, frame: FrameType | None) -> None:
    with contextlib.suppress(OSError):  # no stderr: the status says it
        os.write(2, b"npumem: interrupted\n")
    os._exit(128 + signal.SIGINT)


def hold() -> None:
    """In the command's own process, end a Ctrl-C with one line and status 130 from now on."""
    if _is_the_command():
        # Not the main thread, or no signals here: Python's handler stays.
        with contextlib.suppress(ValueError, OSError):
            _held.append(signal.signal(signal.SIGINT, _interrupted))


def release() -> None:
    """Put back the handler that `hold()` replaced (nothing if it replaced none)."""
    while _held:
        previous = _held.pop()
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(signal.SIGINT, previous)  # type: ignore[arg-type]


hold()
