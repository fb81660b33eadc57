"""Memory tiers: hit rates of the promotion policies, the cost of a tiered allocation from
Python, and static tiering (the weight placed in SRAM against its upper bound).

    .venv/bin/python benches/tiers_bench.py [--part hits|alloc|static|all] [--time-limit 2]
                                            [--write BENCHMARKS.md]

* ``hits``: the tiered demo (:mod:`npumem.workloads.tiered`) recorded once per mix and SRAM
  size, and replayed under the frequency policy, LRU and size-only placement;
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
import timeit
from pathlib import Path

import npumem
from npumem import plan
from npumem.plan.networks import NETWORKS
from npumem.tiers import TieredPool
from npumem.workloads.tiered import MIXES, POLICIES, run_tiered_demo

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "minimalloc"
MIB = 1 << 20


def hits(out: list[str], requests: int) -> None:
    out += [
        "### Fast-tier hit rate by policy, on the demo's accesses",
        "",
        f"The tiered demo with 4 cores, {requests} requests, seed 0 (`run_tiered_demo`): one "
        "live run with the frequency policy, recorded, then replayed on fresh pools under each "
        "policy. Hit rate: the share of accesses (`touch`) served by SRAM; of the bytes: each "
        "access weighted by its block's size. Promotions and spills of the replay.",
        "",
        "| mix | SRAM per core | largest SRAM block | policy | hit rate | of the bytes "
        "| promotions | demotions | spills |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for mix in MIXES:
        for sram, largest in ((8 * MIB, 4 * MIB), (4 * MIB, 4 * MIB), (4 * MIB, MIB)):
            result = run_tiered_demo(
                requests=requests, sram_per_core=sram, fast_max_block=largest, mix=mix
            )
            for name in POLICIES:
                s = result.compared[name]
                out.append(
                    f"| {mix} | {sram // MIB} MiB | {largest // MIB} MiB | {name} | "
                    f"{s.hit_rate:.1%} | {s.byte_hit_rate:.1%} | {s.promotions} | "
                    f"{s.demotions} | {s.spills} |"
                )
                print(out[-1], file=sys.stderr, flush=True)
    out.append("")


def alloc_cost(out: list[str], repeat: int) -> None:
    mem = TieredPool(
        [npumem.Pool(64 * MIB, cores=1, name=f"sram{c}") for c in range(2)],
        npumem.Pool(256 * MIB, cores=2, name="hbm"),
    )
    tb = mem.alloc(4096, core=0)
    env = {"mem": mem, "fast": mem.fast[0], "slow": mem.slow, "tb": tb}
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
    ]
    out += [
        "### Cost of a tiered allocation from Python",
        "",
        f"Medians of {repeat} runs of 20,000 calls (`timeit`), two fast pools of 64 MiB and a "
        "256 MiB slow pool, host-backed.",
        "",
        "| operation | median ns |",
        "|---|---:|",
    ]
    for label, stmt in rows:
        runs = timeit.Timer(stmt, globals=env).repeat(repeat=repeat, number=20_000)
        out.append(f"| `{label}` | {statistics.median(runs) / 20_000 * 1e9:.0f} |")
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
    parser.add_argument("--time-limit", type=float, default=2.0)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--write", metavar="BENCHMARKS.md", help="update that file's section")
    args = parser.parse_args()
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
        path = Path(args.write)
        text = path.read_text()
        pattern = re.compile(r"(## Memory tiers\n\n)(.*?)(?=\n## |\Z)", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda m: m.group(1) + report, text, count=1)
        else:
            text = text.rstrip("\n") + "\n\n## Memory tiers\n\n" + report
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
