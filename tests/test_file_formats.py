"""The files npumem writes: a format and version header, valid against the published schema,
handles exact in any JSON reader, readers that refuse a wrong header in one line, and output
names whose extension the tools honour or refuse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import npumem
from npumem import schemas
from npumem.cli import main
from npumem.monitor import FileFormatError, TraceRecorder, load_snapshot, load_trace
from npumem.monitor.saved_file import load_saved_file
from npumem.plan import Problem, Solution, solve
from schema_helpers import assert_valid

MIB = 1 << 20


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("formats")
    pool = npumem.Pool(16 * MIB, cores=2, name="formats")
    with TraceRecorder(pool, stacks=True) as rec:
        held = [pool.alloc(n, tag=t) for n, t in ((100, "a"), (5000, None), (3 * MIB, "w"))]
        pool.alloc(64).free()
        snap = pool.snapshot()
        for b in held:
            b.free()
    problem = Problem.from_json(
        {
            "buffers": [
                {"id": "x", "lower": 0, "upper": 2, "size": 64},
                {"id": "y", "lower": 1, "upper": 3, "size": 32},
            ],
            "name": "tiny",
        }
    )
    plan = out / "plan.json"
    solve(problem, time_limit=1).to_json(plan)
    tier_plan = out / "tier-plan.json"
    solve(problem, pools=["sram=64", "hbm"], time_limit=1).to_json(tier_plan)
    return {
        "snapshot": snap.save(out / "snap.json"),
        "trace": rec.trace.save(out / "trace.json"),
        "plan": plan,
        "tier-plan": tier_plan,
        "dir": out,
    }


@pytest.mark.parametrize("kind", ["snapshot", "trace", "plan", "tier-plan"])
def test_every_written_file_has_a_header_and_matches_its_schema(
    written: dict[str, Path], kind: str
) -> None:
    obj = assert_valid(written[kind])
    assert obj["format"] == f"npumem-{kind}"
    assert isinstance(obj["version"], int)


@pytest.mark.parametrize("where", [0, 4_321, 9_998, 9_999])
def test_a_long_trace_is_checked_through_a_sample_that_keeps_a_bad_row(
    written: dict[str, Path], where: int
) -> None:
    # `assert_valid` checks a long list through a sample of its rows: one row of a new shape
    # (here a size written as text) anywhere in 10,000 still fails the check.
    obj = json.loads(written["trace"].read_text())
    event = obj["events"][0]
    obj["events"] = [list(event) for _ in range(10_000)]
    assert_valid(obj)
    size = obj["event_fields"].index("size")
    obj["events"][where][size] = "big"
    with pytest.raises(jsonschema.ValidationError):
        assert_valid(obj)


def test_schemas_are_listed_and_unknown_formats_refused() -> None:
    assert set(schemas.FORMATS) == {
        "npumem-snapshot",
        "npumem-trace",
        "npumem-plan",
        "npumem-tier-plan",
    }
    with pytest.raises(npumem.InvalidArgumentError, match="no schema for format 'x'"):
        schemas.load("x")


@pytest.mark.parametrize("fmt", [None, 1, b"npumem-plan", [], ["npumem-plan"], {}])
def test_a_format_name_that_is_not_text_is_a_typed_error(fmt: object) -> None:
    with pytest.raises(npumem.ArgumentTypeError, match="the format must be a str"):
        schemas.load(fmt)  # type: ignore[arg-type]


def test_handles_are_text_and_survive_a_double_based_reader(written: dict[str, Path]) -> None:
    snap = json.loads(written["snapshot"].read_text())
    trace = json.loads(written["trace"].read_text())
    handles = [row[7] for row in snap["blocks"]] + [row[6] for row in trace["events"]]
    assert handles and all(isinstance(h, str) for h in handles)
    # A reader that keeps numbers as doubles (JavaScript, jq) sees the same distinct handles.
    as_doubles = json.loads(written["trace"].read_text(), parse_int=float)
    distinct = {row[6] for row in as_doubles["events"] if row[1] == "alloc"}
    assert len(distinct) == sum(1 for row in trace["events"] if row[1] == "alloc")
    assert max(int(h) for h in handles) >= 1 << 64  # they need all 65 bits
    loaded = load_snapshot(written["snapshot"])
    assert [b.handle for b in loaded.blocks] == [int(row[7]) for row in snap["blocks"]]


def test_version_1_files_are_still_read(written: dict[str, Path], tmp_path: Path) -> None:
    snap = json.loads(written["snapshot"].read_text())
    snap["version"] = 1
    for row in snap["blocks"]:
        row[7] = int(row[7])
    old = tmp_path / "v1-snap.json"
    old.write_text(json.dumps(snap))
    assert load_snapshot(old).blocks == load_snapshot(written["snapshot"]).blocks
    trace = json.loads(written["trace"].read_text())
    trace["version"] = 1
    trace["event_fields"] = trace["event_fields"][:8]
    del trace["stacks"]
    trace["events"] = [[*row[:6], int(row[6]), row[7]] for row in trace["events"]]
    old_trace = tmp_path / "v1-trace.json"
    old_trace.write_text(json.dumps(trace))
    new = load_trace(written["trace"])
    assert [e._replace(stack=None) for e in new.events] == load_trace(old_trace).events


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"format": "npumem-trace"}, "format is 'npumem-trace', expected 'npumem-snapshot'"),
        ({"version": 99}, "npumem-snapshot version 99 is not supported"),
        ({"version": "2"}, "npumem-snapshot version '2' is not supported"),
        ({"format": None}, "format is None"),
    ],
)
def test_a_wrong_header_is_refused_in_one_line(
    written: dict[str, Path], tmp_path: Path, change: dict[str, object], text: str
) -> None:
    obj = json.loads(written["snapshot"].read_text())
    obj.update(change)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(obj))
    with pytest.raises(FileFormatError) as info:
        load_snapshot(bad)
    message = str(info.value)
    assert text in message and "\n" not in message and message.startswith(str(bad))


def test_plan_files_have_a_header_and_npumem_plot_draws_them(
    written: dict[str, Path], tmp_path: Path
) -> None:
    loaded = load_saved_file(written["plan"])
    assert isinstance(loaded, Solution)
    assert loaded.offsets and loaded.problem.name == "tiny"
    out = tmp_path / "plan.png"
    assert main(["plot", str(written["plan"]), "-o", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_plan_output_with_an_unknown_extension_is_refused(
    written: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.txt"
    assert main(["plan", str(written["plan"]), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "cannot tell the format of" in err and ".csv, .json or .h" in err
    assert not out.exists()
    assert main(["plan", str(written["plan"]), "-o", str(out), "--format", "csv", "-q"]) == 0
    assert out.read_text().startswith("id,")


@pytest.mark.parametrize(
    ("suffix", "magic"), [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")]
)
def test_plot_honours_the_extension(
    written: dict[str, Path], tmp_path: Path, suffix: str, magic: bytes
) -> None:
    out = tmp_path / f"map{suffix}"
    assert main(["plot", str(written["snapshot"]), "-o", str(out)]) == 0
    assert out.read_bytes().startswith(magic)


def test_plot_refuses_other_extensions(
    written: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "map.jpg"
    assert main(["plot", str(written["snapshot"]), "-o", str(out)]) == 2
    assert "use .png, .svg or .pdf" in capsys.readouterr().err
    assert not out.exists()


def test_python_dash_m_npumem_runs_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "npumem", "--version"], capture_output=True, text=True, check=True
    )
    assert done.stdout.startswith("npumem ")
