"""`npumem demo` and `npumem replay`.

    npumem demo [--quick] [--requests N] [--workers N] [--capacity BYTES] [--output DIR] [--trace]
                [--no-tiers]
    npumem replay TRACE [--capacity BYTES] [--max-capacity BYTES] [--cores N] [--chunk-size BYTES]
                  ... [--json]

Exit status: 0 done and the goal met (demo: no failed allocation and no rejected request;
replay: every allocation that succeeded when recorded succeeds again), 1 the goal not met
(demo: also a run that could not finish, `npumem demo: failed: ...`, or files that could not
be written for a reason of the moment, a full disk), 2 bad arguments, an unreadable file or a
demo output folder that cannot hold the files (`npumem.exit_status.write_error_status`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import logging
import os
import secrets
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

import npumem
from npumem._argtypes import at_least_one, non_negative, positive_byte_count
from npumem._shown import shown
from npumem.compaction import Compactor, Policy
from npumem.exit_status import ExitStatus, one_line, write_error_status
from npumem.fileio import check_output_path, json_text, path_argument, remove_quietly
from npumem.monitor.report import render_report
from npumem.monitor.sampler import Alert
from npumem.sizes import format_bytes
from npumem.workloads.demo import MAX_CAPACITY, MAX_REQUESTS, MAX_WORKERS, OUTPUT_NAMES

if TYPE_CHECKING:
    from npumem.monitor.trace import Trace
    from npumem.workloads.demo import DemoResult
    from npumem.workloads.replay import ReplayResult

__all__ = ["add_parsers", "replay_json", "run_demo_command", "run_replay_command"]

QUICK_REQUESTS = 1_000
DEFAULT_REQUESTS = 60_000


def _progress(console: Console, description: str) -> Progress:
    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


# ----- demo ----------------------------------------------------------------------------------


def _alerts(alerts: list[Alert]) -> str:
    fired = [a for a in alerts if a.firing]
    if not fired:
        return "0"
    kinds = sorted({a.kind for a in fired})
    return f"{len(fired)} ({', '.join(kinds)}; logged as they fired)"


ROOM_WAIT = 2.0
"""Seconds an allocation that finds no room in the full pool waits for other workers' frees
(`Policy.wait_for_room`), when there are other workers: an inference batch ends in
milliseconds, far less on a quiet machine."""


def _compactor_for(workers: int) -> Callable[[npumem.Pool], Compactor]:
    """The demo's compactor, made for its pool: compacts when an allocation fails although
    enough bytes are free (attached to the pool) and when the monitor's fragmentation alert
    fires (the default 30% threshold), never more often than once a second. Once the pool has
    grown to its capacity, a failed allocation that compacting does not serve waits up to
    `ROOM_WAIT` seconds for other workers to free room, as a server holds a batch back until
    memory frees; a single worker has nobody to wait for."""
    wait = ROOM_WAIT if workers > 1 else 0.0

    def make(pool: npumem.Pool) -> Compactor:
        return Compactor(pool, policy=Policy(min_interval=1.0, wait_for_room=wait)).attach()

    return make


def run_demo_command(args: argparse.Namespace) -> int:
    """Run `npumem demo` with parsed arguments; returns the exit status.

    The output folder is made before the run, so that a folder that cannot be made is refused
    at once, and removed again (with the parents made for it) when the run writes nothing into
    it: a refusal or a failure leaves nothing behind.
    """
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        output = path_argument(args.output, "the output folder")
    except npumem.InvalidArgumentError as exc:
        err.print(f"npumem demo: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE
    try:
        # `Path.exists()` and `is_dir()` answer False for some errors (no such folder on the
        # way) and raise others (a name too long, no permission to look).
        not_a_folder = output.exists() and not output.is_dir()
        made = [folder for folder in (output, *output.parents) if not folder.exists()]
    except OSError as exc:
        err.print(f"npumem demo: error: cannot write {output}: {exc.strerror or exc}", markup=False)
        return write_error_status(exc)
    if not_a_folder:
        err.print(f"npumem demo: error: --output {output} exists and is not a folder", markup=False)
        return ExitStatus.USAGE
    for name in OUTPUT_NAMES:  # a file the run could not write is refused before it starts
        try:
            check_output_path(output / name)
        except OSError as exc:
            err.print(
                f"npumem demo: error: cannot write {output / name}: {exc.strerror or exc}",
                markup=False,
            )
            return write_error_status(exc)
    try:
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            err.print(
                f"npumem demo: error: cannot make {output}: {exc.strerror or exc}", markup=False
            )
            return write_error_status(exc)
        return _serve_and_report(args, output, err)
    finally:
        for folder in made:  # the innermost first; a folder with files in it stays
            with contextlib.suppress(OSError):
                folder.rmdir()


def _serve_and_report(args: argparse.Namespace, output: Path, err: Console) -> int:
    """The demo's run, files and report, into the existing folder `output`."""
    from npumem.workloads.demo import default_capacity, default_workers, run_demo
    from npumem.workloads.tiered import report_tiered_demo

    out = Console(highlight=False, soft_wrap=True)
    workers = args.workers or default_workers()
    requests = args.requests or (QUICK_REQUESTS if args.quick else DEFAULT_REQUESTS)
    capacity = args.capacity or default_capacity(workers)
    pictures = importlib.util.find_spec("matplotlib") is not None
    alerts = logging.getLogger("npumem.monitor")
    handler = RichHandler(console=err, show_path=False, show_time=False, markup=False)
    alerts.addHandler(handler)
    with _progress(err, "serving requests") as progress:
        task = progress.add_task("serve", total=requests)
        try:
            result = run_demo(
                requests=requests,
                workers=workers,
                capacity=capacity,
                seed=args.seed,
                interval=0.05 if args.quick else 0.1,
                trace=args.trace,
                compactor=_compactor_for(workers),
                on_request=lambda: progress.advance(task),
                tiers=args.tiers,
            )
        except (npumem.InvalidArgumentError, npumem.ConfigError) as exc:
            err.print(f"npumem demo: error: {one_line(exc)}", markup=False)
            return ExitStatus.USAGE
        except npumem.NpumemError as exc:  # the arguments were fine; the run could not finish
            err.print(f"npumem demo: failed: {exc}", markup=False)
            return ExitStatus.NOT_MET
        finally:
            alerts.removeHandler(handler)
    try:
        # All or none; main() reports Ctrl-C and SIGTERM.
        files = _write_outputs(result, output, pictures=pictures)
    except OSError as exc:
        where = exc.filename or output
        err.print(f"npumem demo: error: cannot write {where}: {exc.strerror or exc}", markup=False)
        return write_error_status(exc)

    t = Table(title="npumem demo: an inference service in miniature", title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    served = ", ".join(f"{k} {v:,}" for k, v in sorted(result.served.items()))
    compactions = f"{result.compactions:,}" if result.compactor else "0 (no compactor)"
    rows = [
        ("workers / core pools", f"{result.workers} / {os.cpu_count() or 1}"),
        ("arena", f"{format_bytes(result.capacity)} (host memory)"),
        (
            "  growth",
            f"from {format_bytes(result.start_capacity)}: {result.grow_events:,} growths, "
            f"{result.regions} region(s), {result.growths_per_1000_requests:.2f} per 1000 "
            "requests (target: at most 1)",
        ),
        ("requests served", f"{result.requests_served:,} of {result.requests:,}"),
        ("  by model", served),
        ("requests rejected", f"{result.rejected:,}"),
        ("allocations", f"{result.allocations:,} ({result.frees:,} frees)"),
        ("allocations / s", f"{result.allocations_per_second:,.0f}"),
        ("serving time", f"{result.seconds:.2f} s"),
        (
            "peak bytes in use",
            f"{format_bytes(result.peak_bytes_in_use)} ({result.peak_usage:.1%})",
        ),
        ("peak fragmentation (sampled)", f"{result.peak_fragmentation:.1%}"),
        ("fragmentation at the end", f"{result.final_fragmentation:.1%}"),
        ("failed allocations", f"{result.failed_allocations:,} (target 0)"),
        (
            "  waits for room",
            f"{result.room_waits:,} ({result.room_waits_failed:,} in vain), "
            f"{result.room_waited_seconds:.3f} s in all",
        ),
        ("overflow allocations", f"{result.overflow_allocations:,}"),
        (
            "KV cache (paged)",
            f"peak {format_bytes(result.kv.peak_bytes)} in "
            f"{result.kv.peak_pages:,} pages of {format_bytes(result.kv.page_bytes)}",
        ),
        ("  KV waste (mean)", f"{result.kv.mean_waste_share:.1%} (vLLM: under 4%)"),
        ("  saved by sharing (peak)", format_bytes(result.kv.peak_shared_saved_bytes)),
        (
            "  copied on write",
            f"{result.kv.copies:,} pages ({format_bytes(result.kv.bytes_copied)}); "
            f"{result.kv.beam_forks:,} beam forks",
        ),
        ("compactions", compactions),
        (
            "deferred frees",
            f"{result.deferred_frees:,} in {result.deferred_batches:,} inference batches "
            "(made at each batch's end)",
        ),
        ("alerts fired", _alerts(result.alerts)),
        ("check()", f"passed ({result.checked_blocks} live blocks)"),
    ]
    for row in rows:
        t.add_row(*row)
    out.print(t)
    render_report(
        out,
        snapshot=result.peak_snapshot,
        history=result.history,
        alerts=result.alerts,
        title="pool",
        top=8,
    )
    if result.tiers is not None:
        # One SRAM pool per worker in front of the demo's pool (npumem.workloads.demo_tiers),
        # and the policies compared on the run's reads.
        report_tiered_demo(out, result.tiers)
    out.print(f"wrote to {output.resolve()}:", markup=False)
    for what, path in files.items():
        out.print(f"  {path.name:28} {what}", markup=False)
    if not pictures:
        out.print(
            "  (no pictures: matplotlib is not installed; pip install npumem[plot])", markup=False
        )
    if not result.ok:
        err.print(
            f"npumem demo: goal not met: {result.failed_allocations} failed allocation(s), "
            f"{result.rejected} rejected request(s)",
            markup=False,
        )
        return ExitStatus.NOT_MET
    return ExitStatus.OK


def _write_outputs(result: DemoResult, output: Path, *, pictures: bool) -> dict[str, Path]:
    """Write the demo's files into the folder `output`, all or none; returns `what -> path`.

    Every file is written first into a hidden folder made in `output` for the purpose,
    `.npumem-demo.PID.HEX.tmp`; once all are written, they replace the files in `output` (the
    files that links there point to), with SIGINT and SIGTERM held back for those few renames
    (`_signals_held`). A failed write or an interruption before then leaves every file in
    `output` as it was. The hidden folder and any temporary file go in every case. An `OSError`
    names the file in `output`, not the temporary one.
    """
    from npumem.workloads.demo import write_outputs
    from npumem.workloads.tiered import write_tier_outputs

    staging = output / f".npumem-demo.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # Named before they are made, so that the clean-up below removes whatever exists.
    temporary = [staging]
    name = ""  # the output being placed
    try:
        try:
            staging.mkdir()
        except FileExistsError:
            temporary.remove(staging)  # another folder of that name, not ours to remove
            raise
        staged = write_outputs(result, staging, pictures=pictures)
        if result.tiers is not None:
            staged.update(write_tier_outputs(result.tiers, staging, pictures=pictures))
        moves: list[tuple[str, Path, Path]] = []  # (output name, new file, file it replaces)
        for path in staged.values():
            name = path.name
            target = _written_through(check_output_path(output / name))
            new = path
            if target.parent != output:
                # A link to a file elsewhere, maybe on another file system, where no rename
                # from here reaches: a copy beside that file is renamed in its place.
                new = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
                temporary.append(new)
                shutil.copyfile(path, new)
            moves.append((name, new, target))
        with _signals_held():
            for moved, new, target in moves:
                name = moved  # named if the rename fails
                os.replace(new, target)
    except OSError as exc:
        if exc.filename is not None and Path(exc.filename).parent == staging:
            name = Path(exc.filename).name  # a write into the hidden folder
        exc.filename, exc.filename2 = str(output / name), None
        raise
    finally:
        with _signals_held():
            for path in temporary:
                if os.path.isdir(path):  # False for any error, which `Path.is_dir()` may raise
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    remove_quietly(path)
    result.files = {what: str(output / Path(path).name) for what, path in result.files.items()}
    return {what: output / path.name for what, path in staged.items()}


def _written_through(path: Path) -> Path:
    """The file a write to `path` replaces: the file a symbolic link points to, or `path`."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs (steps that must not stop halfway),
    then pass the first one that came to the handler it had (Ctrl-C's `KeyboardInterrupt`,
    main()'s `SystemExit` for SIGTERM, or the default action). Signals are handled in the
    main thread only, so elsewhere this holds nothing back; a signal whose handler was not
    set from Python (`signal.getsignal()` gives None) is not held either."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def hold(signum: int, frame: object) -> None:
        came.append(signum)

    held: dict[int, Any] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(sig)
            if handler is not None:
                held[sig] = handler
                signal.signal(sig, hold)
        yield
    finally:
        for held_sig, handler in held.items():
            signal.signal(held_sig, handler)
        if came:
            signal.raise_signal(came[0])


# ----- replay --------------------------------------------------------------------------------


def run_replay_command(args: argparse.Namespace) -> int:
    """Run `npumem replay` with parsed arguments; returns the exit status."""
    from npumem.monitor.cli import load_input
    from npumem.monitor.errors import MonitorError
    from npumem.monitor.trace import Trace
    from npumem.workloads.replay import replay_trace

    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        trace = load_input(args.trace, ("trace",))
    except MonitorError as exc:
        err.print(f"npumem replay: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE
    assert isinstance(trace, Trace)
    overrides = {
        key: getattr(args, key)
        for key in (
            "capacity",
            "cores",
            "chunk_size",
            "min_block",
            "bank_size",
            "placement",
            "core_reserve",
            "max_capacity",
        )
        if getattr(args, key) is not None
    }
    if args.max_capacity is not None:
        capacity = overrides.get("capacity", trace.config["capacity"])
        if args.max_capacity < capacity:
            given = "--capacity" if "capacity" in overrides else "the recorded capacity"
            err.print(
                f"npumem replay: error: --max-capacity ({format_bytes(args.max_capacity)}) must "
                f"be at least {given} ({format_bytes(capacity)})",
                markup=False,
            )
            return ExitStatus.USAGE
        chunk = overrides.get("chunk_size", trace.config["chunk_size"])
        if args.max_capacity > capacity and args.max_capacity % chunk:
            err.print(
                f"npumem replay: error: --max-capacity ({format_bytes(args.max_capacity)}) must "
                f"be a multiple of the chunk size ({format_bytes(chunk)}) for a pool that can "
                "grow: it grows in whole chunks",
                markup=False,
            )
            return ExitStatus.USAGE
    with _progress(err if not args.json else Console(quiet=True), "replaying") as progress:
        task = progress.add_task("replay", total=len(trace.events))
        try:
            r = replay_trace(
                trace,
                config=overrides,
                progress=lambda done, total: progress.update(task, completed=done),
            )
        except npumem.NpumemError as exc:
            err.print(f"npumem replay: error: {one_line(exc)}", markup=False)
            return ExitStatus.USAGE
    recorded = trace.stats_at_stop
    if args.json:
        sys.stdout.write(json_text(replay_json(args.trace, trace, r, overrides), indent=1))
        return ExitStatus.OK if r.ok else ExitStatus.NOT_MET
    # Text, not markup: a path may hold brackets.
    t = Table(title=Text(f"npumem replay of {args.trace}"), title_justify="left")
    t.add_column("figure")
    t.add_column("replay", justify="right")
    t.add_column("recorded", justify="right")
    cfg = r.config
    changed = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "as recorded"
    recorded_max = trace.config.get("max_capacity", trace.config["capacity"])
    replay_max = cfg.get("max_capacity", cfg["capacity"])
    rows = [
        ("configuration", changed, ""),
        ("capacity", format_bytes(cfg["capacity"]), format_bytes(trace.config["capacity"])),
        ("grows up to", format_bytes(replay_max), format_bytes(recorded_max)),
        ("events", f"{r.events:,}", f"{r.events:,} ({_lost(trace)})"),
        ("allocations", f"{r.replayed_allocations:,}", f"{r.allocations:,}"),
        ("frees", f"{r.replayed_frees:,}", f"{r.frees:,} ({r.unmatched_frees:,} unmatched)"),
        ("failed allocations", f"{r.failed:,}", f"{r.recorded_failures:,}"),
        ("allocations that would fail", f"{r.would_fail:,}", "0"),
        ("recorded failures that succeed", f"{r.rescued:,}", ""),
        (
            "peak bytes in use",
            format_bytes(r.peak_bytes_in_use),
            format_bytes(recorded.peak_bytes_in_use) if recorded is not None else "",
        ),
        ("peak fragmentation (sampled)", f"{r.peak_fragmentation:.1%}", ""),
        ("fragmentation at the peak", f"{r.fragmentation_at_peak:.1%}", ""),
        ("same offsets as recorded", f"{r.same_placements:,} of {r.allocations:,}", ""),
        ("moves (not replayed)", f"{r.moves:,}", ""),
        ("replay time", f"{r.seconds:.2f} s", ""),
    ]
    for row in rows:
        t.add_row(*row)
    out.print(t)
    if recorded_max > trace.config["capacity"] and replay_max == cfg["capacity"]:
        grown = recorded.capacity if recorded is not None else trace.config["capacity"]
        how = (
            f"grew to {format_bytes(grown)}"
            if grown > trace.config["capacity"]
            else f"could grow to {format_bytes(recorded_max)}"
        )
        out.print(
            f"note: the recorded pool {how}; this replay does not grow: its arena is "
            f"{format_bytes(cfg['capacity'])} (--max-capacity BYTES lets it grow)",
            markup=False,
        )
    if not trace.complete:
        out.print(
            "note: the trace is incomplete (events dropped or discarded, or blocks live when "
            "recording began): the replay starts from an empty pool and skips unmatched frees",
            markup=False,
        )
    for f in r.first_failures[:5]:
        # A recorded failure that fails again is no allocation that "would fail".
        what = "fails again" if f.recorded_failed else "would fail"
        out.print(
            f"  {what}: {format_bytes(f.size)} ({f.size:,} bytes, tag {f.tag}) at "
            f"{f.time_ns / 1e9:.3f} s: {format_bytes(f.bytes_free)} free, largest free block "
            f"{format_bytes(f.largest_free_block)}",
            markup=False,
        )
    if not r.ok:
        err.print(
            f"npumem replay: {r.would_fail:,} allocation(s) that succeeded when recorded would "
            "fail with this configuration",
            markup=False,
        )
        return ExitStatus.NOT_MET
    return ExitStatus.OK


def _lost(trace: Trace) -> str:
    """The events a trace lost: dropped by the rings, and discarded by a bounded recorder."""
    dropped = f"{trace.dropped:,} dropped"
    return f"{dropped}, {trace.discarded:,} discarded" if trace.discarded else dropped


def replay_json(
    path: str, trace: Trace, r: ReplayResult, overrides: dict[str, Any]
) -> dict[str, Any]:
    """What `npumem replay --json` prints (format `npumem-replay`, version 1)."""
    return {
        "format": "npumem-replay",
        "version": 1,
        "trace": path,
        "changed": overrides,
        "config": r.config,
        "recorded": {
            "config": trace.config,
            "dropped": trace.dropped,
            "discarded": trace.discarded,
            "complete": trace.complete,
            "stats_at_stop": {} if trace.stats_at_stop is None else trace.stats_at_stop.as_dict(),
        },
        "ok": r.ok,
        "events": r.events,
        "allocations": r.allocations,
        "frees": r.frees,
        "replayed_allocations": r.replayed_allocations,
        "replayed_frees": r.replayed_frees,
        "moves": r.moves,
        "recorded_failures": r.recorded_failures,
        "failed": r.failed,
        "would_fail": r.would_fail,
        "rescued": r.rescued,
        "unmatched_frees": r.unmatched_frees,
        "skipped_frees": r.skipped_frees,
        "same_placements": r.same_placements,
        "peak_bytes_in_use": r.peak_bytes_in_use,
        "peak_fragmentation": r.peak_fragmentation,
        "fragmentation_at_peak": r.fragmentation_at_peak,
        "seconds": r.seconds,
        "final_stats": r.final.as_dict(),
        "first_failures": [dataclasses.asdict(f) for f in r.first_failures],
    }


def _at_most(parse: Callable[[str], int], most: int, limit: str) -> Callable[[str], int]:
    """An argparse type: `parse(text)`, refused above `most` (written `limit`) with a message
    that quotes the text given."""

    def parse_at_most(text: str) -> int:
        value = parse(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {limit}, got {shown(text)}")
        return value

    return parse_at_most


def add_parsers(subparsers: Any) -> None:
    """Add `demo` and `replay` to an `argparse` subparsers object."""
    demo = subparsers.add_parser(
        "demo",
        help="run the built-in inference-service workload and write the report and pictures",
        description="An inference service in miniature on a host-backed pool: ResNet-50, "
        "MobileNetV2 and a text generator with planned activation arenas, worker threads on "
        "every core serving requests of varying batch size and sequence length (a paged KV cache "
        "with a shared system prompt and beam search), the monitor running; the weights live in "
        "one SRAM tier per worker in front of the shared pool (HBM), promoted by access "
        "frequency. Prints the report; writes the pictures and snapshots to --output.",
        epilog="Exit status: 0 goal met (no failed allocation, no rejected request), 1 goal "
        "not met, the run could not finish or its files could not be written (a full disk, an "
        "I/O error), 2 bad arguments or an output folder that cannot hold the files (a file "
        "on its path, no permission).",
    )
    demo.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS:,} requests (seconds)")
    demo.add_argument(
        "--requests",
        type=_at_most(at_least_one, MAX_REQUESTS, f"{MAX_REQUESTS:,}"),
        metavar="N",
        help=f"requests to serve (default {DEFAULT_REQUESTS:,}; {QUICK_REQUESTS:,} with --quick; "
        f"at most {MAX_REQUESTS:,})",
    )
    demo.add_argument(
        "--workers",
        "--threads",
        type=_at_most(at_least_one, MAX_WORKERS, f"{MAX_WORKERS:,}"),
        metavar="N",
        help=f"worker threads (default: one per CPU; at most {MAX_WORKERS:,})",
    )
    demo.add_argument(
        "--capacity",
        type=_at_most(positive_byte_count, MAX_CAPACITY, format_bytes(MAX_CAPACITY)),
        metavar="BYTES",
        help="arena size, e.g. 512MiB (default: 160 MiB + 128 MiB per worker; at most "
        f"{format_bytes(MAX_CAPACITY)})",
    )
    demo.add_argument(
        "--seed", type=non_negative, default=0, metavar="N", help="request mix seed (default 0)"
    )
    demo.add_argument(
        "--output",
        "-o",
        default="npumem-demo",
        metavar="DIR",
        help="folder for the pictures and snapshots (default ./npumem-demo/)",
    )
    demo.add_argument(
        "--trace", action="store_true", help="record every event and write trace.json"
    )
    demo.add_argument(
        "--tiers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve the weights from one SRAM pool per worker in front of the demo's pool (HBM) "
        "through a TieredPool, report the fast-tier hit rate and the promotions, and compare "
        "the frequency policy with size-only placement on the same reads (writes tiers.json, "
        "tiers.png); on by default, --no-tiers keeps every weight in the demo's pool",
    )
    demo.set_defaults(func=run_demo_command)

    replay = subparsers.add_parser(
        "replay",
        help="replay a saved trace against a fresh pool: what would fail, peak, fragmentation",
        description="Replay a trace file (from npumem demo --trace or TraceRecorder) on a "
        "fresh pool made with the recorded configuration, changed by the options given, and "
        "report which allocations would fail, the peak and the fragmentation: a what-if tool.",
        epilog="Exit status: 0 every allocation that succeeded when recorded succeeds again, "
        "1 some would fail (or the report could not be written to stdout), 2 bad arguments, an "
        "unreadable file or an invalid configuration.",
    )
    replay.add_argument("trace", metavar="TRACE", help="a trace JSON file")
    replay.add_argument(
        "--capacity",
        type=positive_byte_count,
        metavar="BYTES",
        help="arena size: the replay's arena is exactly this many bytes and does not grow, "
        "even where the recorded pool grew (unless --max-capacity is given too)",
    )
    replay.add_argument(
        "--max-capacity",
        type=positive_byte_count,
        metavar="BYTES",
        help="let the arena grow up to this many bytes, --capacity (or the recorded "
        "capacity) at a time; at least the capacity (default: with --capacity, no growth; "
        "without, the recorded limit)",
    )
    replay.add_argument("--cores", type=at_least_one, metavar="N", help="core pools")
    replay.add_argument(
        "--chunk-size", type=positive_byte_count, metavar="BYTES", help="unit granted to cores"
    )
    replay.add_argument(
        "--min-block", type=positive_byte_count, metavar="BYTES", help="smallest buddy block"
    )
    replay.add_argument("--bank-size", type=positive_byte_count, metavar="BYTES", help="bank size")
    replay.add_argument(
        "--placement", choices=("best-fit", "first-fit"), help="how chunk runs are placed"
    )
    replay.add_argument(
        "--core-reserve", type=non_negative, metavar="N", help="empty chunks a core keeps"
    )
    replay.add_argument(
        "--json",
        action="store_true",
        help="print the outcome as JSON (format npumem-replay) instead of a table",
    )
    replay.epilog = (replay.epilog or "") + (
        " Every option not given keeps the recorded value; sizes take units (4MiB, 512K)."
    )
    replay.set_defaults(func=run_replay_command)
