"""`npumem report`, `npumem plot`, `npumem view` and `npumem export`: look at a saved
snapshot, trace or plan.

    npumem report SNAPSHOT|TIERS [--top N] [--json]
    npumem plot SNAPSHOT|TRACE|PLAN|TIERS [-o OUT.png|OUT.svg|OUT.pdf] [--color-by tag|core]
    npumem view TRACE|SNAPSHOT [-o OUT.html]
    npumem export --format perfetto TRACE [-o OUT.json]

A tier snapshot (`npumem demo --tiers`, `TieredPool.snapshot().save`) gives the tiers'
figures and each tier's report, or the tiers' picture.

Exit status: 0 done, 1 an output file that could not be written for a reason of the moment (a
full disk, an I/O error), 2 bad arguments, an unreadable file or an output path that cannot hold
the file (`npumem.exit_status.write_error_status`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from npumem._argtypes import at_least_one
from npumem._shown import shown
from npumem.errors import MissingDependencyError, NpumemError
from npumem.exit_status import ExitStatus, one_line, write_error_status
from npumem.fileio import is_same_file, json_text, path_argument
from npumem.monitor._files import (
    PLAN_FORMAT,
    SNAPSHOT_FORMAT,
    TIER_PLAN_FORMAT,
    TRACE_FORMAT,
    read_json,
)
from npumem.monitor.errors import FileFormatError, MonitorError
from npumem.monitor.perfetto import CHROME_TRACE_FORMAT
from npumem.monitor.report import render_report, report_json, tier_report_json
from npumem.monitor.saved_file import saved_file_from_json_obj
from npumem.monitor.snapshot import Snapshot
from npumem.monitor.trace import Trace
from npumem.tiers.observe import TIER_SNAPSHOT_FORMAT, TierSnapshot, render_tiers

if TYPE_CHECKING:
    from npumem.plan import Solution, TieredSolution

__all__ = ["add_parsers", "load_input", "run_export", "run_plot", "run_report", "run_view"]


def _output_path(
    given: str | None, default: str, command: str, err: Console, source: str
) -> Path | None:
    """`-o OUT` as a `Path`, or `default` when not given; an empty or unusable path, or the
    input file `source` itself, is refused on `err` (None)."""
    try:
        output = Path(default) if given is None else path_argument(given, "the output path")
    except NpumemError as exc:
        err.print(f"npumem {command}: error: {one_line(exc)}", markup=False)
        return None
    if is_same_file(output, source):
        err.print(
            f"npumem {command}: error: {output} is the input file; write the output elsewhere",
            markup=False,
        )
        return None
    return output


# The kinds of file npumem writes, by their `format` field: what each is called in a message,
# and which commands read it.
_KINDS = {
    SNAPSHOT_FORMAT: ("snapshot", "a snapshot", "npumem report, plot and view read snapshots"),
    TRACE_FORMAT: ("trace", "a trace", "npumem replay, plot, view and export read traces"),
    PLAN_FORMAT: ("plan", "a plan", "npumem plot draws plans"),
    TIER_PLAN_FORMAT: (
        "tier-plan",
        "a plan over several pools",
        "npumem plot draws plans over several pools",
    ),
    TIER_SNAPSHOT_FORMAT: (
        "tiers",
        "a tier snapshot",
        "npumem report and plot read tier snapshots",
    ),
    "npumem-graph": ("graph", "a planner graph", "npumem plan reads graphs"),
    "npumem-report": ("report", "a report (npumem report --json)", ""),
    "npumem-tier-report": ("tier-report", "a tier report (npumem report --json)", ""),
    "npumem-replay": ("replay", "the outcome of a replay (npumem replay --json)", ""),
}
_CHROME_TRACE = ("chrome", "a Chrome trace (npumem export)", "open it in ui.perfetto.dev")


def _kind(obj: dict[str, Any]) -> tuple[str, str, str] | None:
    """`(kind, what it is called, the commands that read it)` for a file npumem writes, from
    its `format` field (an exported Chrome trace keeps it in `otherData`); None for another."""
    fmt = obj.get("format")
    if isinstance(fmt, str) and fmt in _KINDS:
        return _KINDS[fmt]
    other = obj.get("otherData")
    if fmt is None and isinstance(other, dict) and other.get("format") == CHROME_TRACE_FORMAT:
        return _CHROME_TRACE
    return None


def _either(items: list[str]) -> str:
    """`"a, b or c"`."""
    return " or ".join(filter(None, [", ".join(items[:-1]), items[-1]]))


def load_input(
    path: str, kinds: tuple[str, ...]
) -> Snapshot | Trace | Solution | TierSnapshot | TieredSolution:
    """The file at `path`, read once (it may be a pipe), which must be of one of `kinds`
    (`"snapshot"`, `"trace"`, `"plan"`, `"tiers"`: a tier snapshot, `"tier-plan"`: a plan
    over several pools), told apart by its `format` field before the rest is read. Another
    kind of file raises `FileFormatError` saying what the file is, what was expected, and which
    commands read it."""
    obj = read_json(path)
    wanted = [(fmt, what) for fmt, (kind, what, _) in _KINDS.items() if kind in kinds]
    kind = _kind(obj)
    if kind is None or kind[0] not in kinds:
        expected = _either([what for _, what in wanted])
        if kind is None:
            formats = _either([repr(fmt) for fmt, _ in wanted])
            raise FileFormatError(
                f"{path}: not {expected} (format is {shown(obj.get('format'))}, expected {formats})"
            )
        _, what, readers = kind
        raise FileFormatError(
            f"{path} is {what}, not {expected}" + (f"; {readers}" if readers else "")
        )
    if kind[0] == "tiers":
        return TierSnapshot.from_json_obj(obj, where=path)
    if kind[0] == "tier-plan":
        from npumem.plan import PlanError, TieredSolution

        try:  # the planner's errors start with `path` already
            return TieredSolution.from_json(obj, label=path)
        except PlanError as exc:
            raise FileFormatError(str(exc)) from None
    return saved_file_from_json_obj(obj, where=path, consume=True)


def run_report(args: argparse.Namespace) -> int:
    """`npumem report`: print the report of a snapshot file."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        loaded = load_input(args.snapshot, ("snapshot", "tiers"))
    except MonitorError as exc:
        err.print(f"npumem report: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE
    if isinstance(loaded, TierSnapshot):
        return _report_tiers(loaded, args)
    assert isinstance(loaded, Snapshot)
    if args.json:
        sys.stdout.write(json_text(report_json(loaded, top=args.top), indent=1))
        return ExitStatus.OK
    out = Console(highlight=False, soft_wrap=True)
    when = f"{loaded.time_ns / 1e9:.3f} s after the pool was made"
    out.print(f"snapshot of pool {loaded.pool!r}, {when}", markup=False)
    render_report(out, snapshot=loaded, title=f"pool {loaded.pool!r}", top=args.top)
    return ExitStatus.OK


def run_plot(args: argparse.Namespace) -> int:
    """`npumem plot`: draw a snapshot's address map, a trace over time, a plan, a plan over
    several pools or a tier snapshot."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        loaded = load_input(args.input, ("snapshot", "trace", "plan", "tiers", "tier-plan"))
    except MonitorError as exc:
        err.print(f"npumem plot: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE
    output = _output_path(args.output, Path(args.input).stem + ".png", "plot", err, args.input)
    if output is None:
        return ExitStatus.USAGE
    from npumem.monitor.plots import plot_address_map, plot_plan, plot_trace
    from npumem.plan import TieredSolution
    from npumem.tiers.plots import plot_tiered_plan, plot_tiers

    path: Path = output
    if isinstance(loaded, TierSnapshot):
        tiers = loaded
        return _draw(lambda: plot_tiers(tiers, path), path, "tiers", err)
    if isinstance(loaded, TieredSolution):
        pools = loaded
        return _draw(lambda: plot_tiered_plan(pools, path), path, "plan over several pools", err)
    if isinstance(loaded, Snapshot):
        snapshot, color_by = loaded, args.color_by
        return _draw(
            lambda: plot_address_map(snapshot, path, color_by=color_by), path, "address map", err
        )
    if isinstance(loaded, Trace):
        trace = loaded
        return _draw(lambda: plot_trace(trace, path), path, "trace over time", err)
    plan = loaded
    return _draw(lambda: plot_plan(plan, path), path, "plan", err)


def _draw(draw: Callable[[], object], output: Path, kind: str, err: Console) -> int:
    """Run `draw` (a picture written to `output`) and say what was written, or give its error
    in one line."""
    try:
        draw()
    except (MonitorError, MissingDependencyError, ValueError) as exc:
        err.print(f"npumem plot: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE
    except OSError as exc:
        err.print(f"npumem plot: error: cannot write {output}: {exc.strerror or exc}", markup=False)
        return write_error_status(exc)
    Console(highlight=False, soft_wrap=True).print(f"wrote {output} ({kind})", markup=False)
    return ExitStatus.OK


def run_view(args: argparse.Namespace) -> int:
    """`npumem view`: write a snapshot or a trace as one self-contained HTML page."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        loaded = load_input(args.input, ("trace", "snapshot"))
    except MonitorError as exc:
        err.print(f"npumem view: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE
    assert isinstance(loaded, Snapshot | Trace)
    output = _output_path(args.output, Path(args.input).stem + ".html", "view", err, args.input)
    if output is None:
        return ExitStatus.USAGE
    if output.suffix.lower() not in (".html", ".htm"):
        err.print(f"npumem view: error: {output}: the page is HTML, name it .html", markup=False)
        return ExitStatus.USAGE
    from npumem.monitor.viewer import write_view

    try:
        write_view(loaded, output)
    except OSError as exc:
        err.print(f"npumem view: error: cannot write {output}: {exc.strerror or exc}", markup=False)
        return write_error_status(exc)
    Console(highlight=False, soft_wrap=True).print(
        f"wrote {output} (open it in a browser; it needs nothing else)", markup=False
    )
    return ExitStatus.OK


def run_export(args: argparse.Namespace) -> int:
    """`npumem export`: a trace in another tool's format."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        loaded = load_input(args.trace, ("trace",))
    except MonitorError as exc:
        err.print(f"npumem export: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE
    assert isinstance(loaded, Trace)
    from npumem.monitor.perfetto import write_chrome_trace

    output = _output_path(
        args.output, Path(args.trace).stem + ".perfetto.json", "export", err, args.trace
    )
    if output is None:
        return ExitStatus.USAGE
    if output.suffix.lower() != ".json":
        err.print(f"npumem export: error: {output}: the trace is JSON, name it .json", markup=False)
        return ExitStatus.USAGE
    try:
        write_chrome_trace(loaded, output)
    except OSError as exc:
        err.print(
            f"npumem export: error: cannot write {output}: {exc.strerror or exc}", markup=False
        )
        return write_error_status(exc)
    Console(highlight=False, soft_wrap=True).print(
        f"wrote {output} (Chrome trace event format: open it in ui.perfetto.dev or "
        "chrome://tracing)",
        markup=False,
    )
    return ExitStatus.OK


# ----- tier snapshots (npumem.tiers.observe) -----------------------------------------------------


def _report_tiers(snap: TierSnapshot, args: argparse.Namespace) -> int:
    """`npumem report TIERS.json`: the tiers' figures, then each tier's pool report, as
    tables or as JSON (`--json`)."""
    if args.json:
        sys.stdout.write(json_text(tier_report_json(snap, top=args.top), indent=1))
        return ExitStatus.OK
    out = Console(highlight=False, soft_wrap=True)
    render_tiers(out, snap.stats, title=f"tier snapshot {snap.label!r}" if snap.label else "tiers")
    for name, tier in snap.snapshots.items():
        render_report(out, snapshot=tier, title=f"tier {name} (pool {tier.pool!r})", top=args.top)
    return ExitStatus.OK


_WRITER_EPILOG = (
    "Exit status: 0 done, 1 the output could not be written (a full disk, an I/O error), 2 bad "
    "arguments, an unreadable file or an output path that cannot hold the file (no such "
    "folder, no permission)."
)


def add_parsers(subparsers: Any) -> None:
    """Add `report`, `plot`, `view` and `export` to an `argparse` subparsers
    object."""
    report = subparsers.add_parser(
        "report",
        help="print the report of a saved snapshot",
        description="Print the stats, the largest free runs, the live blocks by tag and the "
        "per-core figures of a snapshot file (written by npumem demo or Snapshot.save); for a "
        "tier snapshot (npumem demo --tiers), the tiers' figures and each tier's report.",
        epilog="Exit status: 0 done, 1 a report that could not be written to stdout, 2 bad "
        "arguments or an unreadable file.",
    )
    report.add_argument(
        "snapshot", metavar="SNAPSHOT", help="a snapshot or tier snapshot JSON file"
    )
    report.add_argument(
        "--top", type=at_least_one, default=10, metavar="N", help="rows per table (default 10)"
    )
    report.add_argument(
        "--json",
        action="store_true",
        help="print the figures as JSON (format npumem-report; npumem-tier-report for a tier "
        "snapshot) instead of tables",
    )
    report.set_defaults(func=run_report)
    plot = subparsers.add_parser(
        "plot",
        help="draw a snapshot's address map, a trace over time, or a plan",
        description="Draw a snapshot file as an address map (blocks coloured by tag or core, "
        "free runs in grey), a trace file as bytes live and allocations per second over "
        "time, or a plan file (npumem plan -o plan.json) as buffers over time and offset, "
        "one panel per pool for a plan over several pools (npumem plan --pool), or a tier "
        "snapshot (npumem demo --tiers) as the tiers' use and hits. "
        "Needs matplotlib (pip install npumem[plot]).",
        epilog=_WRITER_EPILOG,
    )
    plot.add_argument(
        "input",
        metavar="SNAPSHOT|TRACE|PLAN|TIERS",
        help="a snapshot, trace, plan or tier snapshot JSON file",
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
    view = subparsers.add_parser(
        "view",
        help="write a snapshot or trace as one HTML page to explore in a browser",
        description="Write a snapshot or trace file as one self-contained HTML page that works "
        "offline: a zoomable timeline of blocks by address and time (traces) or an address map "
        "(snapshots), coloured by tag, with details on hover (size, tag, core, handle, and the "
        "Python stack when the trace recorded it) and compactions marked.",
        epilog=_WRITER_EPILOG,
    )
    view.add_argument("input", metavar="TRACE|SNAPSHOT", help="a trace or snapshot JSON file")
    view.add_argument(
        "-o", "--output", metavar="OUT.html", help="the page (default: INPUT's name, .html)"
    )
    view.set_defaults(func=run_view)
    export = subparsers.add_parser(
        "export",
        help="export a trace for another tool (Perfetto / chrome://tracing)",
        description="Write a trace file in another tool's format. perfetto: the Chrome trace "
        "event format (JSON), which ui.perfetto.dev and chrome://tracing open: a slice per "
        "block from allocation to free on one track per tag, a counter of bytes live, instant "
        "events for failed allocations and moves.",
        epilog=_WRITER_EPILOG,
    )
    export.add_argument("trace", metavar="TRACE", help="a trace JSON file")
    export.add_argument(
        "--format", choices=("perfetto",), default="perfetto", help="the format (perfetto)"
    )
    export.add_argument(
        "-o",
        "--output",
        metavar="OUT.json",
        help="the file (default: TRACE's name with .perfetto.json)",
    )
    export.set_defaults(func=run_export)
