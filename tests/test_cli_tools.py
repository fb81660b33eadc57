"""``npumem report``, ``npumem plot`` and ``npumem replay`` on saved files; ``--help`` on every
subcommand; bad arguments and bad files exit 2 with a message that says what is wrong."""

from __future__ import annotations

import contextlib
import json
import random
import re
from pathlib import Path

import pytest

import npumem
from cli_contract import run_cli
from monitor_helpers import assert_png
from npumem.cli import OneLineErrorParser, build_parser, main
from npumem.monitor import TraceRecorder

MIB = 1 << 20
SUBCOMMANDS = ("demo", "plan", "replay", "report", "plot")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A snapshot and a trace of a small single-core workload that sometimes runs out of
    memory."""
    out = tmp_path_factory.mktemp("files")
    pool = npumem.Pool(12 * MIB, cores=1, name="tools")
    rng = random.Random(11)
    held: list[npumem.Block] = []
    with TraceRecorder(pool) as rec:
        for _ in range(1500):
            if held and rng.random() < 0.45:
                held.pop(rng.randrange(len(held))).free()
            else:
                with contextlib.suppress(npumem.OutOfMemoryError):
                    held.append(pool.alloc(rng.choice([700, 90_000, 3 * MIB]), tag="w"))
        snap = pool.snapshot()
        for b in held:
            b.free()
    assert rec.trace.counts()["failed"] > 0
    garbage = out / "garbage.json"
    garbage.write_text("{not json")
    return {
        "snapshot": snap.save(out / "snap.json"),
        "trace": rec.trace.save(out / "trace.json"),
        "garbage": garbage,
        "missing": out / "missing.json",
        "dir": out,
    }


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert f"usage: npumem {command}" in text
    assert "Exit status" in text


def test_top_level_help_lists_the_subcommands() -> None:
    text = build_parser().format_help()
    for command in SUBCOMMANDS:
        assert command in text


def test_no_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "required" in capsys.readouterr().err


def test_report(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(files["snapshot"]), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "snapshot of pool 'tools'" in text
    assert "Largest free runs" in text and "Live blocks by tag" in text and "Per core" in text


def test_plot_snapshot_and_trace(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = files["dir"]
    assert main(["plot", str(files["snapshot"]), "-o", str(out / "s.png")]) == 0
    assert "address map" in capsys.readouterr().out
    assert_png(out / "s.png")
    assert main(["plot", str(files["trace"]), "-o", str(out / "t.png"), "--color-by", "core"]) == 0
    assert "trace over time" in capsys.readouterr().out
    assert_png(out / "t.png")


def test_replay_as_recorded_and_what_if(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(files["trace"])]) == 0
    text = capsys.readouterr().out
    assert "as recorded" in text and "allocations that would fail" in text
    assert main(["replay", str(files["trace"]), "--capacity", "64MiB"]) == 0
    assert main(["replay", str(files["trace"]), "--capacity", "4MiB"]) == 1
    captured = capsys.readouterr()
    assert "would fail with this configuration" in captured.err
    assert "would fail:" in captured.out


@pytest.fixture(scope="module")
def growth_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of a pool that grew from 64 MiB to 96 MiB (its limit 256 MiB): 96 MiB live at
    the peak."""
    pool = npumem.Pool(64 * MIB, max_capacity=256 * MIB, grow_by=32 * MIB, cores=1)
    with TraceRecorder(pool) as rec:
        blocks = [pool.alloc(8 * MIB) for _ in range(12)]
        for b in blocks:
            b.free()
    assert pool.capacity == 96 * MIB
    return rec.trace.save(tmp_path_factory.mktemp("growth") / "growth.json")


def replay_result(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    status, out, _ = run_cli(["replay", *argv, "--json"], capsys)
    return status, json.loads(out)


def test_replay_capacity_is_the_whole_arena_of_a_pool_that_grew(
    growth_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Smaller than the recorded peak: the replay does not grow, so allocations fail.
    status, r = replay_result([str(growth_trace), "--capacity", "32MiB"], capsys)
    assert status == 1
    assert r["would_fail"] == 8 and r["peak_bytes_in_use"] == 32 * MIB
    assert r["final_stats"]["capacity"] == 32 * MIB
    assert r["config"].get("max_capacity", 32 * MIB) == 32 * MIB
    # Larger than the recorded limit: taken as it is (max_capacity follows).
    status, r = replay_result([str(growth_trace), "--capacity", "1GiB"], capsys)
    assert status == 0
    assert r["final_stats"]["capacity"] == 1 << 30 and r["final_stats"]["grow_events"] == 0
    # The text report says the replay does not grow.
    status, out, _ = run_cli(["replay", str(growth_trace), "--capacity", "32MiB"], capsys)
    assert status == 1
    assert "note: the recorded pool grew to 96.0 MiB; this replay does not grow" in out
    # As recorded, it grows as it did, and nothing says it does not.
    status, out, _ = run_cli(["replay", str(growth_trace)], capsys)
    assert status == 0 and "does not grow" not in out


def test_replay_max_capacity_lets_the_arena_grow(
    growth_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(growth_trace), "--capacity", "32MiB", "--max-capacity", "128MiB"]
    status, r = replay_result(argv, capsys)
    assert status == 0 and r["would_fail"] == 0
    assert r["config"]["max_capacity"] == 128 * MIB
    assert r["final_stats"]["capacity"] == 96 * MIB  # grown 32 MiB at a time
    status, r = replay_result([str(growth_trace), "--max-capacity", "64MiB"], capsys)
    assert status == 1 and r["final_stats"]["capacity"] == 64 * MIB


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (
            ["--capacity", "64MiB", "--max-capacity", "32MiB"],
            "--max-capacity (32.0 MiB) must be at least --capacity (64.0 MiB)",
        ),
        (
            ["--max-capacity", "32MiB"],
            "--max-capacity (32.0 MiB) must be at least the recorded capacity (64.0 MiB)",
        ),
        (
            ["--max-capacity", "65MiB"],
            "--max-capacity (65.0 MiB) must be a multiple of the chunk size (2.0 MiB)",
        ),
        (
            ["--max-capacity", "96MiB", "--chunk-size", "64MiB"],
            "--max-capacity (96.0 MiB) must be a multiple of the chunk size (64.0 MiB)",
        ),
        (["--max-capacity", "lots"], "argument --max-capacity: 'lots' is not a byte count"),
        (["--max-capacity", "0"], "argument --max-capacity: must be at least 1 byte"),
    ],
)
def test_replay_bad_max_capacity_is_one_line(
    growth_trace: Path, argv: list[str], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_cli(["replay", str(growth_trace), *argv], capsys)
    assert status == 2
    assert text in err


@pytest.fixture(scope="module")
def aligned_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of a 256 MiB pool: two blocks of 1 MiB aligned to 128 MiB, a third that finds
    no room (a failed event), then the frees."""
    pool = npumem.Pool(256 * MIB, cores=1, backing="none")
    with TraceRecorder(pool) as rec:
        blocks = [pool.alloc(MIB, align=128 * MIB, tag="big") for _ in range(2)]
        with pytest.raises(npumem.OutOfMemoryError):
            pool.alloc(MIB, align=128 * MIB)
        for block in blocks:
            block.free()
    assert [(e.kind, e.aux) for e in rec.trace.events] == [
        ("alloc", 128 * MIB),
        ("alloc", 128 * MIB),
        ("failed", 128 * MIB),
        ("free", 0),
        ("free", 0),
    ]
    return rec.trace.save(tmp_path_factory.mktemp("aligned") / "aligned.json")


def test_replay_an_alignment_larger_than_its_arena_is_a_failed_allocation(
    aligned_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A smaller arena than recorded can be smaller than a recorded alignment: the request
    fails in the replay, as one with no room does; the trace is not refused."""
    status, r = replay_result([str(aligned_trace), "--capacity", "64MiB"], capsys)
    assert status == 1
    assert (r["failed"], r["would_fail"], r["rescued"], r["skipped_frees"]) == (3, 2, 0, 2)
    assert [(f["size"], f["bytes_free"]) for f in r["first_failures"]] == [(MIB, 64 * MIB)] * 3
    status, r = replay_result([str(aligned_trace)], capsys)
    assert status == 0 and (r["failed"], r["would_fail"]) == (1, 0)


def test_replay_counts_what_it_made_and_marks_recorded_failures_apart(
    aligned_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay column counts the replay's own allocations and frees, as its pool does; a
    recorded failure that fails again is not listed as one that would fail."""
    assert main(["replay", str(aligned_trace)]) == 0
    out = capsys.readouterr().out
    assert "fails again: 1.0 MiB" in out and "would fail:" not in out
    assert re.search(r"allocations\s*│\s*2\s*│\s*2\s*│", out), out
    assert main(["replay", str(aligned_trace), "--capacity", "64MiB"]) == 1
    out = capsys.readouterr().out
    assert out.count("would fail: 1.0 MiB") == 2 and out.count("fails again: 1.0 MiB") == 1
    assert re.search(r"allocations\s*│\s*0\s*│\s*2\s*│", out), out
    assert re.search(r"frees\s*│\s*0\s*│\s*2 \(0 unmatched\)\s*│", out), out
    for argv in ([str(aligned_trace)], [str(aligned_trace), "--capacity", "64MiB"]):
        _, r = replay_result(argv, capsys)
        assert (r["allocations"], r["frees"]) == (2, 2)
        final = r["final_stats"]
        assert (r["replayed_allocations"], r["replayed_frees"]) == (
            final["alloc_count"],
            final["free_count"],
        )
        assert [f["recorded_failed"] for f in r["first_failures"]][-1] is True


@pytest.mark.parametrize("kind", ["alloc", "failed"])
def test_an_alignment_larger_than_the_recorded_arena_is_refused_by_every_reader(
    kind: str, aligned_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No pool records such an event (it refuses the request as a bad argument): every
    command that reads traces refuses the file with the same line, naming the event."""
    obj = json.loads(aligned_trace.read_text())
    event = 0 if kind == "alloc" else 2
    obj["events"][event][7] = 1 << 40
    trace = tmp_path / "align.json"
    trace.write_text(json.dumps(obj))
    line = (
        f"{trace}: event {event}: alignment 1099511627776 is larger than the arena "
        f"({256 * MIB} bytes), which no pool records"
    )
    for argv in (
        ["replay", str(trace)],
        ["view", str(trace), "-o", str(tmp_path / "page.html")],
        ["export", str(trace), "-o", str(tmp_path / "out.json")],
        ["plot", str(trace), "-o", str(tmp_path / "out.png")],
    ):
        status, _, err = run_cli(argv, capsys)
        assert (status, err.strip()) == (2, f"npumem {argv[0]}: error: {line}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["align.json"]


def test_replay_on_a_huge_arena_skips_the_full_check(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Pool.check()` walks every chunk of the arena (seconds from a few TiB on): a replay
    runs it on an arena of at most `CHECK_CHUNKS` chunks, and otherwise only checks that no
    block is left, which costs nothing."""
    checked: list[int] = []
    check = npumem.Pool.check

    def counted(pool: npumem.Pool) -> int:
        checked.append(pool.capacity)
        return check(pool)

    monkeypatch.setattr(npumem.Pool, "check", counted)
    status, r = replay_result([str(files["trace"]), "--capacity", "16TiB"], capsys)
    assert status == 0 and r["would_fail"] == 0 and r["final_stats"]["capacity"] == 16 << 40
    assert checked == []
    from npumem.workloads.replay import CHECK_CHUNKS

    small = CHECK_CHUNKS * r["config"]["chunk_size"]
    status, r = replay_result([str(files["trace"]), "--capacity", str(small)], capsys)
    assert status == 0 and checked == [small]


def test_replay_help_says_capacity_does_not_grow(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "exactly this many bytes and does not grow" in text
    assert "--max-capacity BYTES" in text


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["report", "{missing}"], "no such file"),
        (["report", "{garbage}"], "not JSON"),
        (["report", "{trace}"], "is a trace, not a snapshot"),
        (["plot", "{garbage}"], "not JSON"),
        (["plot", "{snapshot}", "-o", "{dir}/no/such/dir/x.png"], "cannot write"),
        (["replay", "{snapshot}"], "is a snapshot, not a trace"),
        (["replay", "{missing}"], "no such file"),
        (["replay", "{trace}", "--chunk-size", "3MiB"], "chunk_size"),
        (["replay", "{trace}", "--min-block", "32"], "min_block"),
    ],
)
def test_bad_files_and_values_exit_2(
    files: dict[str, Path], argv: list[str], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in argv]
    assert main(args) == 2
    assert text in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["report"], "required: SNAPSHOT"),
        (["report", "{snapshot}", "--top", "0"], "must be at least 1"),
        (["plot", "{snapshot}", "--color-by", "size"], "invalid choice: 'size'"),
        (["replay"], "required: TRACE"),
        (["replay", "{trace}", "--cores", "0"], "must be at least 1"),
        (["replay", "{trace}", "--capacity", "lots"], "is not a byte count"),
        (["replay", "{trace}", "--placement", "worst-fit"], "invalid choice: 'worst-fit'"),
        (["replay", "{trace}", "--core-reserve", "-1"], "must not be negative"),
        # Integers are ASCII digits, one spelling each, and fit in 64 bits.
        (["report", "{snapshot}", "--top", "\u0665"], "'\u0665' is not an integer"),
        (["report", "{snapshot}", "--top", "1_000"], "'1_000' is not an integer"),
        (["report", "{snapshot}", "--top", "+5"], "'+5' is not an integer"),
        (["report", "{snapshot}", "--top", " 5"], "' 5' is not an integer"),
        (["report", "{snapshot}", "--top", "5\xa0"], "'5\\xa0' is not an integer"),
        (["replay", "{trace}", "--cores", "9" * 5000], "must be at most 18446744073709551615"),
        (["demo", "--requests", "9" * 5000], "must be at most 18446744073709551615"),
        (["demo", "--seed", "-" + "9" * 5000], "must not be negative, got '-999"),
        (["plan", "x.csv", "--seed", "-1"], "argument --seed: must not be negative, got -1"),
        (["plan", "x.csv", "--seed", str(2**64)], "must be at most 18446744073709551615"),
        (["plan", "x.csv", "--seed", "abc"], "argument --seed: 'abc' is not an integer"),
        (
            ["plan", "x.csv", "--in-flight", "9" * 5000],
            "is not an integer from 1 to 256 (inferences in flight)",
        ),
        (["plan", "x.csv", "--time-limit", "1" + "0" * 400], "is too large a number of seconds"),
        (["plan", "x.csv", "--time-limit", "\u0665"], "is not a number of seconds"),
        (["plan", "x.csv", "--time-limit", "1_0"], "is not a number of seconds"),
        (["plan", "x.csv", "--time-limit", "-1"], "must not be negative, got -1"),
        (["plan", "x.csv", "--dim", "N=" + "9" * 5000], "(5,000 characters) is too large"),
    ],
)
def test_bad_arguments_exit_2(
    files: dict[str, Path], argv: list[str], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in argv]
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert text in err
    assert len(err) < 400 and "_value" not in err and "set_int_max_str_digits" not in err, err


def test_a_type_that_fails_with_value_error_is_a_bad_value_not_a_function_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = OneLineErrorParser(prog="npumem x")

    def _internal_name(text: str) -> int:
        return int(text)

    parser.add_argument("--n", type=_internal_name)
    with pytest.raises(SystemExit):
        parser.parse_args(["--n", "abc"])
    assert capsys.readouterr().err == "npumem x: error: argument --n: 'abc' is not a valid value\n"


@pytest.mark.parametrize("name", ["out.txt", "noext", "out.json.gz"])
def test_export_refuses_a_name_that_is_not_json(
    files: dict[str, Path], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / name
    status, _, err = run_cli(["export", str(files["trace"]), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert f"{out}: the trace is JSON, name it .json" in err


def test_replay_of_a_bounded_recording_says_what_it_discarded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recorder that kept only its newest events: the replay counts the rest as lost."""
    pool = npumem.Pool(16 * MIB, cores=1)
    with TraceRecorder(pool, max_events=10) as rec:
        for _ in range(20):
            pool.alloc(4096).free()
    path = rec.trace.save(tmp_path / "bounded.json")
    status, obj = replay_result([str(path)], capsys)
    assert status == 0
    assert obj["recorded"]["discarded"] == 30 and obj["recorded"]["complete"] is False
    assert main(["replay", str(path)]) == 0
    text = capsys.readouterr().out
    assert "0 dropped, 30 discarded" in text and "dropped or discarded" in text
