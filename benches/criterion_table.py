"""Print criterion results as Markdown tables: the median time per element of every function in
the chosen groups, and each one's ratio to a reference function of the same group.

    python benches/criterion_table.py --prefix slab_pair/ --reference npumem
    python benches/criterion_table.py --prefix threads/ --reference npumem --throughput

Reads ``target/criterion/<group>/<function>/new/estimates.json`` and ``benchmark.json`` (written by
``cargo bench``), so it reports the latest run of each benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(root: Path, prefix: str) -> dict[str, dict[str, tuple[float, float]]]:
    """``group -> function -> (median ns per iteration, elements per iteration)``."""
    groups: dict[str, dict[str, tuple[float, float]]] = {}
    for bench in sorted(root.glob("**/new/benchmark.json")):
        meta = json.loads(bench.read_text())
        group = meta["group_id"]
        if not group.startswith(prefix):
            continue
        estimates = json.loads((bench.parent / "estimates.json").read_text())
        median = float(estimates["median"]["point_estimate"])
        throughput = meta.get("throughput") or {}
        elements = float(throughput.get("Elements", 1))
        # A benchmark named by a parameter alone (BenchmarkId::from_parameter) has no function id.
        function = meta["function_id"] if meta["function_id"] is not None else meta["value_str"]
        groups.setdefault(group, {})[function] = (median, elements)
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("target/criterion"))
    parser.add_argument("--prefix", required=True, help="group id prefix, e.g. slab_pair/")
    parser.add_argument("--reference", required=True, help="function id the ratios divide by")
    parser.add_argument(
        "--throughput",
        action="store_true",
        help="report million elements per second (aggregate throughput) instead of ns per element",
    )
    args = parser.parse_args(argv)
    groups = load(args.root, args.prefix)
    if not groups:
        print(f"no criterion results for groups starting with {args.prefix!r}", file=sys.stderr)
        return 1
    functions = sorted({f for g in groups.values() for f in g})
    unit = "M elements/s" if args.throughput else "ns per element"
    print(f"| group ({unit}, median) | " + " | ".join(functions) + " |")
    print("|---|" + "---:|" * len(functions))
    for group in sorted(groups, key=lambda g: (len(g), g)):
        row = groups[group]
        ref = row.get(args.reference)
        cells = []
        for f in functions:
            if f not in row:
                cells.append("")
                continue
            median, elements = row[f]
            per = median / elements
            value = elements / median * 1e3 if args.throughput else per
            text = f"{value:.1f}"
            if ref is not None and f != args.reference:
                ref_per = ref[0] / ref[1]
                ratio = per / ref_per
                text += f" ({ratio:.2f}x)"
            cells.append(text)
        print(f"| {group} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
