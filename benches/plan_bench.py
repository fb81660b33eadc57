"""Benchmark of the lifetime planner: the MiniMalloc hard suite, generated sets, real networks.

    .venv/bin/python benches/plan_bench.py [--time-limit 10] [--write BENCHMARKS.md]
        [--parts suite,sets,networks,scale] [--set test] [--set train --count 30]
        [--suite-dir DIR] [--minimalloc PATH]

Prints a Markdown report and checks the targets: every suite instance fits 1 MiB within the
time limit and is at most 5% above LB, the greedy start under 50 ms; on each generated set at
least 95% fit 1 MiB within the time limit and the minimize mode ends at most 3% above LB on
average; each network within 1% of LB in under 1 s. ``--suite-dir`` adds the ``*.1048576.csv``
instances of that folder (the rest of MiniMalloc's challenging suite, from its repository) to
the six kept in ``tests/data/minimalloc``; ``--minimalloc`` runs MiniMalloc's solver binary on
the same instances at the same limit, side by side. The test set is read from
``tests/data/generated/test``; the training set is made by ``npumem.plan.generator``. With
``--write`` the report replaces the body of the ``## Lifetime planner`` section of that file.
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_args import (
    positive_float,
    positive_int,
    read_write_target,
    seed,
    write_target,
)
from npumem.plan import Buffer, Problem, best_greedy, lower_bound, plan_buckets, solve
from npumem.plan.generator import instance_set
from npumem.plan.networks import NETWORKS

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "minimalloc"
TEST_SET = ROOT / "tests" / "data" / "generated" / "test"
MIB = 1 << 20


def minimalloc_seconds(binary: str, problem: Problem, limit: float) -> float | None:
    """Seconds MiniMalloc's solver takes to fit ``problem`` in 1 MiB (``None``: not in time)."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.csv"
        problem.to_csv(source)
        start = time.perf_counter()
        done = subprocess.run(
            [
                binary,
                f"--capacity={MIB}",
                f"--input={source}",
                f"--output={Path(tmp) / 'out.csv'}",
                f"--timeout={limit:g}s",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - start
    return seconds if done.returncode == 0 and "ERROR" not in done.stderr else None


def _median(times: list[float | None], limit: float) -> str:
    """Median time, a miss counting as above the limit."""
    value = statistics.median([t if t is not None else float("inf") for t in times])
    return f"{value:.2f} s" if value != float("inf") else f"> {limit:g} s"


def decide_and_minimize(
    problem: Problem, tl: float, seed: int, binary: str | None
) -> tuple[float | None, float, float | None]:
    """(time to fit 1 MiB or None, minimize-mode gap, MiniMalloc's time or None)."""
    fit = solve(problem, capacity=MIB, time_limit=tl, seed=seed)
    fit.validate()
    best = solve(problem, time_limit=tl, seed=seed)
    best.validate()
    peer = minimalloc_seconds(binary, problem, tl) if binary else None
    ttf = fit.stats.time_to_fit if fit.fits else None
    return ttf, best.gap, peer


def generated_sets(args: argparse.Namespace, out: list[str], failures: list[str]) -> None:
    tl = args.time_limit
    for name in args.set or ["test"]:
        if name == "test":
            problems = [Problem.from_csv(p) for p in sorted(TEST_SET.glob("*.csv"))]
        else:
            problems = instance_set(name, args.count)
        out.append(f"### Generated {name} set ({len(problems)} instances; {tl:g} s per run)")
        out.append("")
        out.append(
            "| instance | buffers | best greedy | time to fit 1 MiB | minimize: gap to LB |"
            + (" MiniMalloc: time to fit |" if args.minimalloc else "")
        )
        out.append("|---|---:|---:|---:|---:|" + ("---:|" if args.minimalloc else ""))
        fits: list[float | None] = []
        peers: list[float | None] = []
        gaps: list[float] = []
        for problem in problems:
            greedy = best_greedy(problem)
            ttf, gap, peer = decide_and_minimize(problem, tl, args.seed, args.minimalloc)
            fits.append(ttf)
            gaps.append(gap)
            peers.append(peer)
            row = (
                f"| {problem.name} | {len(problem)} | +{greedy.arena_size / MIB - 1:.1%} | "
                f"{f'{ttf:.2f} s' if ttf is not None else 'no'} | {gap:.2%} |"
            )
            if args.minimalloc:
                row += f" {f'{peer:.2f} s' if peer is not None else 'no'} |"
            out.append(row)
            print(row, file=sys.stderr, flush=True)
        fitted = sum(t is not None for t in fits)
        out.append("")
        summary = (
            f"**{name}**: {fitted} of {len(problems)} fit 1 MiB within {tl:g} s "
            f"({fitted / len(problems):.0%}), median time to fit {_median(fits, tl)}; "
            f"minimize mode: mean gap {statistics.mean(gaps):.2%}, largest {max(gaps):.2%}, "
            f"{sum(g <= 0.03 for g in gaps)} of {len(gaps)} within 3%."
        )
        if args.minimalloc:
            peer_fitted = sum(t is not None for t in peers)
            summary += (
                f" MiniMalloc: {peer_fitted} of {len(problems)} within {tl:g} s, median "
                f"{_median(peers, tl)}."
            )
        out.append(summary)
        out.append("")
        if fitted < 0.95 * len(problems):
            failures.append(f"{name} set: {fitted} of {len(problems)} fit (target 95%)")
        if statistics.mean(gaps) > 0.03:
            failures.append(f"{name} set: mean gap {statistics.mean(gaps):.2%} (target 3%)")


def synthetic(n: int, seed: int) -> Problem:
    """``n`` buffers with random lives and sizes (a scale check, no known optimum)."""
    rng = random.Random(seed)
    buffers = []
    for i in range(n):
        lower = rng.randrange(0, 4 * n)
        buffers.append(
            Buffer(f"t{i}", lower, lower + rng.randrange(1, 200), rng.randrange(1, 64) * 256)
        )
    return Problem(buffers, name=f"random-{n}")


def suite(args: argparse.Namespace, out: list[str], failures: list[str]) -> None:
    tl = args.time_limit
    files = sorted(DATA.glob(f"*.{MIB}.csv"))
    if args.suite_dir:
        kept = {f.name for f in files}
        files += sorted(f for f in Path(args.suite_dir).glob(f"*.{MIB}.csv") if f.name not in kept)
    out.append(f"### MiniMalloc challenging suite (capacity 1 MiB; {tl:g} s per run)")
    out.append("")
    out.append(
        "| instance | buffers | LB | best greedy (rule) | greedy start | minimize: arena found "
        "| gap to LB | time to fit 1 MiB |"
        + (" MiniMalloc: time to fit |" if args.minimalloc else "")
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if args.minimalloc else ""))
    fits: list[float | None] = []
    peers: list[float | None] = []
    for path in files:
        name = path.name.split(".")[0]
        problem = Problem.from_csv(path)
        bound = lower_bound(problem)
        start = time.perf_counter()
        greedy = best_greedy(problem)
        greedy_ms = (time.perf_counter() - start) * 1e3
        best = solve(problem, time_limit=tl, seed=args.seed)
        best.validate()
        fit = solve(problem, capacity=MIB, time_limit=tl, seed=args.seed)
        fit.validate()
        ttf = fit.stats.time_to_fit if fit.fits else None
        fits.append(ttf)
        peer = minimalloc_seconds(args.minimalloc, problem, tl) if args.minimalloc else None
        peers.append(peer)
        row = (
            f"| {name}{'' if path.parent == DATA else ' (not kept)'} | {len(problem)} | "
            f"{bound:,} | {greedy.arena_size:,} ({greedy.rule}, "
            f"+{greedy.arena_size / bound - 1:.1%}) | {greedy_ms:.1f} ms | {best.arena_size:,} "
            f"| {best.gap:.2%} | {f'{ttf:.2f} s' if ttf is not None else 'no'} |"
        )
        if args.minimalloc:
            row += f" {f'{peer:.2f} s' if peer is not None else 'no'} |"
        out.append(row)
        if ttf is None:
            failures.append(f"{name}: does not fit 1 MiB in {tl:g} s")
        if best.gap > 0.05:
            failures.append(f"{name}: {best.gap:.2%} above LB (target 5%)")
        if greedy_ms >= 50:
            failures.append(f"{name}: greedy start {greedy_ms:.1f} ms (target < 50 ms)")
        print(out[-1], file=sys.stderr, flush=True)
    out.append("")
    summary = (
        f"{sum(t is not None for t in fits)} of {len(files)} fit 1 MiB within {tl:g} s, median "
        f"{_median(fits, tl)}."
    )
    if args.minimalloc:
        summary += (
            f" MiniMalloc: {sum(t is not None for t in peers)} of {len(files)}, median "
            f"{_median(peers, tl)}."
        )
    out.append(summary)
    out.append("")
    out.append(
        "Greedy start: all five production rules (TFLite, TFLite Micro, XLA, TVM, ONNX Runtime) "
        "run and the best kept. Minimize: `plan.solve(problem, time_limit)`, anytime, stopping "
        "early at a proven bound. Time to fit: `plan.solve(problem, capacity=1048576, "
        "time_limit)`, which stops at the first packing within the capacity."
    )
    out.append("")


def networks(args: argparse.Namespace, out: list[str], failures: list[str]) -> None:
    out.append("### Real networks (batch 1, float32, 64-byte alignment, 1 s limit)")
    out.append("")
    out.append(
        "| network | ops | buffers | no reuse | best greedy | arena found | LB | gap | time |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, build in NETWORKS.items():
        graph = build()
        start = time.perf_counter()
        problem = Problem.from_graph(graph, alignment=64)
        solution = solve(problem, time_limit=1.0, seed=args.seed)
        seconds = time.perf_counter() - start
        solution.validate()
        out.append(
            f"| {name} | {len(graph.ops)} | {len(problem)} | {graph.activation_bytes:,} | "
            f"{solution.stats.greedy_arena:,} | {solution.arena_size:,} | "
            f"{solution.lower_bound:,} | {solution.gap:.2%} | {seconds * 1e3:.0f} ms |"
        )
        if solution.gap > 0.01:
            failures.append(f"{name}: {solution.gap:.2%} above LB (target 1%)")
        if seconds >= 1.0:
            failures.append(f"{name}: {seconds:.2f} s (target < 1 s)")
        print(out[-1], file=sys.stderr, flush=True)
    out.append("")
    out.append(
        "No reuse: every tensor in its own memory. Time: lifetimes from the graph plus "
        "`plan.solve`. In-place ops and views are folded in before planning (see "
        "`docs/planner.md`)."
    )
    out.append("")
    out.append("### Double buffering and shape buckets on the networks (2 s per plan)")
    out.append("")
    out.append(
        "| network | inputs double-buffered: arena | LB | gap | buckets batch=1,8,32: largest "
        "arena | LB | weights (shared) |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for name, build in NETWORKS.items():
        problem = Problem.from_graph(build(), alignment=64)
        inputs = [b.id for b in problem.buffers if b.lower == 0]
        double = solve(problem.double_buffered(inputs), time_limit=2.0, seed=args.seed)
        double.validate()
        buckets = plan_buckets(
            build, dims={"batch": [1, 8, 32]}, include_weights=True, time_limit=2.0
        )
        largest = buckets.largest.solution
        for bucket in buckets.buckets:
            bucket.solution.validate()
        out.append(
            f"| {name} | {double.arena_size:,} | {double.lower_bound:,} | {double.gap:.2%} | "
            f"{largest.arena_size:,} | {largest.lower_bound:,} | {buckets.weights_size:,} |"
        )
        print(out[-1], file=sys.stderr, flush=True)
    out.append("")
    out.append(
        "Double buffering: `problem.double_buffered(inputs)`, the graph inputs loaded for the "
        "next inference during this one (two slots each, live over the whole iteration). "
        "Buckets: `plan.plan_buckets(network, dims={'batch': [1, 8, 32]}, "
        "include_weights=True)`: one activation arena per batch size after one shared weights "
        "region; the memory to reserve is the weights plus the largest arena."
    )
    out.append("")


def scale(args: argparse.Namespace, out: list[str], failures: list[str]) -> None:
    tl = args.time_limit
    out.append(f"### Scale (random lives and sizes, {tl:g} s limit)")
    out.append("")
    out.append("| problem | buffers | greedy start | greedy arena | arena found | LB | gap |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for n in (1000, 5000):
        problem = synthetic(n, args.seed)
        start = time.perf_counter()
        greedy = best_greedy(problem)
        greedy_ms = (time.perf_counter() - start) * 1e3
        solution = solve(problem, time_limit=tl, seed=args.seed)
        solution.validate()
        out.append(
            f"| {problem.name} | {n} | {greedy_ms:.0f} ms | {greedy.arena_size:,} | "
            f"{solution.arena_size:,} | {solution.lower_bound:,} | {solution.gap:.2%} |"
        )
        print(out[-1], file=sys.stderr, flush=True)
    out.append("")


PARTS = {"suite": suite, "sets": generated_sets, "networks": networks, "scale": scale}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--time-limit", type=positive_float, default=10.0)
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to run")
    parser.add_argument("--set", action="append", choices=("train", "test"))
    parser.add_argument(
        "--count", type=positive_int, default=30, help="instances of a generated set"
    )
    parser.add_argument("--suite-dir", help="more MiniMalloc instances (*.1048576.csv)")
    parser.add_argument("--minimalloc", metavar="PATH", help="MiniMalloc's solver binary")
    parser.add_argument("--write", metavar="BENCHMARKS.md", help="update that file's section")
    args = parser.parse_args()
    # The file to update is read first, so that a bad path is refused before anything is measured.
    text = read_write_target(parser, args.write) if args.write else ""
    unknown = [part for part in args.parts.split(",") if part not in PARTS]
    if unknown:
        parser.error(f"--parts: unknown part {unknown[0]!r} (choose from {', '.join(PARTS)})")
    failures: list[str] = []
    out: list[str] = []
    command = " ".join(["`.venv/bin/python benches/plan_bench.py", *sys.argv[1:]]) + "`"
    out.append(
        f"Measured by {command} on {platform.machine()} ({platform.python_implementation()} "
        f"{platform.python_version()}), one process, on a shared 2-core machine. The search "
        "loop runs in Rust (`npumem_core::plan_search`), the rest in Python."
    )
    out.append("")
    for part in args.parts.split(","):
        PARTS[part](args, out, failures)
    out.append(
        "Targets: " + ("all met." if not failures else "MISSED: " + "; ".join(failures) + ".")
    )
    report = "\n".join(out) + "\n"
    print(report)
    if args.write:
        pattern = re.compile(r"(## Lifetime planner\n\n)(.*?)(?=\n## |\Z)", re.S)
        if not pattern.search(text):
            print(f"{args.write}: no '## Lifetime planner' section", file=sys.stderr)
            return 2
        if not write_target(
            parser, args.write, pattern.sub(lambda m: m.group(1) + report, text, count=1)
        ):
            return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
