"""The ``npumem plan`` subcommand: output files, printed figures and exit statuses."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cli_contract import run_cli
from npumem._argtypes import byte_count as parse_bytes
from npumem.plan import Problem, Solution
from npumem.plan.cli import add_parser
from npumem.plan.networks import resnet50
from test_plan_solution import c_compiler

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


def test_the_no_reuse_figure_is_never_below_an_aligned_arena(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "p.csv"
    src.write_text("id,lower,upper,size\na,0,4,3\nb,1,2,8\nc,2,5,4\nd,0,5,5\ne,3,6,7\nf,4,6,9\n")
    out = tmp_path / "a.json"
    status, printed, _ = run_cli(["plan", str(src), "-o", str(out), "--alignment", "1024"], capsys)
    assert status == 0
    assert "arena size   3,076 bytes" in printed
    # Six buffers one after the other, each at a multiple of 1024: the last ends at 5 * 1024 + 9.
    assert "no reuse     5,129 bytes" in printed
    assert json.loads(out.read_text())["naive_size"] == 5129


def test_capacity_met_and_not_met(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = str(DATA / "input.12.csv")
    assert run(src, "-o", str(tmp_path / "a.json"), "--capacity", "12") == 0
    assert json.loads((tmp_path / "a.json").read_text())["arena_size"] <= 12
    assert run(src, "-o", str(tmp_path / "b.csv"), "--capacity", "11", "--time-limit", "1") == 1
    captured = capsys.readouterr()
    assert "does NOT fit" in captured.out
    assert "capacity 11 not met" in captured.err
    assert "b.csv not written" in captured.err
    assert not (tmp_path / "b.csv").exists()  # a command that fails writes no file


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0", "must be at least 1 byte, got '0'"),
        ("0B", "must be at least 1 byte, got '0B'"),
        ("0KiB", "must be at least 1 byte, got '0KiB'"),
        ("-1", "'-1' is not a byte count: it is negative"),
        ("1.5", "'1.5' is not a byte count: it is about 1.5 bytes, not a whole number"),
    ],
)
def test_a_capacity_below_one_byte_is_a_bad_argument(
    value: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No arena holds a buffer in 0 bytes: `--capacity 0` is refused as bad input (status 2,
    one line), not planned and reported as a capacity not met (status 1)."""
    out = tmp_path / "out.csv"
    argv = ["plan", str(DATA / "input.12.csv"), "-o", str(out), "--capacity", value]
    status, printed, err = run_cli(argv, capsys, output=out)
    assert (status, printed) == (2, "")
    assert err == f"npumem plan: error: argument --capacity: {words}\n"
    for pools in (["--pool", "sram=16"], ["--pool", "sram=16", "--pool", "hbm"]):
        status, _, err = run_cli([*argv, *pools], capsys, output=out)
        assert status == 2 and f"argument --capacity: {words}" in err


def test_capacity_not_met_leaves_an_existing_output_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep = tmp_path / "keep.json"
    keep.write_text("kept\n")
    src = str(DATA / "input.12.csv")
    assert run(src, "-o", str(keep), "--capacity", "1") == 1
    assert "not met (proven impossible)" in capsys.readouterr().err
    assert keep.read_text() == "kept\n"


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


@pytest.fixture
def pipe_path() -> Iterator[Callable[[bytes], str]]:
    """Makes paths that read some bytes once, as `<(cat file)` does in a shell: a pipe whose
    writer has closed (read again, it is empty)."""
    opened: list[int] = []

    def make(data: bytes) -> str:
        read_end, write_end = os.pipe()
        opened.append(read_end)
        os.write(write_end, data)
        os.close(write_end)
        return f"/dev/fd/{read_end}"

    yield make
    for fd in opened:
        os.close(fd)


def small_onnx_bytes(dim: str = "batch") -> bytes:
    from test_plan_onnx import small_model

    data: bytes = small_model(dim).SerializeToString()
    return data


@pytest.mark.parametrize("kind", ["csv", "problem json", "graph json", "onnx", "onnx buckets"])
def test_input_from_a_pipe_is_read_once(
    kind: str,
    pipe_path: Callable[[bytes], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    extra: list[str] = []
    if kind == "csv":
        data = (DATA / "input.12.csv").read_bytes()
    elif kind == "problem json":
        data = Problem.from_csv(DATA / "input.12.csv").to_json().encode()
    elif kind == "graph json":
        data = resnet50().to_json().encode()
    else:
        data = small_onnx_bytes()
        extra = ["--dim", "batch=2" if kind == "onnx" else "batch=1,2"]
    out = tmp_path / "out.json"
    status, printed, _ = run_cli(
        ["plan", pipe_path(data), "-o", str(out), "--time-limit", "0.5", *extra], capsys
    )
    assert status == 0
    assert "buffers" in printed or "buckets" in printed


def test_buckets_leave_no_output_behind_when_one_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "sym.onnx"
    model.write_bytes(small_onnx_bytes("N"))
    (tmp_path / "out.N8.h").mkdir()
    status, _, err = run_cli(
        ["plan", str(model), "--dim", "N=1,8,32", "-o", str(tmp_path / "out.h"), "-q"], capsys
    )
    assert status == 2
    assert "out.N8.h" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.N8.h", "sym.onnx"]
    # With the way clear, every bucket's file is written.
    (tmp_path / "out.N8.h").rmdir()
    argv = ["plan", str(model), "--dim", "N=1,8,32", "-o", str(tmp_path / "out.h"), "-q"]
    assert run_cli(argv, capsys)[0] == 0
    assert sorted(p.name for p in tmp_path.glob("out.*")) == ["out.N1.h", "out.N32.h", "out.N8.h"]


def test_an_output_that_is_a_directory_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "out.csv").mkdir()
    argv = ["plan", str(DATA / "input.12.csv"), "-o", str(tmp_path / "out.csv")]
    status, _, err = run_cli(argv, capsys)
    assert status == 2 and "out.csv" in err and "directory" in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--alignment", "0"], "--alignment"),
        (["--alignment", "48"], "--alignment"),
        (["--in-flight", "100000", "--double-buffer", "b1"], "--in-flight"),
        (["--dim", "batch=1,2", "--dim", "batch=3"], "given twice"),
        (["--dim", f"batch={10**23}"], "--dim"),
        (["--dim", "batch=0"], "'batch=0': a dimension must be a positive integer, got 0"),
        (["--dim", "batch=00"], "'batch=00': a dimension must be a positive integer, got 0"),
        (["--dim", "batch=0,1"], "'batch=0,1': a dimension must be a positive integer"),
        (["--dim", "batch=1,1"], "'batch=1,1' gives batch=1 twice"),
        (["--dim", "batch=8,1,08"], "'batch=8,1,08' gives batch=8 twice"),
    ],
)
def test_bad_option_values_are_refused(
    argv: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(small_onnx_bytes())
    src = str(DATA / "input.12.csv") if "--in-flight" in argv else str(model)
    with pytest.raises(SystemExit) as info:
        run(src, *argv, "-q")
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("npumem plan: error:") and words in last


def _model_and_csv_sources(tmp_path: Path, pipe_path: Callable[[bytes], str]) -> dict[str, str]:
    """A small ONNX model, a CSV and the same CSV through a pipe, by name."""
    model = tmp_path / "m.onnx"
    model.write_bytes(small_onnx_bytes())
    csv_path = DATA / "input.12.csv"
    return {"onnx": str(model), "csv": str(csv_path), "pipe csv": pipe_path(csv_path.read_bytes())}


@pytest.mark.parametrize(
    ("source", "argv", "words"),
    [
        (
            "csv",
            ["--in-flight", "3"],
            "--in-flight sets the inferences in flight of --double-buffer",
        ),
        ("onnx", ["--in-flight", "2"], "name the buffers to load ahead with --double-buffer"),
        ("onnx", ["--in-flight", "2", "--pool", "hbm"], "--double-buffer"),
        (
            "csv",
            ["--include-weights"],
            "input.12.csv: weights to plan (include_weights, "
            "--include-weights) are those of a graph or an ONNX model, and this is a CSV problem",
        ),
        ("pipe csv", ["--include-weights"], "this is a CSV problem"),
        ("problem json", ["--include-weights"], "p.json: weights to plan"),
        ("plan json", ["--include-weights"], "this is a plan (JSON)"),
    ],
)
def test_options_that_cannot_apply_are_refused(
    source: str,
    argv: list[str],
    words: str,
    pipe_path: Callable[[bytes], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    problem = tmp_path / "p.json"
    Problem.from_csv(DATA / "input.12.csv").to_json(problem)
    plan = tmp_path / "plan.json"
    assert run_cli(["plan", str(DATA / "input.12.csv"), "-q", "-o", str(plan)], capsys)[0] == 0
    sources = {**_model_and_csv_sources(tmp_path, pipe_path), "problem json": str(problem)}
    src = {**sources, "plan json": str(plan)}[source]
    out = tmp_path / "out.csv"
    status, _, err = run_cli(["plan", src, *argv, "-o", str(out)], capsys, output=out)
    assert status == 2 and words in err


def test_in_flight_with_double_buffer_still_plans_slots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    argv = ["plan", str(DATA / "input.12.csv"), "--double-buffer", "b1", "-o", str(out)]
    assert run_cli([*argv, "--in-flight", "3"], capsys)[0] == 0
    assert len(json.loads(out.read_text())["slots"]["b1"]) == 3
    assert run_cli(argv, capsys)[0] == 0
    assert len(json.loads(out.read_text())["slots"]["b1"]) == 2  # two in flight by default


@pytest.mark.parametrize(
    ("source", "argv", "words"),
    [
        ("onnx", ["--dim", "nosuch=3"], "'nosuch'"),
        ("onnx", ["--dim", "nosuch=3,4"], "'nosuch'"),
        ("csv", ["--dim", "batch=3"], "--dim batch"),
        ("pipe csv", ["--dim", "batch=3"], "--dim batch"),
    ],
)
def test_dimensions_that_bind_nothing_are_refused(
    source: str,
    argv: list[str],
    words: str,
    pipe_path: Callable[[bytes], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = _model_and_csv_sources(tmp_path, pipe_path)[source]
    out = tmp_path / "out.csv"
    status, _, err = run_cli(["plan", src, *argv, "-o", str(out)], capsys, output=out)
    assert status == 2 and words in err


GRAPH = {"tensors": [{"name": "x", "size": 64}], "inputs": ["x"], "outputs": ["x"], "ops": []}


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        ({"format": "npumem-graph", "version": 2, **GRAPH}, "version 2 is not supported"),
        ({"format": "npumem-graph", "version": "1", **GRAPH}, "version '1' is not supported"),
        ({"format": "npumem-graph", **GRAPH}, "version None is not supported"),
        ({"version": 1, **GRAPH}, "format is None"),
        ({"format": "npumem-plan", "version": 1, **GRAPH}, "holds 'ops'"),
        (
            {"format": "npumem-graph", "version": 1, "buffers": [], **GRAPH},
            "holds 'buffers'",
        ),
        ({"format": "npumem-trace", "version": 2, **GRAPH}, "'npumem-trace' is not a problem"),
    ],
)
def test_json_headers_must_match_their_content(
    obj: dict[str, object], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.json"
    src.write_text(json.dumps(obj))
    out = tmp_path / "out.csv"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2 and "in.json" in err and words in err


@pytest.mark.parametrize("header", [{}, {"format": "npumem-graph", "version": 1}])
def test_graphs_with_npumem_header_or_none_are_planned(
    header: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.json"
    src.write_text(json.dumps({**header, **GRAPH}))
    assert run_cli(["plan", str(src), "-q"], capsys)[0] == 0


@pytest.mark.parametrize(
    ("ops", "words"),
    [
        (
            [{"name": "a", "inputs": ["x"], "outputs": ["y"]}, {"name": "a", "outputs": []}],
            "op name 'a' is used twice",
        ),
        ([{"inputs": ["x"], "outputs": ["y"]}, {"inputs": ["x"], "outputs": ["y"]}], "written by"),
        ([{"inputs": ["y"], "outputs": ["x"]}], "graph input 'x' is also written"),
    ],
)
def test_an_error_in_a_graph_names_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ops: list[object], words: str
) -> None:
    src = tmp_path / "graph.json"
    graph = {"tensors": [{"name": "x", "size": 4}, {"name": "y", "size": 4}], "ops": ops}
    src.write_text(json.dumps({**graph, "inputs": ["x"], "outputs": ["y"]}))
    out = tmp_path / "plan.csv"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert err.startswith(f"npumem plan: error: {src}: ") and words in err


def test_an_output_that_is_no_regular_file_is_refused_and_a_link_written_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    src = str(DATA / "input.12.csv")
    assert run(src, "-q", "-o", str(fifo)) == 2
    assert capsys.readouterr().err.strip() == (
        f"npumem plan: error: cannot write {fifo}: it is a FIFO, not a regular file"
    )
    assert fifo.is_fifo()
    real = tmp_path / "real.csv"
    real.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(real.name)
    assert run(src, "-q", "-o", str(link)) == 0
    assert link.is_symlink() and Problem.from_csv(real).buffers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "plan.json", "real.csv"]


def test_an_empty_output_path_is_named_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(str(DATA / "input.12.csv"), "-q", "-o", "") == 2
    assert capsys.readouterr().err.strip() == "npumem plan: error: the output path is empty"


def test_an_output_that_links_to_a_pipe_is_refused_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `-o /dev/stdout | cat`: the link of /proc leads to a pipe, which has no path of its own.
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("no /proc/self/fd")
    read_end, write_end = os.pipe()
    try:
        out = f"/proc/self/fd/{write_end}"
        argv = ["plan", str(DATA / "input.12.csv"), "-o", out, "--format", "csv"]
        status, _, err = run_cli(argv, capsys)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert status == 2
    assert (
        err == f"npumem plan: error: cannot write {out}: it links to a FIFO, not a regular file\n"
    )


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (gzip.compress(b"id,lower,upper,size\na,0,1,4\n"), "a gzip-compressed file; decompress"),
        (b"PK\x03\x04\x14\x00\x00\x00", "a zip archive; extract the file first"),
        (b"\xfd7zXZ\x00\x00\x04", "an xz-compressed file; decompress"),
        (b"\x28\xb5\x2f\xfd\x00\x00", "a zstd-compressed file; decompress"),
        (b"BZh91AY&SY\x00", "a bzip2-compressed file; decompress"),
    ],
    ids=["gzip", "zip", "xz", "zstd", "bzip2"],
)
@pytest.mark.parametrize("name", ["in.csv", "in.json", "in.onnx", "in.csv.gz"])
def test_a_compressed_input_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, words: str, name: str
) -> None:
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / "plan.csv"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert err.startswith(f"npumem plan: error: {src}: {words}"), err


def test_a_plan_without_buffers_is_a_header_of_iso_c(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ISO C has no array of zero entries: the header keeps its macros, without a table.
    src = tmp_path / "header_only.csv"
    src.write_text("id,lower,upper,size\n")
    out = tmp_path / "empty.h"
    assert run(str(src), "-q", "-o", str(out)) == 0
    header = out.read_text()
    assert "#define EMPTY_ARENA_SIZE 0u" in header and "#define EMPTY_NUM_TENSORS 0u" in header
    assert "empty_table" not in header
    cc = c_compiler()
    if cc is None:
        return  # the text checks above are all this machine can do
    program = tmp_path / "empty.c"
    program.write_text(
        '#include "empty.h"\n'
        "int main(void) { return (int)(EMPTY_ARENA_SIZE + EMPTY_NUM_TENSORS"
        " + sizeof(empty_entry) * 0); }\n"
    )
    command = [cc, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only"]
    built = subprocess.run([*command, str(program)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            'id,lower,upper,size\n"a,0,1,4\nb,0,1,4\n',
            "line 2: not valid CSV (a quote in this row is not closed before the end of the file)",
        ),
        (
            'id,lower,upper,size\na,0,1,4\nb,0,1,"4\n',
            "line 3: not valid CSV (a quote in this row is not closed before the end of the file)",
        ),
        (
            'id,lower,upper,size\n"a"b,0,1,4\n',
            "line 2: not valid CSV (a quoted field goes on after its closing quote)",
        ),
    ],
    ids=["opened on its own line", "opened in the last field", "text after the quote"],
)
def test_a_quote_left_open_is_named_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: str
) -> None:
    src = tmp_path / "quote.csv"
    src.write_text(text)
    out = tmp_path / "plan.csv"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert err == f"npumem plan: error: {src}, {words}\n"
