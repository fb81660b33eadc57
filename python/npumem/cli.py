"""The `npumem` command: one entry point, a subcommand per job.

Each subcommand lives next to the code it drives and registers itself through an
`add_parser(subparsers)` function that returns the parser, with `func` set to a callable
`(args) -> int` exit status (`npumem.exit_status.ExitStatus`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from npumem._core import __version__
    from npumem.monitor import cli as monitor_cli
    from npumem.plan import cli as plan_cli
    from npumem.workloads import cli as workloads_cli

    parser = argparse.ArgumentParser(
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
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
