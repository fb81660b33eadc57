"""Memory tiers: hit rates of the promotion policies, the cost of a tiered allocation from
Python, and static tiering (the weight placed in SRAM against its upper bound).

    .venv/bin/python benches/tiers_bench.py [--part hits|alloc|static|all] [--time-limit 2]
                                            [--write BENCHMARKS.md]

* ``hits``: the tiered demo (:mod:`npumem.workloads.tiered`, both mixes), the main demo with
  tiers and two synthetic runs, each recorded once and replayed under each policy for several
  SRAM sizes;
* ``alloc``: medians of ``mem.alloc(n, tier=...).free()`` round trips on each tier, with
  ``pool.alloc(n).free()`` on the same pool as the floor, and of ``mem.touch(tb)``;
* ``static``: ``plan.solve(problem, pools=[("sram", C), ("hbm", None)])`` on the three bundled
  networks (float16, weights = bytes) and on the MiniMalloc instances (weights = bytes, SRAM
  half the 1 MiB they need): the weight placed in SRAM, the upper bound, the gap.

With ``--write`` the report replaces the body of the ``## Memory tiers`` section of that file
(appended when missing).
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import sys
import time
import timeit
from pathlib import Path

import npumem
from bench_args import positive_float, positive_int, read_write_target
from npumem import fileio, plan
from npumem.plan.networks import NETWORKS
from npumem.tiers import TieredPool, TierEvent, replay
from npumem.workloads.tiered import (
    COLD_ADMIT,
    MIXES,
    make_policy,
    run_tiered_demo,
    synthetic_events,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "minimalloc"
MIB = 1 << 20


HIT_POLICIES = ("frequency", "frequency-hot-only", "lru", "size-only")
HIT_CONFIGS = ((2, 1), (4, 1), (4, 4), (8, 4), (16, 4))  # SRAM per core, largest block (MiB)


def _traces(requests: int) -> dict[str, tuple[int, list[TierEvent]]]:
    """Each trace recorded once: cores and events."""
    from npumem.workloads.demo import run_demo

    traces: dict[str, tuple[int, list[TierEvent]]] = {}
    for mix in MIXES:
        result = run_tiered_demo(requests=requests, mix=mix, compare=())
        traces[f"tiered demo, {mix}"] = (result.cores, result.events)
    main = run_demo(requests=requests * 3 // 2, workers=4, tiers=True, interval=0.1).tiers
    assert main is not None
    traces["npumem demo"] = (main.cores, main.events)
    traces["Zipf, 400 blocks, scratch"] = (4, synthetic_events(1))
    traces["Zipf, 1500 blocks"] = (4, synthetic_events(2, blocks=1500, scratch=False))
    return traces


def hits(out: list[str], requests: int) -> None:
    out += [
        "### Fast-tier hit rate by policy and SRAM size",
        "",
        "Each trace is recorded once and replayed on fresh pools (4 cores, host-backed) under "
        "each policy and SRAM size. Hit rate: the share of accesses (`touch`) served by SRAM. "
        f"Traces: the tiered demo (`run_tiered_demo`, {requests} requests, seed 0) with the "
        f"steady and the shifting mix; the main demo with tiers (`run_demo(tiers=True)`, "
        f"{requests * 3 // 2} requests, 4 workers: the whole run, its reads entered in windows "
        "of 128); two synthetic "
        "runs (`synthetic_events`: Zipf popularity reshuffled in 3 phases, 1 KiB to 8 MiB "
        "blocks, one with short-lived hot scratch blocks). `frequency`: decayed access counts "
        f"per byte, cold blocks up to {COLD_ADMIT // 1024} KiB admitted while there is room; "
        "`frequency-hot-only`: the same without admitting cold blocks.",
        "",
        "| trace | SRAM per core | largest SRAM block | " + " | ".join(HIT_POLICIES) + " |",
        "|---|---:|---:|" + "---:|" * len(HIT_POLICIES),
    ]
    for label, (cores, events) in _traces(requests).items():
        for sram, largest in HIT_CONFIGS:
            rates = []
            for name in HIT_POLICIES:
                mem = TieredPool(
                    [npumem.Pool(sram * MIB, cores=1) for _ in range(cores)],
                    npumem.Pool(4096 * MIB, cores=cores),
                    fast_max_block=largest * MIB,
                    policy=make_policy(name, largest * MIB),
                )
                rates.append(replay(events, mem).hit_rate)
            best = max(rates)
            cells = [f"**{r:.1%}**" if r == best else f"{r:.1%}" for r in rates]
            out.append(f"| {label} | {sram} MiB | {largest} MiB | " + " | ".join(cells) + " |")
            print(out[-1], file=sys.stderr, flush=True)
    out.append("")


def alloc_cost(out: list[str], repeat: int) -> None:
    mem = TieredPool(
        [npumem.Pool(64 * MIB, cores=1, name=f"sram{c}") for c in range(2)],
        npumem.Pool(256 * MIB, cores=2, name="hbm"),
    )
    tb = mem.alloc(4096, core=0)
    many = [mem.alloc(4096, core=i % 2) for i in range(100)]
    env = {
        "mem": mem,
        "fast": mem.fast[0],
        "slow": mem.slow,
        "tb": tb,
        "many": many,
        "counts": [40] * len(many),
    }
    rows = [
        (
            "mem.alloc(4096, core=0, tier='fast').free()",
            "mem.alloc(4096, core=0, tier='fast').free()",
        ),
        (
            "mem.alloc(4096, core=0, tier='slow').free()",
            "mem.alloc(4096, core=0, tier='slow').free()",
        ),
        ("mem.alloc(4096, core=0, hot=True).free()", "mem.alloc(4096, core=0, hot=True).free()"),
        ("mem.alloc(65536, core=0).free()", "mem.alloc(65536, core=0).free()"),
        ("fast.alloc(4096).free() (the pool alone)", "fast.alloc(4096).free()"),
        ("slow.alloc(4096).free() (the pool alone)", "slow.alloc(4096).free()"),
        ("mem.touch(tb)", "mem.touch(tb)"),
        ("mem.touch_many(many), per block (100 blocks)", "mem.touch_many(many)"),
        (
            "mem.touch_many(many, counts), per block (100 blocks, 40 accesses each)",
            "mem.touch_many(many, counts)",
        ),
    ]
    out += [
        "### Cost of a tiered allocation from Python",
        "",
        f"Medians of {repeat} runs of 20,000 calls (`timeit`, thread CPU time), two fast pools "
        "of 64 MiB and a 256 MiB slow pool, host-backed.",
        "",
        "| operation | median ns |",
        "|---|---:|",
    ]
    for label, stmt in rows:
        number = 200 if "many" in stmt else 20_000
        calls = number * (len(many) if "many" in stmt else 1)
        # Thread CPU time: on a shared machine the wall time also counts the time the thread
        # waited for a CPU.
        runs = timeit.Timer(stmt, globals=env, timer=time.thread_time).repeat(
            repeat=repeat, number=number
        )
        out.append(f"| `{label}` | {statistics.median(runs) / calls * 1e9:.0f} |")
        print(out[-1], file=sys.stderr, flush=True)
    out.append("")


def static(out: list[str], time_limit: float) -> None:
    out += [
        "### Static tiering: weight placed in SRAM against the upper bound",
        "",
        f'`plan.solve(problem, pools=[("sram", C), ("hbm", None)], time_limit={time_limit:g})`'
        ", weights = bytes (a buffer's weight is its size). Bound: the Lagrangian bound of the "
        "LP relaxation with lifetimes (`npumem.plan.tiers`); the optimum lies between the two. "
        "Networks: batch 1, float16, 64-byte alignment.",
        "",
        "| problem | buffers | SRAM | in SRAM | weight in SRAM | upper bound | gap | HBM arena "
        "| time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cases: list[tuple[str, plan.Problem, int]] = []
    for name, build in NETWORKS.items():
        problem = plan.Problem.from_graph(build(dtype="float16"), alignment=64)
        cases += [(name, problem, MIB), (name, problem, 2 * MIB)]
    for letter in "ABCDEF":
        path = next(DATA.glob(f"{letter}.*.csv"))
        cases.append((f"MiniMalloc {letter}", plan.Problem.from_csv(path), 512 * 1024))
    for label, problem, cap in cases:
        sol = plan.solve(problem, pools=[("sram", cap), ("hbm", None)], time_limit=time_limit)
        sol.validate()
        out.append(
            f"| {label} | {len(problem)} | {cap // 1024:,} KiB | "
            f"{len(sol.solutions['sram'].offsets)} | {sol.weight_placed:,.0f} | "
            f"{sol.weight_bound:,.0f} | {sol.weight_gap:.2%} | "
            f"{sol.solutions['hbm'].arena_size:,} | {sol.seconds:.2f} s |"
        )
        print(out[-1], file=sys.stderr, flush=True)
    out.append("")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--part", choices=("hits", "alloc", "static", "all"), default="all")
    parser.add_argument("--time-limit", type=positive_float, default=2.0)
    parser.add_argument("--requests", type=positive_int, default=400)
    parser.add_argument("--repeat", type=positive_int, default=15)
    parser.add_argument("--write", metavar="BENCHMARKS.md", help="update that file's section")
    args = parser.parse_args()
    # The file to update is read first, so that a bad path is refused before anything is measured.
    text = read_write_target(parser, args.write) if args.write else ""
    out = [
        f"Measured by `.venv/bin/python benches/tiers_bench.py --part {args.part} --time-limit "
        f"{args.time_limit:g} --requests {args.requests}` on {platform.machine()} "
        f"({platform.python_implementation()} {platform.python_version()}).",
        "",
    ]
    if args.part in ("hits", "all"):
        hits(out, args.requests)
    if args.part in ("alloc", "all"):
        alloc_cost(out, args.repeat)
    if args.part in ("static", "all"):
        static(out, args.time_limit)
    report = "\n".join(out)
    print(report)
    if args.write:
        pattern = re.compile(r"(## Memory tiers\n\n)(.*?)(?=\n## |\Z)", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda m: m.group(1) + report, text, count=1)
        else:
            text = text.rstrip("\n") + "\n\n## Memory tiers\n\n" + report
        try:
            fileio.write_text(args.write, text)
        except OSError as e:
            print(
                f"tiers_bench.py: error: cannot write {args.write}: {e.strerror or e}",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
