"""`npumem demo`: run the built-in workload and print what the pool did."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from npumem.workloads.demo import run_demo

__all__ = ["add_parser"]

MIB = 1 << 20


def add_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="run the built-in workload on a host-backed pool and print the report",
        description="Worker threads on every core allocate, write, pass around and free blocks "
        "of mixed sizes on a host-backed pool; then the pool is checked and its stats printed.",
    )
    parser.add_argument("--quick", action="store_true", help="a short run (a second or two)")
    parser.add_argument(
        "--threads", type=int, default=None, help="worker threads (default: CPU count, at least 2)"
    )
    parser.add_argument(
        "--capacity-mib", type=int, default=512, help="arena size in MiB (default 512)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    console = Console()
    if args.threads is not None and args.threads < 1:
        console.print("[red]error:[/] --threads must be at least 1")
        return 2
    if args.capacity_mib < 1:
        console.print("[red]error:[/] --capacity-mib must be at least 1")
        return 2
    result = run_demo(
        capacity=args.capacity_mib * MIB,
        threads=args.threads,
        operations=2_000 if args.quick else 20_000,
        seed=args.seed,
    )
    s = result.final
    table = Table(title="npumem demo")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("worker threads", f"{result.threads}"),
        ("operations", f"{result.operations:,}"),
        ("allocations", f"{result.allocations:,}"),
        ("allocations / s", f"{result.allocations_per_second:,.0f}"),
        ("failed allocations", f"{result.failed_allocations:,}"),
        ("wall time", f"{result.seconds:.2f} s"),
        (
            "peak bytes in use",
            f"{s.peak_bytes_in_use / MIB:,.1f} MiB of {s.capacity / MIB:,.0f} MiB",
        ),
        ("peak fragmentation", f"{result.peak_fragmentation:.1%}"),
        ("overflow allocations", f"{s.overflow_allocs:,}"),
        ("bytes in use at the end", f"{s.bytes_in_use:,}"),
        ("largest free block at the end", f"{s.largest_free_block / MIB:,.1f} MiB"),
        ("check()", f"passed ({result.checked_blocks} live blocks)"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    return 0
