"""``npumem report`` and ``npumem plot``: look at a saved snapshot or trace.

    npumem report SNAPSHOT [--top N]
    npumem plot SNAPSHOT|TRACE [-o OUT.png] [--color-by tag|core]

A tier snapshot (``npumem demo --tiers``, ``TieredPool.snapshot().save``) gives the tiers'
figures and each tier's report, or the tiers' picture.

Exit status: 0 done, 2 bad arguments or an unreadable file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from npumem._argtypes import at_least_one
from npumem.errors import MissingDependencyError
from npumem.exit_status import ExitStatus
from npumem.monitor.errors import MonitorError
from npumem.monitor.report import render_report
from npumem.monitor.saved_file import load_saved_file
from npumem.monitor.snapshot import Snapshot
from npumem.monitor.trace import Trace
from npumem.tiers.observe import is_tier_snapshot, load_tier_snapshot, render_tiers

__all__ = ["add_parsers", "run_plot", "run_report"]


def run_report(args: argparse.Namespace) -> int:
    """``npumem report``: print the report of a snapshot file."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if is_tier_snapshot(args.snapshot):
        return _report_tiers(args, err)
    try:
        loaded = load_saved_file(args.snapshot)
    except MonitorError as exc:
        err.print(f"npumem report: error: {exc}", markup=False)
        return ExitStatus.USAGE
    if isinstance(loaded, Trace):
        err.print(
            f"npumem report: error: {args.snapshot} is a trace, not a snapshot "
            "(see `npumem replay` and `npumem plot`)",
            markup=False,
        )
        return ExitStatus.USAGE
    out = Console(highlight=False, soft_wrap=True)
    when = f"{loaded.time_ns / 1e9:.3f} s after the pool was made"
    out.print(f"snapshot of pool {loaded.pool!r}, {when}", markup=False)
    render_report(out, snapshot=loaded, title=f"pool {loaded.pool!r}", top=args.top)
    return ExitStatus.OK


def run_plot(args: argparse.Namespace) -> int:
    """``npumem plot``: draw a snapshot's address map or a trace over time."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if is_tier_snapshot(args.input):
        return _plot_tiers(args, err)
    try:
        loaded = load_saved_file(args.input)
    except MonitorError as exc:
        err.print(f"npumem plot: error: {exc}", markup=False)
        return ExitStatus.USAGE
    output = Path(args.output) if args.output else Path(Path(args.input).stem + ".png")
    from npumem.monitor.plots import plot_address_map, plot_trace

    try:
        if isinstance(loaded, Snapshot):
            plot_address_map(loaded, output, color_by=args.color_by)
        else:
            plot_trace(loaded, output)
    except (MonitorError, MissingDependencyError, ValueError) as exc:
        err.print(f"npumem plot: error: {exc}", markup=False)
        return ExitStatus.USAGE
    except OSError as exc:
        err.print(f"npumem plot: error: cannot write {output}: {exc.strerror}", markup=False)
        return ExitStatus.USAGE
    kind = "address map" if isinstance(loaded, Snapshot) else "trace over time"
    Console(highlight=False, soft_wrap=True).print(f"wrote {output} ({kind})", markup=False)
    return ExitStatus.OK


# ----- tier snapshots (npumem.tiers.observe) -----------------------------------------------------


def _report_tiers(args: argparse.Namespace, err: Console) -> int:
    """``npumem report TIERS.json``: the tiers' figures, then each tier's pool report."""
    try:
        snap = load_tier_snapshot(args.snapshot)
    except MonitorError as exc:
        err.print(f"npumem report: error: {exc}", markup=False)
        return ExitStatus.USAGE
    out = Console(highlight=False, soft_wrap=True)
    render_tiers(out, snap.stats, title=f"tier snapshot {snap.label!r}" if snap.label else "tiers")
    for name, tier in snap.snapshots.items():
        render_report(out, snapshot=tier, title=f"tier {name} (pool {tier.pool!r})", top=args.top)
    return ExitStatus.OK


def _plot_tiers(args: argparse.Namespace, err: Console) -> int:
    """``npumem plot TIERS.json``: the tiers' use and hits (``plot_tiers``)."""
    output = Path(args.output) if args.output else Path(Path(args.input).stem + ".png")
    try:
        from npumem.tiers.plots import plot_tiers

        plot_tiers(load_tier_snapshot(args.input), output)
    except (MonitorError, MissingDependencyError) as exc:
        err.print(f"npumem plot: error: {exc}", markup=False)
        return ExitStatus.USAGE
    except OSError as exc:
        err.print(f"npumem plot: error: cannot write {output}: {exc.strerror}", markup=False)
        return ExitStatus.USAGE
    Console(highlight=False, soft_wrap=True).print(f"wrote {output} (tiers)", markup=False)
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
    report.set_defaults(func=run_report)
    plot = subparsers.add_parser(
        "plot",
        help="draw a snapshot's address map or a trace over time (PNG)",
        description="Draw a snapshot file as an address map (blocks coloured by tag or core, "
        "free runs in grey) or a trace file as bytes live and allocations per second over "
        "time. Needs matplotlib (pip install npumem[plot]).",
        epilog="Exit status: 0 done, 2 bad arguments or an unreadable file.",
    )
    plot.add_argument("input", metavar="SNAPSHOT|TRACE", help="a snapshot or trace JSON file")
    plot.add_argument(
        "-o", "--output", metavar="OUT.png", help="the picture (default: INPUT's name, .png)"
    )
    plot.add_argument(
        "--color-by",
        choices=("tag", "core"),
        default="tag",
        help="colour blocks by tag or by core (snapshots; default tag)",
    )
    plot.set_defaults(func=run_plot)
