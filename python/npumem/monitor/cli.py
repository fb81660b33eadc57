"""``npumem report`` and ``npumem plot``: look at a saved snapshot or trace.

    npumem report SNAPSHOT [--top N] [--json]
    npumem plot SNAPSHOT|TRACE|PLAN [-o OUT.png|OUT.svg|OUT.pdf] [--color-by tag|core]

Exit status: 0 done, 2 bad arguments or an unreadable file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from npumem._argtypes import at_least_one
from npumem.errors import MissingDependencyError
from npumem.exit_status import ExitStatus
from npumem.fileio import json_text
from npumem.monitor.errors import MonitorError
from npumem.monitor.report import render_report, report_json
from npumem.monitor.saved_file import load_saved_file
from npumem.monitor.snapshot import Snapshot
from npumem.monitor.trace import Trace

__all__ = ["add_parsers", "run_plot", "run_report"]


def run_report(args: argparse.Namespace) -> int:
    """``npumem report``: print the report of a snapshot file."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        loaded = load_saved_file(args.snapshot)
    except MonitorError as exc:
        err.print(f"npumem report: error: {exc}", markup=False)
        return ExitStatus.USAGE
    if not isinstance(loaded, Snapshot):
        what = "a trace" if isinstance(loaded, Trace) else "a plan"
        err.print(
            f"npumem report: error: {args.snapshot} is {what}, not a snapshot "
            "(see npumem replay and npumem plot)",
            markup=False,
        )
        return ExitStatus.USAGE
    if args.json:
        sys.stdout.write(json_text(report_json(loaded, top=args.top), indent=1))
        return ExitStatus.OK
    out = Console(highlight=False, soft_wrap=True)
    when = f"{loaded.time_ns / 1e9:.3f} s after the pool was made"
    out.print(f"snapshot of pool {loaded.pool!r}, {when}", markup=False)
    render_report(out, snapshot=loaded, title=f"pool {loaded.pool!r}", top=args.top)
    return ExitStatus.OK


def run_plot(args: argparse.Namespace) -> int:
    """``npumem plot``: draw a snapshot's address map or a trace over time."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        loaded = load_saved_file(args.input)
    except MonitorError as exc:
        err.print(f"npumem plot: error: {exc}", markup=False)
        return ExitStatus.USAGE
    output = Path(args.output) if args.output else Path(Path(args.input).stem + ".png")
    from npumem.monitor.plots import plot_address_map, plot_plan, plot_trace

    try:
        if isinstance(loaded, Snapshot):
            plot_address_map(loaded, output, color_by=args.color_by)
        elif isinstance(loaded, Trace):
            plot_trace(loaded, output)
        else:
            plot_plan(loaded, output)
    except (MonitorError, MissingDependencyError, ValueError) as exc:
        err.print(f"npumem plot: error: {exc}", markup=False)
        return ExitStatus.USAGE
    except OSError as exc:
        err.print(f"npumem plot: error: cannot write {output}: {exc.strerror}", markup=False)
        return ExitStatus.USAGE
    kind = (
        "address map"
        if isinstance(loaded, Snapshot)
        else "trace over time"
        if isinstance(loaded, Trace)
        else "plan"
    )
    Console(highlight=False, soft_wrap=True).print(f"wrote {output} ({kind})", markup=False)
    return ExitStatus.OK


def add_parsers(subparsers: Any) -> None:
    """Add ``report`` and ``plot`` to an ``argparse`` subparsers object."""
    report = subparsers.add_parser(
        "report",
        help="print the report of a saved snapshot",
        description="Print the stats, the largest free runs, the live blocks by tag and the "
        "per-core figures of a snapshot file (written by `npumem demo` or Snapshot.save).",
        epilog="Exit status: 0 done, 2 bad arguments or an unreadable file.",
    )
    report.add_argument("snapshot", metavar="SNAPSHOT", help="a snapshot JSON file")
    report.add_argument(
        "--top", type=at_least_one, default=10, metavar="N", help="rows per table (default 10)"
    )
    report.add_argument(
        "--json",
        action="store_true",
        help="print the figures as JSON (format npumem-report) instead of tables",
    )
    report.set_defaults(func=run_report)
    plot = subparsers.add_parser(
        "plot",
        help="draw a snapshot's address map, a trace over time, or a plan",
        description="Draw a snapshot file as an address map (blocks coloured by tag or core, "
        "free runs in grey), a trace file as bytes live and allocations per second over "
        "time, or a plan file (npumem plan -o plan.json) as buffers over time and offset. "
        "Needs matplotlib (pip install npumem[plot]).",
        epilog="Exit status: 0 done, 2 bad arguments or an unreadable file.",
    )
    plot.add_argument(
        "input", metavar="SNAPSHOT|TRACE|PLAN", help="a snapshot, trace or plan JSON file"
    )
    plot.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="the picture: .png, .svg or .pdf (default: INPUT's name with .png)",
    )
    plot.add_argument(
        "--color-by",
        choices=("tag", "core"),
        default="tag",
        help="colour blocks by tag or by core (snapshots; default tag)",
    )
    plot.set_defaults(func=run_plot)
