"""``npumem plan -q`` prints nothing on success, and a failure still prints its one-line reason on
stderr: a capacity not met (one arena, shape buckets, pools) exits 1 with that line."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_contract import run_cli
from test_plan_cli import small_onnx_bytes

DATA = Path(__file__).resolve().parent / "data" / "minimalloc"

# The linear scan packs these in 28 bytes and every rule in 29; the bound is 24.
ABOVE_THE_BOUND = """\
id,lower,upper,size
b0,4,8,8
b1,4,6,8
b2,0,4,8
b3,1,5,6
b4,5,8,8
b5,0,2,6
b6,0,1,9
"""


def one_reason(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    assert lines[0].startswith("npumem plan: capacity"), lines
    return lines[0]


def test_a_capacity_proven_impossible_is_said_with_quiet_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.csv"
    argv = ["plan", str(DATA / "input.12.csv"), "-o", str(out), "--capacity"]
    status, printed, err = run_cli([*argv, "11", "-q"], capsys)
    assert (status, printed) == (1, "")  # -q hides the figures, not the failure
    reason = one_reason(err)
    assert "capacity 11 not met (proven impossible)" in reason and "not written" in reason
    assert not out.exists()
    # Without -q the same line follows the figures.
    status, printed, err = run_cli([*argv, "11"], capsys)
    assert status == 1 and "arena size" in printed and one_reason(err) == reason
    # On success -q prints nothing at all.
    assert run_cli([*argv, "12", "-q"], capsys) == (0, "", "")
    assert out.exists()


def test_a_capacity_not_met_in_time_is_said_with_quiet_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "p.csv"
    src.write_text(ABOVE_THE_BOUND)
    # No time to search: the greedy start (28 bytes) is over the capacity, the bound (24) not.
    argv = ["plan", str(src), "--capacity", "24", "--time-limit", "0", "-q"]
    status, printed, err = run_cli(argv, capsys)
    assert (status, printed) == (1, "")
    assert "capacity 24 not met (no packing found in 0 s)" in one_reason(err)


def test_buckets_over_the_capacity_are_said_with_quiet_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "sym.onnx"
    model.write_bytes(small_onnx_bytes("N"))
    out = tmp_path / "out.h"
    argv = ["plan", str(model), "--dim", "N=1,8", "-o", str(out), "--capacity", "1", "-q"]
    status, printed, err = run_cli([*argv, "--time-limit", "0.5"], capsys)
    assert (status, printed) == (1, "")
    reason = one_reason(err)
    assert "capacity 1 not met: the largest bucket needs" in reason
    assert "no bucket's file written" in reason
    assert list(tmp_path.glob("out.*")) == []


def test_pools_over_their_capacities_are_said_with_quiet_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiers.json"
    argv = ["plan", str(DATA / "input.12.csv"), "-o", str(out), "-q", "--time-limit", "0.5"]
    status, printed, err = run_cli([*argv, "--pool", "sram=4", "--pool", "hbm=4"], capsys)
    assert (status, printed) == (1, "")
    reason = one_reason(err)
    assert "capacity not met: pool hbm's arena is" in reason and "not written" in reason
    assert not out.exists()
