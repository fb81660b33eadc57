"""``npumem demo``: the main job runs end to end (as a real command), writes what it says, and
its exit status tells whether the goal was met; bad arguments exit 2 with a clear message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import npumem
import npumem.workloads.demo
from cli_contract import run_cli
from monitor_helpers import assert_png
from npumem.cli import main
from npumem.monitor import Snapshot, load_snapshot, load_trace
from npumem.tiers.observe import load_tier_snapshot
from schema_helpers import assert_valid

MIB = 1 << 20
FILES = (
    "snapshot.json",
    "snapshot-end.json",
    "timeline.png",
    "address-map.png",
    "address-map-by-core.png",
    "highest-vs-end.png",
    "plan-resnet50-1.png",
    "plan-text-1-128.png",
    "trace.json",
    "trace.png",
    "tiers.json",
    "tiers.png",
)


def test_demo_quick_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "npumem.cli", "demo", "--quick", "--trace", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for figure in (
        "requests served",
        "1,000 of 1,000",
        "allocations / s",
        "peak bytes in use",
        "peak fragmentation",
        "0 (target 0)",
        "compactions",
        "check()",
        "passed",
        "Largest free runs",
        "Per core",
        "Over time (monitor)",
        # The tiers (on by default): the live run and the policies on the same accesses.
        "tiered demo:",
        "fast-tier hit rate",
        "promotions",
        "fast[0]",
        "the same accesses under each policy",
        "frequency",
        "size-only",
        f"wrote to {out.resolve()}",
    ):
        assert figure in text, figure
    for name in FILES:
        assert (out / name).is_file(), name
        assert name in text
        if name.endswith(".png"):
            assert_png(out / name)
    snap = load_snapshot(out / "snapshot.json")
    assert snap.pool == "demo" and snap.blocks, "the busiest snapshot holds blocks"
    tags = {b.tag for b in snap.blocks}
    assert {"resnet50.weights", "mobilenet_v2.weights", "text.weights"} <= tags
    # The weights left in the demo's pool (the slow tier): one block per weight tensor that is
    # not in SRAM, and one per model for the parameters outside its graph.
    end = load_snapshot(out / "snapshot-end.json")
    assert len(end.blocks) > 3 and len(end.free_runs) >= 1
    assert all(b.tag is not None and b.tag.endswith(".weights") for b in end.blocks)
    tiers = load_tier_snapshot(out / "tiers.json")
    workers = max(1, os.cpu_count() or 1)
    assert len(tiers.stats.fast) == workers and tiers.stats.accesses > 0
    assert tiers.stats.promotions > 0 and 0 < tiers.stats.hit_rate < 1
    trace = load_trace(out / "trace.json")
    assert trace.complete and trace.stats_at_stop is not None
    assert trace.counts()["alloc"] == trace.stats_at_stop.alloc_count
    assert json.loads((out / "trace.json").read_text())["format"] == "npumem-trace"
    for name in ("snapshot.json", "snapshot-end.json", "trace.json"):
        assert_valid(out / name)  # every file the demo writes matches its published schema
    # The recorded run replays on the same configuration: every allocation is replayed. Its
    # layout differs from the run's (one core pool where the run used several, no compactor's
    # moves), so an allocation the run served may fail there, growth permitting: the replay
    # then says so and exits 1, as any replay that would fail does.
    replay = subprocess.run(
        [sys.executable, "-m", "npumem.cli", "replay", str(out / "trace.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replay.returncode in (0, 1), replay.stdout + replay.stderr
    assert "allocations that would fail" in replay.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "npumem.cli", "replay", "--json", str(out / "trace.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert as_json.returncode == replay.returncode, as_json.stdout + as_json.stderr
    outcome = json.loads(as_json.stdout)
    assert outcome["allocations"] == trace.counts()["alloc"]
    assert outcome["ok"] == (replay.returncode == 0) == (outcome["would_fail"] == 0), outcome
    if replay.returncode == 1:
        assert "would fail with this configuration" in replay.stderr, replay.stderr


def test_without_matplotlib_the_demo_names_the_extra_that_draws_its_pictures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec() then finds none
    out = tmp_path / "demo"
    argv = ["demo", "--requests", "20", "--workers", "1", "--no-tiers", "--output", str(out)]
    assert main(argv) == 0
    assert "matplotlib is not installed; pip install npumem[plot])" in capsys.readouterr().out
    assert not list(out.glob("*.png"))


def test_goal_not_met_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 190 MiB: the weights take 155 MiB, so a batch-8 ResNet-50 arena (55 MiB) never fits
    # (without the tiers: one block per model, none of it in SRAM).
    argv = ["demo", "--requests", "40", "--capacity", "190MiB", "--workers", "1", "--no-tiers"]
    status = main([*argv, "-o", str(tmp_path)])
    captured = capsys.readouterr()
    assert status == 1, captured.err
    assert "goal not met" in captured.err
    assert "requests rejected" in captured.out


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["demo", "--workers", "0"], "must be at least 1, got 0"),
        (["demo", "--threads", "x"], "'x' is not an integer"),
        (["demo", "--requests", "-3"], "must be at least 1"),
        (["demo", "--capacity", "12XB"], "is not a byte count"),
        (["demo", "--capacity", "0"], "at least 1 byte"),
        (["demo", "--seed", "-1"], "must not be negative"),
        (["demo", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_arguments_exit_2(
    argv: list[str], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert text in capsys.readouterr().err


def test_bad_values_that_parse_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--capacity", "100MiB", "-o", str(tmp_path)]) == 2
    assert "too small for the models' weights" in capsys.readouterr().err
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["demo", "--quick", "-o", str(a_file)]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_the_compactor_integration_point_is_called_on_failed_allocations() -> None:
    """The compactor plugs in here; a recording stand-in shows the demo calls it when an
    allocation fails (and counts the calls), without compacting anything itself."""
    from npumem.workloads import run_demo

    class Recording:
        def __init__(self) -> None:
            self.calls = 0

        def compact(self) -> dict[str, int]:
            self.calls += 1
            return {"moved": 0}

    stand_in = Recording()
    result = run_demo(requests=30, workers=1, capacity=190 * MIB, compactor=stand_in)
    assert result.compactor
    assert stand_in.calls > 0 and result.compactions == stand_in.calls
    assert result.failed_allocations > 0, "a stand-in that moves nothing cannot prevent them"
    made: list[object] = []

    def factory(pool: object) -> Recording:
        made.append(pool)
        return Recording()

    run_demo(requests=5, workers=1, compactor=factory)
    assert len(made) == 1 and getattr(made[0], "name", None) == "demo"


def test_outputs_without_pictures(tmp_path: Path) -> None:
    from npumem.workloads import run_demo, write_outputs

    result = run_demo(requests=20, workers=1)
    files = write_outputs(result, tmp_path / "out", pictures=False)
    assert sorted(p.name for p in files.values()) == ["snapshot-end.json", "snapshot.json"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        p.name for p in files.values()
    )
    assert result.ok and result.requests_served == 20


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--workers", "5000", "--workers/--threads: must be at most 1,024, got '5000'"),
        ("--threads", "1025", "must be at most 1,024, got '1025'"),
        ("--requests", "10000000", "--requests: must be at most 1,000,000, got '10000000'"),
        (
            "--capacity",
            "18446744073709551615",
            "--capacity: must be at most 128.0 TiB, got '18446744073709551615'",
        ),
        ("--capacity", "129TiB", "--capacity: must be at most 128.0 TiB, got '129TiB'"),
    ],
)
def test_values_past_the_demos_limits_are_refused_at_once(
    option: str, value: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    status, _, err = run_cli(["demo", option, value, "-o", str(tmp_path / "out")], capsys)
    assert status == 2 and words in err
    assert time.monotonic() - started < 5
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"workers": 5000}, npumem.InvalidArgumentError, "workers must be from 1 to 1,024"),
        ({"requests": 0}, npumem.InvalidArgumentError, "requests must be from 1 to 1,000,000"),
        (
            {"capacity": 2**64 - 1},
            npumem.InvalidArgumentError,
            "got 18,446,744,073,709,551,615",
        ),
        ({"capacity": -1}, npumem.InvalidArgumentError, "capacity must be from 1 to"),
        ({"capacity": 1.5e9}, npumem.ArgumentTypeError, "capacity must be an int, got float"),
        ({"requests": "10"}, npumem.ArgumentTypeError, "requests must be an int, got str"),
        ({"workers": True}, npumem.ArgumentTypeError, "workers must be an int, got bool"),
    ],
)
def test_run_demo_refuses_values_past_its_limits(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    from npumem.workloads import run_demo

    with pytest.raises(error, match=words):
        run_demo(**kwargs)  # type: ignore[arg-type]


def test_a_refusal_leaves_no_output_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "new" / "demo"
    argv = ["demo", "--quick", "--capacity", "100MiB", "--no-tiers", "-o", str(output)]
    status, _, err = run_cli(argv, capsys)
    assert status == 2 and "too small for the models' weights" in err
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its parent made for it
    existing = tmp_path / "existing"
    existing.mkdir()
    status, _, _ = run_cli([*argv[:-1], str(existing)], capsys)
    assert status == 2 and existing.is_dir()  # a folder the user made stays


@pytest.mark.parametrize(
    "failure",
    [
        npumem.PoolBusyError("the pool stayed paused for 10002 ms"),
        npumem.OutOfMemoryError("could not map the host backing"),
    ],
)
def test_a_run_that_fails_is_not_a_usage_error(
    failure: Exception,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def failing_run(**kwargs: object) -> None:
        raise failure

    monkeypatch.setattr(npumem.workloads.demo, "run_demo", failing_run)
    output = tmp_path / "out"
    status, out, err = run_cli(["demo", "--quick", "-o", str(output)], capsys)
    assert status == 1
    assert err.strip() == f"npumem demo: failed: {failure}" and out == ""
    assert not output.exists()


def test_an_output_file_that_cannot_be_written_is_one_error_line_and_no_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "tiers.json"  # the last file written
    os.mkfifo(fifo)
    status = main(["demo", "--requests", "20", "--workers", "1", "-o", str(tmp_path)])
    out, err = capsys.readouterr()
    assert status == 2
    assert err.strip().splitlines()[-1] == (
        f"npumem demo: error: cannot write {fifo}: it is a FIFO, not a regular file"
    )
    assert out == ""  # the report is printed only once every file is written
    assert fifo.is_fifo()


def test_ctrl_c_while_the_demo_serves_stops_its_workers_at_once() -> None:
    """Ctrl-C reaches the main thread, which waits for the workers: they stop at their next
    request and the interrupt goes on, rather than the rest of the queue being served first
    (the interpreter waits for every worker before it exits)."""
    requests = 20_000
    served = 0

    def on_request() -> None:
        nonlocal served
        served += 1
        if served == 100:  # Ctrl-C as a terminal sends it, to the main thread
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        npumem.workloads.demo.run_demo(
            requests=requests, workers=2, trace=True, on_request=on_request
        )
    workers = [t.name for t in threading.enumerate() if t.name.startswith("npumem-demo-worker")]
    assert workers == []
    assert served < requests // 4


def test_ctrl_c_while_the_demo_starts_its_workers_stops_those_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ctrl-C that comes after the first worker started and before the second did waits
    until every worker started, and then stops them all before it goes on."""
    main_thread = threading.main_thread().ident or 0

    class InterruptedAfterFirstStart(threading.Thread):
        def start(self) -> None:
            super().start()
            if self.name == "npumem-demo-worker-0":
                signal.pthread_kill(main_thread, signal.SIGINT)

    monkeypatch.setattr(threading, "Thread", InterruptedAfterFirstStart)
    with pytest.raises(KeyboardInterrupt):
        npumem.workloads.demo.run_demo(requests=20_000, workers=2)
    workers = [t.name for t in threading.enumerate() if t.name.startswith("npumem-demo-worker")]
    assert workers == []


def test_ctrl_c_while_the_demo_writes_leaves_none_of_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted after its first file, the demo removes the files it made (and the folder it
    made for them) and exits as any interrupted command: one line, status 130."""
    save = Snapshot.save
    calls = 0

    def save_then_interrupt(self: Snapshot, path: str | os.PathLike[str]) -> Path:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt
        return save(self, path)

    monkeypatch.setattr(Snapshot, "save", save_then_interrupt)
    output = tmp_path / "made" / "demo"
    status = main(["demo", "--requests", "20", "--workers", "1", "--trace", "-o", str(output)])
    out, err = capsys.readouterr()
    assert calls == 2
    # (alerts the monitor logged during the run come before the last line)
    assert (status, err.strip().splitlines()[-1]) == (130, "npumem demo: interrupted")
    assert out == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("capacity", [1_000_000_000, (64 << 20) + 4096, (3 << 20) + 1])
def test_the_demo_pool_grows_by_whole_chunks_to_any_capacity(capacity: int) -> None:
    # A pool grows in whole chunks: for a capacity that is not one, the demo's pool grows to
    # the last whole chunk below it (or does not grow at all).
    pool = npumem.workloads.demo.growing_pool(capacity, weights=capacity // 8)
    assert pool.max_capacity <= capacity
    assert capacity - pool.max_capacity < pool.chunk_size
    held = []
    with pytest.raises(npumem.OutOfMemoryError):
        while True:
            held.append(pool.alloc(pool.chunk_size))
    assert pool.capacity <= capacity
    pool.check()
