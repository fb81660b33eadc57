"""The bench scripts refuse bad arguments like every other reader: argparse's usage and one
error line on stderr, exit status 2, no traceback and nothing measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHES = Path(__file__).resolve().parents[1] / "benches"

BAD = [
    ("python_roundtrip.py", ["--repeat", "0"], "--repeat"),
    ("python_churn.py", ["--occupancy", "96"], "--occupancy"),
    ("python_churn.py", ["--steps", "x"], "--steps"),
    ("dlpack_export.py", ["--number", "x"], "--number"),
    ("compaction_residue.py", ["--seeds", "-1"], "--seeds"),
    ("compaction_residue.py", ["--min", "5000", "--max", "10"], "--min"),
    ("compaction_residue.py", ["--max", "100000000"], "--max"),
    ("kv_bench.py", ["--requests", "0"], "--requests"),
    ("tiers_bench.py", ["--time-limit", "nan"], "--time-limit"),
    ("tiers_bench.py", ["--write", "/nonexistent/BENCHMARKS.md"], "--write"),
    ("tiers_bench.py", ["--write", "/"], "--write"),
    ("plan_aligned.py", ["--count", "0"], "--count"),
    ("plan_aligned.py", ["--time-limit", "nan"], "--time-limit"),
    ("plan_aligned.py", ["--kinds", "spiral"], "--kinds"),
    ("plan_aligned.py", ["--seed", str(1 << 64)], "--seed"),
    ("plan_bench.py", ["--seed", str(1 << 64)], "--seed"),
    ("scale_checks.py", ["--scale", "0"], "--scale"),
    ("scale_checks.py", ["--scale", "17"], "--scale"),
    ("scale_checks.py", ["--only", "bogus"], "--only"),
    ("plan_bench.py", ["--parts", "bogus"], "--parts"),
    ("plan_bench.py", ["--time-limit", "-1"], "--time-limit"),
    ("plan_bench.py", ["--count", "0"], "--count"),
    ("plan_bench.py", ["--write", "/nonexistent/BENCHMARKS.md"], "--write"),
    ("trace_stacks.py", ["0"], "pairs"),
    ("compare_builds.py", ["a", "b", "--rounds", "0"], "--rounds"),
    ("small_fill_model.py", ["--banks", "0"], "--banks"),
    ("small_fill_model.py", ["--banks", "99999999"], "--banks"),
    ("small_fill_model.py", ["--seeds", "x"], "--seeds"),
    ("publication_model.py", ["--slack-mib", "0"], "--slack-mib"),
    ("publication_model.py", ["--steps", "99999999999"], "--steps"),
    ("large_trace.py", ["/tmp/unused.json", "-5"], "events"),
    ("large_trace.py", ["/tmp/unused.json", "10", "--failed-every", "-1"], "--failed-every"),
    ("large_trace.py", ["/nonexistent/dir/trace.json", "10"], "/nonexistent/dir/trace.json"),
    ("pool_scaling.py", ["--parts", "refill,bogus"], "--parts"),
    ("pool_scaling.py", ["--gib", "1,0"], "--gib"),
    ("pool_scaling.py", ["--blocks", "-3"], "--blocks"),
]


@pytest.mark.parametrize(("script", "args", "named"), BAD, ids=[f"{s}:{a[-1]}" for s, a, _ in BAD])
def test_a_bad_argument_is_one_line_and_exit_2(script: str, args: list[str], named: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHES / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and named in errors[0], done.stderr
