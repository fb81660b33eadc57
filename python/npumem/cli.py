"""The `npumem` command: one entry point, a subcommand per job.

Each subcommand lives next to the code it drives and registers itself through an
`add_parser(subparsers)` function that returns the parser, with `func` set to a callable
`(args) -> int` exit status (`npumem.exit_status.ExitStatus`).

Bad arguments are refused like every other bad input: one line on stderr,
`npumem SUBCOMMAND: error: MESSAGE` (`npumem: error: MESSAGE` before a subcommand is known),
nothing on stdout, exit status 2; `--help` prints the full usage. A value that starts with a
minus sign and a digit is taken as a value (`--capacity -1MiB` is refused by the size parser,
not taken for an unknown option).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from npumem.exit_status import ExitStatus

__all__ = ["OneLineErrorParser", "build_parser", "main"]


class OneLineErrorParser(argparse.ArgumentParser):
    """An `ArgumentParser` that refuses bad arguments with one line on stderr,
    `PROG: error: MESSAGE`, and exit status 2, without the usage lines `argparse` prints first.

    Its subcommands' parsers are of the same class (`add_subparsers` makes them so), and an
    unknown argument after a subcommand is refused by that subcommand's parser, so the line
    names the subcommand.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A value that starts with a minus sign and a digit (`--capacity -1MiB`, `--seed -3`)
        # is a value, not an option, so that its option's type refuses it with its own
        # message; no option of npumem starts with a digit.
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")

    def error(self, message: str) -> NoReturn:
        self.exit(ExitStatus.USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self._chosen_parser(parsed).error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed

    def _chosen_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser of the (innermost) subcommand `parsed` chose, or this one."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(parsed, action.dest, None)
                chosen = action.choices.get(name) if isinstance(name, str) else None
                if isinstance(chosen, OneLineErrorParser):
                    return chosen._chosen_parser(parsed)
        return self


def build_parser() -> argparse.ArgumentParser:
    from npumem._core import __version__
    from npumem.monitor import cli as monitor_cli
    from npumem.plan import cli as plan_cli
    from npumem.workloads import cli as workloads_cli

    parser = OneLineErrorParser(
        prog="npumem",
        description="npumem: accelerator-memory manager "
        "(demo, replay, plan, report, plot, view, export).",
    )
    parser.add_argument("--version", action="version", version=f"npumem {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    workloads_cli.add_parsers(sub)  # demo, replay
    plan_cli.add_parser(sub)
    monitor_cli.add_parsers(sub)  # report, plot, view, export
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with _terminate_as_exit():
        try:
            status: int = args.func(args)
        except KeyboardInterrupt:
            # Ctrl-C: the file being written was cleaned up on the way out; one line, as the
            # shell's own status for SIGINT.
            print(f"{parser.prog}: interrupted", file=sys.stderr)
            return 128 + signal.SIGINT
    return status


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """While a command runs, SIGTERM (`kill`, a job scheduler's time limit) raises
    `SystemExit(143)` rather than ending the process where it stands, so that a file being
    written is cleaned up as for Ctrl-C: the output stays as it was and no temporary file is
    left next to it. Only from the main thread, and only when SIGTERM has its default action
    (a program that calls `main()` and handles SIGTERM itself keeps its handler)."""
    main_thread = threading.current_thread() is threading.main_thread()
    if not main_thread or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
