"""How often a thread publishes its running byte count (`stats/counters.rs`) in the churn of
`mixed_sizes` (a random held block freed, a random size allocated in its place; sizes 256 B-1
MiB, log-uniform, 2,000 blocks held): a model of the count's random walk, not a run of npumem.
A publication happens when the count has moved past the slack since the last one; it prints
the steps between two publications for each slack.

    .venv/bin/python benches/publication_model.py [--steps 200000] [--slack-mib 1 4 8]
"""

from __future__ import annotations

import argparse
import math
import random

from bench_args import positive_int_at_most

LOW, HIGH, HELD = 256, 1 << 20, 2000


def steps_between_publications(slack: int, steps: int, seed: int = 1) -> float:
    rng = random.Random(seed)

    def size() -> int:
        return int(math.exp(rng.uniform(math.log(LOW), math.log(HIGH))))

    held = [size() for _ in range(HELD)]
    count = published = publications = 0
    for _ in range(steps):
        i = rng.randrange(HELD)
        new = size()
        count += new - held[i]
        held[i] = new
        if abs(count - published) > slack:
            publications += 1
            published = count
    return steps / max(publications, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=positive_int_at_most(10_000_000), default=200_000, help="churn steps"
    )
    parser.add_argument(
        "--slack-mib",
        type=positive_int_at_most(1024),
        nargs="+",
        default=[1, 4, 8],
        help="slacks, in MiB",
    )
    args = parser.parse_args()
    print(f"Churn of 256 B-1 MiB, {HELD} blocks held, {args.steps} steps\n")
    print("| slack | steps between two publications |")
    print("|---:|---:|")
    for mib in args.slack_mib:
        print(f"| {mib} MiB | {steps_between_publications(mib << 20, args.steps):.0f} |")


if __name__ == "__main__":
    main()
