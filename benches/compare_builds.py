"""Two builds of npumem side by side, in alternation: the same measurements on each, in the order
A B B A A B ..., so that a machine that slows down or speeds up during the run affects both
alike. Prints a Markdown table of medians and ranges.

    python3 benches/compare_builds.py BEFORE AFTER [--rounds 3] [--only REGEX]

Each of BEFORE and AFTER is a folder with `examples/{pair_loop,random_loop,threads_loop,
compaction_pause}` (from `cargo build --release -p npumem-benches --examples` of that build) and
a `.venv` in which that build's npumem is installed.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench_args import positive_int

ROUNDTRIP = Path(__file__).with_name("python_roundtrip.py")
EXAMPLES = ("pair_loop", "random_loop", "threads_loop", "compaction_pause")


class BenchError(Exception):
    """A measurement that could not be taken; the message says which and why."""


def run(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BenchError(f"{' '.join(cmd)}: {exc}") from None
    return done.stdout


def number(pattern: str, text: str, what: str) -> float:
    found = re.search(pattern, text)
    if found is None:
        raise BenchError(f"{what}: no figure in the output")
    return float(found.group(1).replace(",", ""))


def roundtrip(size: int) -> Callable[[Path], float]:
    def measure(build: Path) -> float:
        out = run([str(build / ".venv/bin/python"), str(ROUNDTRIP), "--repeat", "7"])
        return number(rf"`pool.alloc\({size}\).free\(\)` \| ([\d,]+)", out, "python round trip")

    return measure


def pair(size: int) -> Callable[[Path], float]:
    def measure(build: Path) -> float:
        out = run([str(build / "examples/pair_loop"), "20000000", str(size)])
        return number(r"([\d.]+) ns/pair", out, "pair_loop")

    return measure


def random_sizes(build: Path) -> float:
    return number(
        r"([\d.]+) ns per", run([str(build / "examples/random_loop"), "2000000"]), "random_loop"
    )


def two_threads(build: Path) -> float:
    out = run([str(build / "examples/threads_loop"), "3000000"])
    return number(r"wall [\d.]+ -> [\d.]+ M pairs/s \(([\d.]+)x\)", out, "threads_loop")


def compaction(build: Path) -> tuple[float, float]:
    out = run([str(build / "examples/compaction_pause"), "1024", "100000", "3"])
    full = number(r"full: median pause .*?: ([\d.]+)x", out, "compaction_pause")
    longest = number(
        r"incremental max_bytes 1 MiB: .*?longest pause ([\d.]+) ms", out, "compaction_pause"
    )
    return full, longest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--only", default="", help="measure only the rows whose name matches")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for build in (args.before, args.after):
        missing = [e for e in EXAMPLES if not (build / "examples" / e).is_file()]
        if not (build / ".venv/bin/python").is_file():
            missing.append(".venv/bin/python")
        if missing:
            parser.error(f"{build}: missing {', '.join(missing)}")
    simple: dict[str, Callable[[Path], float]] = {
        "alloc+free pair 256 B (ns)": pair(256),
        "alloc+free pair 64 KiB (ns)": pair(65536),
        "random sizes 256 B-1 MiB at 50% (ns per step)": random_sizes,
        "two threads / one thread (wall)": two_threads,
        "Python pool.alloc(256).free() (ns)": roundtrip(256),
        "Python pool.alloc(65536).free() (ns)": roundtrip(65536),
    }
    rows = {name: f for name, f in simple.items() if re.search(args.only, name)}
    pauses = re.search(args.only, "compaction pause") is not None
    names = [
        *rows,
        *(
            ["full compaction pause / memmove", "incremental 1 MiB: longest pause (ms)"]
            if pauses
            else []
        ),
    ]
    results: dict[str, dict[Path, list[float]]] = {
        n: {args.before: [], args.after: []} for n in names
    }
    try:
        for r in range(args.rounds):
            order = (args.before, args.after) if r % 2 == 0 else (args.after, args.before)
            for name, measure in rows.items():
                for build in order:
                    results[name][build].append(measure(build))
            if pauses:
                for build in order:
                    full, longest = compaction(build)
                    results["full compaction pause / memmove"][build].append(full)
                    results["incremental 1 MiB: longest pause (ms)"][build].append(longest)
            print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    except BenchError as exc:
        print(f"compare_builds: error: {exc}", file=sys.stderr)
        return 1

    def cell(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

    print("| measurement | before: median (range) | after: median (range) | after / before |")
    print("|---|---:|---:|---:|")
    for name in names:
        b, a = results[name][args.before], results[name][args.after]
        ratio = statistics.median(a) / statistics.median(b)
        print(f"| {name} | {cell(b)} | {cell(a)} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
