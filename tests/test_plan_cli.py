"""The ``npumem plan`` subcommand: output files, printed figures and exit statuses."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from npumem._argtypes import byte_count as parse_bytes
from npumem.plan import Problem, Solution
from npumem.plan.cli import add_parser
from npumem.plan.networks import resnet50

DATA = Path(__file__).resolve().parent / "data" / "minimalloc"


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="npumem")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    status: int = args.func(args)
    return status


def test_csv_in_csv_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.csv"
    assert run(str(DATA / "input.12.csv"), "-o", str(out)) == 0
    printed = capsys.readouterr().out
    assert "arena size   12 bytes" in printed
    assert "lower bound  12 bytes" in printed
    assert "gap          0.00%" in printed
    assert "time" in printed
    solved = Problem.from_csv(out)  # offsets come back as pinned buffers
    Solution(solved, {b.id: b.offset or 0 for b in solved.buffers}).validate(capacity=12)


def test_capacity_met_and_not_met(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = str(DATA / "input.12.csv")
    assert run(src, "-o", str(tmp_path / "a.json"), "--capacity", "12") == 0
    assert json.loads((tmp_path / "a.json").read_text())["arena_size"] <= 12
    assert run(src, "-o", str(tmp_path / "b.csv"), "--capacity", "11", "--time-limit", "1") == 1
    captured = capsys.readouterr()
    assert "does NOT fit" in captured.out
    assert "capacity 11 not met" in captured.err
    assert (tmp_path / "b.csv").exists()  # the best packing found is still written


def test_graph_json_to_c_header(tmp_path: Path) -> None:
    graph = tmp_path / "resnet50.json"
    resnet50().to_json(graph)
    header = tmp_path / "resnet50.h"
    assert run(str(graph), "-o", str(header), "--time-limit", "2", "-q") == 0
    text = header.read_text()
    assert "#define RESNET50_ARENA_SIZE" in text
    assert '{"conv1.out", ' in text
    assert '{"conv1.relu.out", ' in text  # the in-place output appears at its input's offset


def test_onnx_input_with_dims(tmp_path: Path) -> None:
    import onnx

    from test_plan_onnx import small_model

    path = tmp_path / "m.onnx"
    onnx.save(small_model(), path)
    assert run(str(path), "--dim", "batch=4", "-o", str(tmp_path / "m.csv"), "-q") == 0
    assert run(str(path), "-q") == 2  # the batch dimension is not bound


@pytest.mark.parametrize(
    ("content", "name"),
    [
        ("id,lower,upper,size\na,0,1,-5\n", "bad.csv"),
        ("id,lower\n", "bad.csv"),
        ('{"buffers": 3}', "bad.json"),
        ('{"tensors": [], "ops": [{"inputs": ["x"], "outputs": []}]}', "bad.json"),
    ],
)
def test_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, name: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    assert run(str(path), "-o", str(tmp_path / "out.csv")) == 2
    err = capsys.readouterr().err
    assert err.startswith("npumem plan: error:")
    assert not (tmp_path / "out.csv").exists()


def test_missing_file_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("/no/such/file.csv") == 2
    assert "no such file" in capsys.readouterr().err
    for argv in (["x.csv", "--capacity", "lots"], ["x.csv", "--time-limit", "-1"]):
        with pytest.raises(SystemExit) as info:
            run(*argv)
        assert info.value.code == 2


def test_parse_bytes() -> None:
    assert parse_bytes("1048576") == 1 << 20
    assert parse_bytes("1MiB") == parse_bytes("1m") == 1 << 20
    assert parse_bytes("2MB") == 2_000_000
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bytes("1.5")
