"""The lifetime planner on perfect packings with mixed large alignments (known optimum).

    .venv/bin/python benches/plan_aligned.py [--count 24] [--first-seed 0] [--time-limit 2]
        [--seed 0] [--kinds guillotine,skyline,skyline-mixed]

Each instance is `npumem.plan.generator.instance(kind, seed, aligned=True)`: a cut of the
1 MiB x 1024-step square whose buffers are aligned to 64 B, 4 KiB, 64 KiB or 1 MiB, each to one
that divides its byte start in the cut, so the cut is an aligned packing at 1 MiB and the
optimum is 1 MiB (the lower bound is checked to say so). The kinds are taken in turn from seed
`--first-seed` on. For each instance `npumem.plan.solve(problem, time_limit=...)` runs in
minimize mode; the report gives the gap (arena / optimum - 1) per instance, then the median, the
mean and the largest, and how many reach the optimum.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench_args import non_negative_int, positive_float, positive_int, seed
from npumem.plan import lower_bound, solve
from npumem.plan.generator import KINDS, instance

MIB = 1 << 20


def kinds(text: str) -> list[str]:
    """A comma-separated list of the generator's kinds, at least one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in KINDS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of {', '.join(KINDS)}, got {text!r}"
        )
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--count", type=positive_int, default=24, help="instances (default 24)")
    parser.add_argument("--first-seed", type=non_negative_int, default=0)
    parser.add_argument("--time-limit", type=positive_float, default=2.0, help="seconds a solve")
    parser.add_argument("--seed", type=seed, default=0, help="the search's seed")
    parser.add_argument("--kinds", type=kinds, default=list(KINDS))
    args = parser.parse_args()

    gaps: list[float] = []
    print("| instance | buffers | greedy | arena found | gap to optimum | seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    for k in range(args.count):
        kind = args.kinds[k % len(args.kinds)]
        problem = instance(kind, args.first_seed + k, aligned=True)
        bound = lower_bound(problem)
        if bound != MIB:
            print(f"{problem.name}: lower bound {bound}, not the 1 MiB cut", file=sys.stderr)
            return 1
        began = time.perf_counter()
        solution = solve(problem, time_limit=args.time_limit, seed=args.seed)
        seconds = time.perf_counter() - began
        gap = solution.arena_size / MIB - 1
        gaps.append(gap)
        greedy = solution.stats.greedy_arena / MIB - 1
        print(
            f"| {problem.name} | {len(problem)} | +{greedy:.2%} | {solution.arena_size:,} "
            f"| {gap:.2%} | {seconds:.2f} |",
            flush=True,
        )
    at_optimum = sum(gap == 0 for gap in gaps)
    print(
        f"\n{len(gaps)} instances, {args.time_limit:g} s each: gap median "
        f"{statistics.median(gaps):.2%}, mean {statistics.fmean(gaps):.2%}, largest "
        f"{max(gaps):.2%}; {at_optimum} at the optimum"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
