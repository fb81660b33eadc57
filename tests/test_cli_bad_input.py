"""Inputs that once crashed or hung a reader: each is refused with one line on stderr and exit
status 2 (or, where it is valid, handled quickly), never a traceback or a partial output."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import npumem
from cli_contract import run_cli
from kv_helpers import SHAPE
from npumem._shown import MAX_SHOWN
from npumem.cli import OneLineErrorParser, build_parser, main
from npumem.kv import KVCache
from npumem.monitor import TraceRecorder, load_snapshot, load_trace
from npumem.monitor.errors import FileFormatError
from npumem.monitor.validate import check_config
from npumem.plan import Problem
from npumem.plan.errors import PlanError, ProblemFormatError
from npumem.tiers import TieredPool
from npumem.tiers.observe import load_tier_snapshot

MIB = 1 << 20


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """A snapshot and a trace as JSON objects, to damage."""
    pool = npumem.Pool(16 * MIB, cores=1, name="bad-input")
    with TraceRecorder(pool) as rec:
        blocks = [pool.alloc(1000, tag="x") for _ in range(4)] + [pool.alloc(300_000)]
        snap = pool.snapshot()
        for b in blocks:
            b.free()
    return {"snapshot": snap.to_json_obj(), "trace": rec.trace.to_json_obj()}


@pytest.fixture(scope="module")
def tiers_saved() -> dict[str, Any]:
    """A tier snapshot as a JSON object, to damage."""
    mem = TieredPool(
        [npumem.Pool(2 * MIB, cores=1, name=f"sram{c}") for c in range(2)],
        npumem.Pool(16 * MIB, cores=2, name="hbm"),
    )
    blocks = [mem.alloc(100_000, core=c % 2, hot=True, tag="hot") for c in range(4)]
    for tb in blocks:
        mem.touch(tb, 3)
    mem.rebalance()
    return mem.snapshot(label="tiers").to_json_obj()


def damaged(obj: dict[str, Any], mutate: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    """A deep copy of `obj` changed by `mutate`."""
    obj = json.loads(json.dumps(obj))
    mutate(obj)
    return obj


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """Set the field at a dotted `path` (list indexes as numbers) to `value`."""

    def mutate(obj: Any) -> None:
        *parents, last = path.split(".")
        for key in parents:
            obj = obj[int(key)] if isinstance(obj, list) else obj[key]
        obj[int(last) if isinstance(obj, list) else last] = value

    return mutate


def write(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj))
    return path


def test_csv_field_over_the_csv_module_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "big.csv"
    src.write_text("id,lower,upper,size\n" + "a" * 200_000 + ",0,1,64\n")
    out = tmp_path / "out.csv"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert "big.csv, line 2" in err and "field limit" in err
    with pytest.raises(PlanError, match="line 2"):
        Problem.from_csv(src)


@pytest.mark.parametrize("command", ["plan", "report", "plot", "replay"])
def test_json_nested_100000_deep(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "deep.json"
    src.write_text('{"buffers": ' + "[" * 100_000 + "]" * 100_000 + "}")
    status, _, err = run_cli([command, str(src)], capsys)
    assert status == 2
    assert "nested too deeply" in err


@pytest.mark.parametrize(
    ("column", "value"),
    [("size", 2**64 + 10), ("alignment", 2**70), ("offset", 2**64), ("size", 2**63)],
)
def test_sizes_offsets_alignments_beyond_64_bits(
    column: str, value: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = {"id": "x", "lower": 0, "upper": 1, "size": 64, "alignment": 1, "offset": ""}
    row[column] = value
    src = tmp_path / "huge.csv"
    src.write_text(",".join(row) + "\n" + ",".join(str(v) for v in row.values()) + "\n")
    out = tmp_path / "out.h"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert "bits" in err or "can address" in err


def test_many_buffers_whose_total_exceeds_64_bits(tmp_path: Path) -> None:
    rows = [f"b{i},0,1,{2**62}" for i in range(4)]
    src = tmp_path / "sum.csv"
    src.write_text("id,lower,upper,size\n" + "\n".join(rows) + "\n")
    with pytest.raises(PlanError, match="can address"):
        Problem.from_csv(src)


def test_chain_of_5000_views_is_checked_in_linear_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = 5000
    tensors = [{"name": "t0", "size": 1024}]
    tensors += [{"name": f"t{i}", "size": 1024, "view_of": f"t{i - 1}"} for i in range(1, n)]
    names = [f"t{i}" for i in range(n)]
    graph = {
        "tensors": [*tensors, {"name": "out", "size": 64}],
        "ops": [
            {"name": "make", "inputs": [], "outputs": names},
            {"name": "use", "inputs": names, "outputs": ["out"]},
        ],
    }
    src = write(tmp_path / "chain.json", graph)
    start = time.perf_counter()
    status, _, _ = run_cli(["plan", str(src), "--time-limit", "2", "-q"], capsys)
    assert status == 0
    assert time.perf_counter() - start < 20
    # The same chain closed into a cycle: refused, as quickly.
    graph["tensors"][0] = {"name": "t0", "size": 1024, "view_of": f"t{n - 1}"}
    src = write(tmp_path / "cycle.json", graph)
    start = time.perf_counter()
    status, _, err = run_cli(["plan", str(src), "--time-limit", "2"], capsys)
    assert status == 2 and "views form a cycle" in err
    assert time.perf_counter() - start < 20


def test_empty_onnx_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnx")
    src = tmp_path / "empty.onnx"
    src.write_bytes(b"")
    out = tmp_path / "out.csv"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert "empty.onnx" in err and "not an ONNX model" in err


def damaged_snapshot(obj: dict, damage: str) -> dict:
    obj = json.loads(json.dumps(obj))
    if damage == "overlap":
        obj["blocks"].append(list(obj["blocks"][0]))
    elif damage == "zero capacity":
        obj["config"]["capacity"] = 0
    elif damage == "huge offset":
        obj["blocks"][0][0] = 2**64 + 10
    elif damage == "beyond capacity":
        obj["blocks"][0][0] = obj["config"]["capacity"]
    elif damage == "infinite fragmentation":
        obj["stats"]["external_fragmentation"] = 1e999
    elif damage == "free run over a block":
        block = obj["blocks"][0]
        obj["free_runs"].append([block[0], block[2]])
    return obj


@pytest.mark.parametrize(
    "damage",
    [
        "overlap",
        "zero capacity",
        "huge offset",
        "beyond capacity",
        "infinite fragmentation",
        "free run over a block",
    ],
)
@pytest.mark.parametrize("command", ["report", "plot"])
def test_damaged_snapshots_are_refused(
    damage: str,
    command: str,
    saved: dict[str, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = tmp_path / "snap.json"
    text = json.dumps(damaged_snapshot(saved["snapshot"], damage)).replace("Infinity", "1e999")
    src.write_text(text)
    out = tmp_path / "snap.png"
    argv = [command, str(src)] + (["-o", str(out)] if command == "plot" else [])
    status, _, err = run_cli(argv, capsys, output=out)
    assert status == 2, err
    with pytest.raises(FileFormatError):
        load_snapshot(src)


def test_nan_in_a_snapshot_is_refused(saved: dict[str, dict], tmp_path: Path) -> None:
    src = tmp_path / "nan.json"
    src.write_text(
        json.dumps(saved["snapshot"], allow_nan=True).replace('"time_ns":', '"x": NaN, "time_ns":')
    )
    with pytest.raises(FileFormatError, match="NaN"):
        load_snapshot(src)


@pytest.mark.parametrize(
    ("index", "value", "message"),
    [(3, 2**70, "64 bits"), (2, 2**64, "64 bits"), (7, 3, "power of two"), (3, 0, "0 bytes")],
)
@pytest.mark.parametrize("command", ["replay", "plot"])
def test_damaged_trace_events_are_refused(
    index: int,
    value: int,
    message: str,
    command: str,
    saved: dict[str, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    obj = json.loads(json.dumps(saved["trace"]))
    obj["events"][0][index] = value
    src = write(tmp_path / "trace.json", obj)
    out = tmp_path / "trace.png"
    argv = [command, str(src)] + (["-o", str(out)] if command == "plot" else [])
    status, _, err = run_cli(argv, capsys, output=out)
    assert status == 2
    assert message in err


def test_replay_on_a_smaller_arena_reports_requests_larger_than_it(
    saved: dict[str, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path / "trace.json", saved["trace"])
    status, out, _ = run_cli(["replay", str(src), "--capacity", "256KiB"], capsys)
    assert status == 1
    assert "would fail:" in out and "300,000 bytes" in out


# ----- text from files is printed as it is, never read as Rich markup ---------------------------

BRACKETS = ["[/]", "w[/x]", "[bold]x[/bold]", "[red]"]


@pytest.mark.parametrize("text", BRACKETS)
def test_report_prints_names_tags_and_labels_with_brackets_as_they_are(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = npumem.Pool(8 * MIB, cores=1, name=text)
    cache = KVCache(pool, page_tokens=4, capacity_tokens=16, tag=text, **SHAPE)
    cache.add_sequence(0, num_tokens=3)
    block = pool.alloc(1000, tag=text)
    src = pool.snapshot().with_kv(cache).with_label(text).save(tmp_path / "s.json")
    status, out, _ = run_cli(["report", str(src)], capsys)
    assert status == 0
    assert f"snapshot of pool {text!r}" in out
    assert f"pool {text!r} (snapshot {text})" in out
    assert f"KV cache {text!r}" in out
    assert f"│ {text} " in out  # the tag's row
    block.free()


@pytest.mark.parametrize("text", BRACKETS)
def test_tier_report_prints_policy_and_label_with_brackets_as_they_are(
    text: str, tiers_saved: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def brackets(o: dict[str, Any]) -> None:
        o["label"] = o["stats"]["policy"] = text

    src = write(tmp_path / "tiers.json", damaged(tiers_saved, brackets))
    status, out, _ = run_cli(["report", str(src)], capsys)
    assert status == 0
    assert f"tier snapshot {text!r} ({text}):" in out


def test_replay_prints_a_path_with_brackets_as_it_is(
    saved: dict[str, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "a[" / "b]"
    folder.mkdir(parents=True)
    src = write(folder / "t.json", saved["trace"])
    status, out, _ = run_cli(["replay", str(src)], capsys)
    assert status == 0
    assert f"npumem replay of {src}" in out


# ----- handles -------------------------------------------------------------------------------


NOT_DECIMAL = "event 0: handle must be decimal text of at most 29 digits without leading zeros"


@pytest.mark.parametrize(
    ("handle", "message"),
    [
        ("9" * 5000, NOT_DECIMAL),
        ("1" + "0" * 40, NOT_DECIMAL),
        ("007", NOT_DECIMAL),
        ("", NOT_DECIMAL),
        ("1e5", NOT_DECIMAL),
        ("-1", NOT_DECIMAL),
        (12, NOT_DECIMAL),
        (str(2**96), f"event 0: handle {2**96} does not fit in 96 bits"),
    ],
)
@pytest.mark.parametrize("command", ["replay", "view", "export", "plot"])
def test_handles_beyond_96_bits_or_not_canonical_are_refused(
    handle: object,
    message: str,
    command: str,
    saved: dict[str, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = write(tmp_path / "t.json", damaged(saved["trace"], _set("events.0.6", handle)))
    out = (
        tmp_path
        / {"replay": "t.out", "view": "t.html", "export": "t.pf.json", "plot": "t.png"}[command]
    )
    argv = [command, str(src)] + ([] if command == "replay" else ["-o", str(out)])
    status, _, err = run_cli(argv, capsys, output=out)
    assert status == 2
    assert message in err
    with pytest.raises(FileFormatError, match=re.escape(message)):
        load_trace(src)


@pytest.mark.parametrize("handle", [2**96, 10**40])
def test_version_1_handles_beyond_96_bits_are_refused(
    handle: int, saved: dict[str, dict], tmp_path: Path
) -> None:
    def version_1(o: dict[str, Any]) -> None:
        o["version"] = 1
        o["event_fields"] = o["event_fields"][:8]
        o["events"] = [[*e[:6], int(e[6]), e[7]] for e in o["events"]]
        o["events"][0][6] = handle
        del o["stacks"]

    src = write(tmp_path / "t.json", damaged(saved["trace"], version_1))
    with pytest.raises(FileFormatError, match="does not fit in 96 bits"):
        load_trace(src)


def test_the_largest_handle_is_read(saved: dict[str, dict], tmp_path: Path) -> None:
    largest = str(2**96 - 1)
    obj = damaged(saved["trace"], _set("events.0.6", largest))
    src = write(tmp_path / "t.json", damaged(obj, _set("events.5.6", largest)))
    assert load_trace(src).events[0].handle == 2**96 - 1


# ----- a handle allocated twice ------------------------------------------------------------


def test_a_handle_allocated_twice_without_a_free_is_refused(
    saved: dict[str, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = saved["trace"]
    allocs = [i for i, e in enumerate(obj["events"]) if e[1] == "alloc"]
    first, second = allocs[0], allocs[1]
    src = write(
        tmp_path / "t.json", damaged(obj, _set(f"events.{second}.6", obj["events"][first][6]))
    )
    status, _, err = run_cli(["replay", str(src)], capsys)
    assert status == 2
    handle = obj["events"][first][6]
    message = (
        f"event {second}: handle {handle} is allocated again without a free since event {first}"
    )
    assert message in err
    with pytest.raises(FileFormatError, match=re.escape(message)):
        load_trace(src)


# ----- KV pages in snapshots -----------------------------------------------------------------


@pytest.fixture(scope="module")
def kv_saved() -> dict[str, Any]:
    """A snapshot with the pages of a KV cache, as a JSON object."""
    pool = npumem.Pool(8 * MIB, cores=1, name="kv")
    cache = KVCache(pool, page_tokens=4, capacity_tokens=16, tag="kv", **SHAPE)
    cache.add_sequence(0, num_tokens=3)
    return pool.snapshot().with_kv(cache).to_json_obj()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("waste_bytes", None, "kv 0 stats.waste_bytes must be an integer"),
        ("waste_bytes", "12", "kv 0 stats.waste_bytes must be an integer"),
        ("waste_bytes", [1], "kv 0 stats.waste_bytes must be an integer"),
        ("tokens", -1, "kv 0 stats.tokens must be an integer"),
        ("copies", 1.5, "kv 0 stats.copies must be an integer"),
        ("bytes_copied", 2**64, "kv 0 stats.bytes_copied must be an integer"),
        ("sequences", True, "kv 0 stats.sequences must be an integer"),
        ("preallocated", 1, "kv 0 stats.preallocated must be true or false"),
        ("waste_share", "x", "kv 0 stats.waste_share must be a finite number"),
        ("waste_share", -0.5, "kv 0 stats.waste_share must be a finite number"),
    ],
)
def test_damaged_kv_stats_are_refused(
    key: str,
    value: object,
    message: str,
    kv_saved: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = write(
        tmp_path / "kv.json", damaged(kv_saved, lambda o: o["kv"][0]["stats"].update({key: value}))
    )
    status, _, err = run_cli(["report", str(src)], capsys)
    assert status == 2
    assert message in err
    with pytest.raises(FileFormatError, match=re.escape(message)):
        load_snapshot(src)


# ----- tier snapshots ------------------------------------------------------------------------


TIER_DAMAGE: list[tuple[Callable[[dict[str, Any]], object], str]] = [
    (_set("stats.slow.tier", 7), "stats.slow: field 'tier' must be str, got int"),
    (_set("stats.slow.tier", "fast"), "stats.slow: must be the figures of tier slow"),
    (_set("stats.fast.0.tier", "warm"), "stats.fast[0]: must be the figures of tier fast[0]"),
    (_set("stats.fast.1.core", 0), "stats.fast[1]: must be the figures of tier fast[1]"),
    (_set("stats.fast.0.core", True), "stats.fast[0]: must be the figures of tier fast[0]"),
    (_set("stats.fast.0.core", 0.0), "stats.fast[0]: must be the figures of tier fast[0]"),
    (lambda o: o["stats"]["slow"].pop("core"), "stats.slow: must be the figures of tier slow"),
    (_set("stats.fast.0.hits", 1e300), "stats.fast[0]: field 'hits' must be int, got float"),
    (_set("stats.fast.0.bytes_in_use", -5), "stats.fast[0]: bytes_in_use must be an integer"),
    (_set("stats.fast.0.capacity", 1.5), "stats.fast[0]: field 'capacity' must be int"),
    (_set("stats.fast.0.blocks", 10**30), "stats.fast[0]: blocks must be an integer between"),
    (_set("stats.slow.spills", None), "stats.slow: field 'spills' must be int, got NoneType"),
    (_set("stats.slow.bytes_in_use", 2**40), "stats.slow: bytes_in_use (1099511627776) is more"),
    (_set("stats.fast.0", 3), "stats.fast[0]: must be an object, got int"),
    (_set("stats.accesses", True), "stats: field 'accesses' must be int, got bool"),
    (_set("stats.accesses", 0), "hits add up to 12, more than stats.accesses (0)"),
    (_set("stats.bytes_accessed", "x"), "stats: bytes_accessed must be an integer"),
    (_set("stats.policy", ["x"]), "stats: field 'policy' must be str, got list"),
    (_set("stats.fast", {}), "stats: field 'fast' must be list, got dict"),
    (_set("stats.slow", []), "stats: field 'slow' must be dict, got list"),
    (_set("stats", None), "field 'stats' must be dict, got NoneType"),
    (_set("version", True), "version True is not supported"),
    (_set("label", 5), "field 'label' must be str, got int"),
    (lambda o: o["tiers"].pop("slow"), "tiers must hold one snapshot per tier"),
    (_set("tiers.slow", []), "tier slow: expected a JSON object of format 'npumem-snapshot'"),
    (_set("tiers.slow.blocks", 5), "tier slow: field 'blocks' must be list, got int"),
]


@pytest.mark.parametrize(("mutate", "message"), TIER_DAMAGE)
@pytest.mark.parametrize("command", ["report", "plot"])
def test_damaged_tier_snapshots_are_refused(
    mutate: Callable[[dict[str, Any]], object],
    message: str,
    command: str,
    tiers_saved: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = write(tmp_path / "tiers.json", damaged(tiers_saved, mutate))
    out = tmp_path / "tiers.png"
    argv = [command, str(src)] + (["-o", str(out)] if command == "plot" else [])
    status, _, err = run_cli(argv, capsys, output=out)
    assert status == 2
    assert str(src) in err and message in err
    with pytest.raises(FileFormatError, match=re.escape(message)):
        load_tier_snapshot(src)


def test_tier_snapshot_as_written_is_read(
    tiers_saved: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path / "tiers.json", tiers_saved)
    assert load_tier_snapshot(src).to_json_obj() == tiers_saved
    status, out, _ = run_cli(["report", str(src)], capsys)
    assert status == 0 and "tier snapshot 'tiers'" in out


@pytest.mark.parametrize(
    ("suffix", "magic"), [(".svg", b"<?xml"), (".pdf", b"%PDF"), (".PNG", b"\x89PNG")]
)
def test_tier_pictures_take_the_format_of_their_extension(
    suffix: str,
    magic: bytes,
    tiers_saved: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = write(tmp_path / "tiers.json", tiers_saved)
    out = tmp_path / f"tiers{suffix}"
    status, _, _ = run_cli(["plot", str(src), "-o", str(out)], capsys)
    assert status == 0
    assert out.read_bytes().startswith(magic)


@pytest.mark.parametrize("name", ["tiers.txt", "tiers.jpg", "tiers"])
def test_tier_pictures_refuse_other_extensions(
    name: str, tiers_saved: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path / "tiers.json", tiers_saved)
    out = tmp_path / name
    status, _, err = run_cli(["plot", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert "use .png, .svg or .pdf" in err


# ----- inputs read once, so a pipe works -----------------------------------------------------


@contextlib.contextmanager
def piped(data: bytes) -> Iterator[str]:
    """A path that reads `data` from a pipe (it can be read once), e.g. `/dev/fd/5`."""
    r, w = os.pipe()

    def feed() -> None:
        try:
            os.write(w, data)
        except BrokenPipeError:
            pass
        finally:
            os.close(w)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        yield f"/dev/fd/{r}"
    finally:
        os.close(r)
        writer.join()


@pytest.mark.parametrize("kind", ["snapshot", "tiers"])
@pytest.mark.parametrize("command", ["report", "plot"])
def test_a_file_through_a_pipe_is_read_once(
    kind: str,
    command: str,
    saved: dict[str, dict],
    tiers_saved: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    obj = tiers_saved if kind == "tiers" else saved["snapshot"]
    out = tmp_path / "p.png"
    with piped(json.dumps(obj).encode()) as src:
        argv = [command, src] + (["-o", str(out)] if command == "plot" else [])
        status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    assert command == "report" or out.stat().st_size > 1000


def test_export_writes_through_a_symbolic_link(
    saved: dict[str, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write(tmp_path / "t.json", saved["trace"])
    target = tmp_path / "target.json"
    target.write_text("x\n")
    link = tmp_path / "link.json"
    link.symlink_to("target.json")
    status, _, err = run_cli(["export", str(trace), "-o", str(link)], capsys)
    assert status == 0, err
    assert link.is_symlink()
    assert json.loads(target.read_text())["traceEvents"]


@pytest.mark.parametrize("kind", ["fifo", "device"])
@pytest.mark.parametrize("command", ["export", "plot"])
def test_an_output_that_is_not_a_regular_file_is_refused(
    saved: dict[str, dict],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    command: str,
) -> None:
    """A FIFO or a device node as the output is refused, not replaced by a regular file (a
    device is a regular file that `os.stat` reports as a character device: a test must not
    touch a real one)."""
    src = write(tmp_path / "t.json", saved["trace"])
    out = tmp_path / ("out.png" if command == "plot" else "out.json")
    if kind == "fifo":
        os.mkfifo(out)
    else:
        out.write_text("stands for /dev/full\n")
        real_stat = os.stat

        def device_stat(p: object, *args: object, **kwargs: object) -> os.stat_result:
            st = real_stat(p, *args, **kwargs)  # type: ignore[arg-type]
            if os.fspath(p) == str(out):  # type: ignore[arg-type]
                return os.stat_result((stat.S_IFCHR | 0o666, *tuple(st)[1:]))
            return st

        monkeypatch.setattr(os, "stat", device_stat)
    before = os.lstat(out)
    status, _, err = run_cli([command, str(src), "-o", str(out)], capsys)
    monkeypatch.undo()
    assert status == 2
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert f"cannot write {out}: it is {what}, not a regular file" in err
    after = os.lstat(out)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, "t.json"])


# Arguments argparse refuses, for every subcommand: a missing required argument, an unknown
# option, a bad value for a typed option (and a missing option value where there is no
# required argument).
ARGUMENT_REFUSALS = [
    ([], "npumem: error: the following arguments are required: COMMAND"),
    (["bogus"], "npumem: error: argument COMMAND: invalid choice: 'bogus'"),
    (["demo", "--seed"], "npumem demo: error: argument --seed: expected one argument"),
    (["demo", "--bogus"], "npumem demo: error: unrecognized arguments: --bogus"),
    (["demo", "--requests", "x"], "npumem demo: error: argument --requests: 'x' is not an"),
    (["replay"], "npumem replay: error: the following arguments are required: TRACE"),
    (
        ["replay", "t.json", "--bogus", "1"],
        "npumem replay: error: unrecognized arguments: --bogus 1",
    ),
    (["replay", "t.json", "--cores", "0"], "npumem replay: error: argument --cores: must be at"),
    (["replay", "t.json", "--placement", "worst"], "npumem replay: error: argument --placement"),
    (["plan"], "npumem plan: error: the following arguments are required: INPUT"),
    (["plan", "x.csv", "--bogus"], "npumem plan: error: unrecognized arguments: --bogus"),
    (["plan", "x.csv", "--capacity", "-5"], "npumem plan: error: argument --capacity: '-5' is"),
    (["plan", "x.csv", "--capacity", "0"], "npumem plan: error: argument --capacity: must be at"),
    (["plan", "x.csv", "--time-limit", "x"], "npumem plan: error: argument --time-limit"),
    (["report"], "npumem report: error: the following arguments are required: SNAPSHOT"),
    (["report", "s.json", "--bogus"], "npumem report: error: unrecognized arguments: --bogus"),
    (["report", "s.json", "--top", "0"], "npumem report: error: argument --top: must be at"),
    (["plot"], "npumem plot: error: the following arguments are required: SNAPSHOT|TRACE|PLAN"),
    (["plot", "s.json", "--bogus"], "npumem plot: error: unrecognized arguments: --bogus"),
    (["plot", "s.json", "--color-by", "size"], "npumem plot: error: argument --color-by"),
    (["view"], "npumem view: error: the following arguments are required: TRACE|SNAPSHOT"),
    (["view", "s.json", "--bogus"], "npumem view: error: unrecognized arguments: --bogus"),
    (["view", "s.json", "-o"], "npumem view: error: argument -o/--output: expected one"),
    (["export"], "npumem export: error: the following arguments are required: TRACE"),
    (["export", "t.json", "--bogus"], "npumem export: error: unrecognized arguments: --bogus"),
    (["export", "t.json", "--format", "csv"], "npumem export: error: argument --format"),
]


@pytest.mark.parametrize(
    ("argv", "line"), ARGUMENT_REFUSALS, ids=[" ".join(a) or "none" for a, _ in ARGUMENT_REFUSALS]
)
def test_a_bad_argument_is_one_line(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_cli(argv, capsys)  # one line on stderr, nothing on stdout
    assert status == 2
    assert err.startswith(line), err


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "s.json", "x" * 200_000],
        ["plot", "s.json", "--color-by", "y" * 200_000],
        ["y" * 200_000],
    ],
    ids=["unrecognized", "invalid choice", "command"],
)
def test_argparse_refusals_cut_a_long_value_short(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_cli(argv, capsys)
    assert status == 2
    assert len(err) < 400 and "(200,0" in err, err[:400]


def test_every_subcommand_refuses_in_one_line() -> None:
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"demo", "replay", "plan", "report", "plot", "view", "export"} <= set(commands)
    assert all(isinstance(p, OneLineErrorParser) for p in [parser, *commands.values()])
    tested = {argv[0] for argv, _ in ARGUMENT_REFUSALS if argv and argv[0] in commands}
    assert tested == set(commands)


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["plan", "-h"]])
def test_help_still_prints_the_full_usage(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: npumem") and "options:" in out


# ----- values out of range or of the wrong type, anywhere a reader looks ----------------------

OUTPUT_NAMES = {
    "replay": None,
    "report": None,
    "plot": "o.png",
    "view": "o.html",
    "export": "o.json",
}


def run_reader(
    command: str, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, str]:
    """`npumem COMMAND SRC` (with `-o` for the commands that write a file)."""
    name = OUTPUT_NAMES[command]
    out = tmp_path / name if name else None
    argv = [command, str(src), *extra] + (["-o", str(out)] if out else [])
    return run_cli(argv, capsys, output=out)


TRACE_DAMAGE: list[tuple[Callable[[dict[str, Any]], object], str]] = [
    (_set("stats_at_stop.external_fragmentation", -1), "must be between 0 and 1, got -1"),
    (_set("stats_at_stop.external_fragmentation", 2.0), "must be between 0 and 1, got 2.0"),
    (_set("stats_at_stop.external_fragmentation", 2**70), "must be between 0 and 1"),
    (_set("stats_at_stop.external_fragmentation", True), "must be between 0 and 1, got True"),
    (lambda o: o["stats_at_stop"].pop("capacity"), "stats: missing field 'capacity'"),
    (_set("dropped", 2**70), "dropped = 1180591620717411303424 does not fit in 64 bits"),
    (_set("events.0.4", 2**70), "event 0: core 1180591620717411303424 is not one of the 1 cores"),
    (_set("events.0.4", 1), "event 0: core 1 is not one of the 1 cores"),
    (_set("version", 2.0), "npumem-trace version 2.0 is not supported"),
    (_set("config.backing", "bogus"), "config.backing must be one of ('host', 'none')"),
    (_set("config.backing", 5), "config.backing must be one of ('host', 'none'), got 5"),
    (_set("config.core_reserve", 1.5), "config.core_reserve must be an integer >= 0, got 1.5"),
    (_set("config.chunk_size", 3), "config.chunk_size must be a power of two, got 3"),
    (_set("config.chunk_size", 1), "config.min_block must be at least 64"),
    (_set("config.capacity", 2**49), "config.capacity must be at most 281474976710656"),
    (_set("config.cores", 1025), "config.cores must be at most 1024"),
    (_set("config.run_tails", "yes"), "config.run_tails must be true or false"),
    (_set("config.placement", None), "config.placement must be one of"),
    (_set("config.slab_sizes", [64, 32]), "config.slab_sizes 1 must be an integer above"),
    (_set("config.max_capacity", 1), "config.max_capacity must be an integer >= 16777216"),
    # 2**31 chunks of 128 KiB in twice max_capacity: a pool refuses it, and so does every reader.
    (
        lambda o: o["config"].update(
            chunk_size=2**17, min_block=256, capacity=2**47, max_capacity=2**47
        ),
        "config.chunk_size must be at least 262144 here, got 131072: 281474976710656 bytes "
        "(twice max_capacity) make 2147483648 chunks, and an arena has at most 1073741824",
    ),
]


def assert_refused(
    command: str,
    src: Path,
    message: str,
    load: Callable[[Path], object],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`command` refuses the damaged file `src` with `message` and status 2, and so does the
    Python reader `load`."""
    status, _, err = run_reader(command, src, tmp_path, capsys)
    assert status == 2
    assert message in err
    with pytest.raises(FileFormatError, match=re.escape(message)):
        load(src)


@pytest.mark.parametrize(("mutate", "message"), TRACE_DAMAGE)
@pytest.mark.parametrize("command", ["replay", "plot", "view", "export"])
def test_trace_values_out_of_range_are_refused_by_every_command(
    mutate: Callable[[dict[str, Any]], object],
    message: str,
    command: str,
    saved: dict[str, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = write(tmp_path / "t.json", damaged(saved["trace"], mutate))
    assert_refused(command, src, message, load_trace, tmp_path, capsys)


def test_the_trace_written_is_read_by_every_command(
    saved: dict[str, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path / "t.json", saved["trace"])
    for command in ("replay", "plot", "view", "export"):
        status, _, err = run_reader(command, src, tmp_path, capsys)
        assert status == 0, err


SNAPSHOT_DAMAGE: list[tuple[Callable[[dict[str, Any]], object], str]] = [
    (_set("time_ns", 2**70), "time_ns = 1180591620717411303424 does not fit in 64 bits"),
    (_set("blocks.0.6", 2**70), "block 0: pins = 1180591620717411303424 does not fit in 64"),
    (_set("blocks.0.4", 3), "block 0: core 3 is not one of the 1 cores"),
    (_set("blocks.0.7", str(2**96)), "handle 79228162514264337593543950336 does not fit in 96"),
    (_set("regions", [[0, 2**70]]), "region 0: length = 1180591620717411303424 does not fit"),
    (_set("regions", [[0, 0]]), "region 0 [0, 0) must be non-empty"),
    (_set("regions", [[0, 2 * MIB], [MIB, MIB]]), "region 1 [1048576, 2097152) must be"),
    (_set("regions", [[0, 32 * MIB]]), "end within the offsets (at most 16777216)"),
    (_set("regions", 5), "field 'regions' must be list, got int"),
    (_set("config.chunk_size", 3), "config.chunk_size must be a power of two, got 3"),
    (_set("config.min_block", 32), "config.min_block must be at least 64"),
    (_set("config.alignment", 2**70), "config.alignment must be at most 18446744073709551615"),
    (_set("config.core_reserve", 2**70), "config.core_reserve must be at most 1024"),
    (_set("stats.external_fragmentation", 1.5), "must be between 0 and 1, got 1.5"),
    (_set("version", 2.0), "npumem-snapshot version 2.0 is not supported"),
    (
        lambda o: o["config"].update(chunk_size=2**17, min_block=256, capacity=2**48),
        "config.chunk_size must be at least 262144 here, got 131072: 281474976710656 bytes "
        "(capacity) make 2147483648 chunks, and an arena has at most 1073741824",
    ),
]


@pytest.mark.parametrize(("mutate", "message"), SNAPSHOT_DAMAGE)
@pytest.mark.parametrize("command", ["report", "plot", "view"])
def test_snapshot_values_out_of_range_are_refused_by_every_command(
    mutate: Callable[[dict[str, Any]], object],
    message: str,
    command: str,
    saved: dict[str, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = write(tmp_path / "s.json", damaged(saved["snapshot"], mutate))
    assert_refused(command, src, message, load_snapshot, tmp_path, capsys)


def test_a_handle_within_96_bits_is_a_handle(
    saved: dict[str, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """26 digits fit in 96 bits (29 digits do not always): the format takes it."""
    handle = "99999999999999999999999999"
    src = write(tmp_path / "s.json", damaged(saved["snapshot"], _set("blocks.0.7", handle)))
    assert load_snapshot(src).blocks[0].handle == int(handle)
    status, _, err = run_reader("plot", src, tmp_path, capsys)
    assert status == 0, err


@pytest.mark.parametrize(
    "mutate",
    [lambda o: o.pop("regions", None), _set("regions", [])],
    ids=["no regions", "empty regions"],
)
@pytest.mark.parametrize("command", ["report", "plot", "view"])
def test_a_snapshot_without_regions_has_one_region_the_arena(
    mutate: Callable[[dict[str, Any]], object],
    command: str,
    saved: dict[str, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = write(tmp_path / "s.json", damaged(saved["snapshot"], mutate))
    assert load_snapshot(src).regions == ()
    status, _, err = run_reader(command, src, tmp_path, capsys)
    assert status == 0, err


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_set("kv.0.page_bytes", 2**70), "kv 0 page_bytes must be between 1 and the capacity"),
        (_set("kv.0.page_bytes", 0), "kv 0 page_bytes must be between 1 and the capacity"),
        (_set("kv.0.pages.0.0", 2**40), "kv 0 page 0 [1099511627776, "),
        (_set("kv.0.pages.0.1", 2**70), "kv 0 page 0: references = 1180591620717411303424"),
    ],
)
@pytest.mark.parametrize("color_by", ["tag", "core"])
def test_kv_pages_outside_the_arena_are_refused(
    mutate: Callable[[dict[str, Any]], object],
    message: str,
    color_by: str,
    kv_saved: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = write(tmp_path / "kv.json", damaged(kv_saved, mutate))
    start = time.perf_counter()
    status, _, err = run_reader("plot", src, tmp_path, capsys, "--color-by", color_by)
    assert status == 2 and message in err
    assert time.perf_counter() - start < 10
    with pytest.raises(FileFormatError, match=re.escape(message)):
        load_snapshot(src)


def test_numbers_too_large_for_a_double_are_refused_before_any_writer(
    saved: dict[str, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`1e400` reads as infinity in Python: the reader refuses it, so no writer (export,
    replay --json) meets a number it cannot write."""
    text = json.dumps(damaged(saved["trace"], _set("config.core_reserve", 12345)))
    src = tmp_path / "t.json"
    src.write_text(text.replace("12345", "1e400"))
    status, _, err = run_reader("export", src, tmp_path, capsys)
    assert status == 2 and "the number 1e400 is out of range" in err
    obj = damaged(saved["trace"], _set("stats_at_stop.external_fragmentation", 0.125))
    src.write_text(json.dumps(obj).replace("0.125", "-1e400"))
    status, _, err = run_cli(["replay", "--json", str(src)], capsys)
    assert status == 2 and "the number -1e400 is out of range" in err


@pytest.mark.parametrize("field", ["pool", "label"])
def test_plot_draws_a_name_of_a_million_characters_quickly(
    field: str, saved: dict[str, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kind = "trace" if field == "pool" else "snapshot"
    src = write(tmp_path / "long.json", damaged(saved[kind], _set(field, "x" * 10**6)))
    start = time.perf_counter()
    status, _, err = run_reader("plot", src, tmp_path, capsys)
    assert status == 0, err
    assert time.perf_counter() - start < 20


def test_a_long_tag_is_shortened_in_the_legend(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from npumem.monitor.plots import MAX_TEXT_LINE, plot_address_map, shorten

    assert shorten("a" * 500) == "a" * (MAX_TEXT_LINE - 1) + "\u2026"
    assert shorten("ab\n" + "c" * 500).startswith("ab\nccc")
    from npumem.monitor.snapshot import Snapshot

    pool = npumem.Pool(8 * MIB, cores=1, name="p")
    block = pool.alloc(1000, tag="t")
    # A pool takes no tag this long (npumem.MAX_TAG_BYTES), but a snapshot file may carry one.
    obj = pool.snapshot().to_json_obj()
    tag_at = obj["block_fields"].index("tag")
    obj["blocks"][0][tag_at] = "t" * 200_000
    snap = Snapshot.from_json_obj(obj)
    start = time.perf_counter()
    out = plot_address_map(snap, tmp_path / "m.svg")
    assert time.perf_counter() - start < 20
    assert "t" * MAX_TEXT_LINE not in out.read_text()
    block.free()


# ----- files too large to read, and running out of memory ----------------------------------


@pytest.mark.parametrize("command", ["report", "plot", "replay", "plan"])
def test_a_file_over_the_size_limit_is_refused(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from npumem import fileio

    monkeypatch.setattr(fileio, "MAX_INPUT_BYTES", 1000)
    src = tmp_path / "big.json"
    src.write_text("{" + " " * 2000 + "}")
    status, _, err = run_cli([command, str(src)], capsys)
    assert status == 2
    assert "cannot read the file (larger than the limit of 1,000 bytes)" in err


@pytest.mark.parametrize("command", ["report", "plan"])
def test_an_endless_stream_is_read_up_to_the_limit(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from npumem import fileio

    monkeypatch.setattr(fileio, "MAX_INPUT_BYTES", 3 << 20)
    status, _, err = run_cli([command, "/dev/zero"], capsys)
    assert status == 2
    assert "/dev/zero: cannot read the file (larger than the limit of 3,145,728 bytes)" in err


def test_running_out_of_memory_while_parsing_is_one_line(
    saved: dict[str, dict],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from npumem import fileio

    def no_memory(*args: object, **kwargs: object) -> object:
        raise MemoryError

    src = write(tmp_path / "t.json", saved["trace"])
    monkeypatch.setattr(fileio.json, "loads", no_memory)
    status, _, err = run_cli(["report", str(src)], capsys)
    assert status == 2
    assert "not readable JSON (out of memory while parsing it)" in err


# ----- output paths ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "plot", "view", "export"])
def test_an_output_under_a_file_is_one_line(
    command: str, saved: dict[str, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The clean-up after a failed write fails too there (the parent is not a folder): it is
    quiet, and the command says why the write failed."""
    blocker = tmp_path / "file"
    blocker.write_text("x\n")
    if command == "plan":
        src = tmp_path / "in.csv"
        src.write_text("id,lower,upper,size\na,0,2,64\n")
        out = blocker / "x.json"
    else:
        src = write(tmp_path / "t.json", saved["trace"])
        out = blocker / {"plot": "x.png", "view": "x.html", "export": "x.json"}[command]
    status, _, err = run_cli(
        [command, str(src), "-o", str(out), "-q"][: 4 + (command == "plan")], capsys
    )
    assert status == 2
    assert f"cannot write {out}" in err
    assert blocker.read_text() == "x\n"


@pytest.mark.parametrize("command", ["plot", "view", "export"])
def test_an_empty_output_path_is_refused(
    command: str,
    saved: dict[str, dict],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = write(tmp_path / "t.json", saved["trace"])
    monkeypatch.chdir(tmp_path)
    status, _, err = run_cli([command, str(src), "-o", ""], capsys)
    assert status == 2
    assert f"npumem {command}: error: the output path is empty" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_demo_refuses_an_empty_output_folder(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(["demo", "--output", ""], capsys)
    assert status == 2
    assert "npumem demo: error: the output folder is empty" in err


def test_plan_refuses_an_empty_input_path(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(["plan", ""], capsys)
    assert status == 2
    assert err.strip() == "npumem plan: error: a file path is empty"


# Text that no file name can hold, as only a program calling main() can pass it (a shell's
# arguments hold no NUL, and bytes that are not UTF-8 come as surrogates that encode back).
# The path as shown may be cut short ('...a\x00.... (85 characters)') where it is long.
_NO_FILE_NAME = {
    "NUL": ("a\x00.json", r"'.* contains a NUL character, which no file name can"),
    "surrogate": (
        "\ud800.json",
        r"'.* is not a file name: it contains a lone surrogate \('\\ud800' at",
    ),
}


def _argv_writing(command: str, src: Path, out: str) -> list[str]:
    """`command` reading `src` and writing `out` (the demo: its folder)."""
    if command == "plan":
        return ["plan", str(src), "-q", "--time-limit", "0.1", "-o", out]
    if command == "demo":
        return ["demo", "--requests", "5", "--workers", "1", "--no-tiers", "-o", out]
    return [command, str(src), "-o", out]


@pytest.mark.parametrize("text", list(_NO_FILE_NAME))
@pytest.mark.parametrize("command", ["plan", "plot", "view", "export", "demo"])
def test_an_output_path_no_file_name_can_hold_is_a_bad_argument(
    command: str,
    text: str,
    saved: dict[str, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if command == "plan":
        src = tmp_path / "in.csv"
        src.write_text("id,lower,upper,size\na,0,2,64\n")
    else:
        src = write(tmp_path / "t.json", saved["trace" if command != "plot" else "snapshot"])
    name, message = _NO_FILE_NAME[text]
    out = str(tmp_path / name)
    status, out_text, err = run_cli(_argv_writing(command, src, out), capsys)
    option = "--output/-o" if command == "demo" else "-o/--output"
    assert status == 2 and out_text == ""
    assert re.fullmatch(f"npumem {command}: error: argument {option}: {message}.*\n", err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == [src.name]


@pytest.mark.parametrize("text", list(_NO_FILE_NAME))
@pytest.mark.parametrize("command", ["plan", "plot", "view", "export", "report", "replay"])
def test_an_input_path_no_file_name_can_hold_is_a_bad_argument(
    command: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name, message = _NO_FILE_NAME[text]
    status, out_text, err = run_cli([command, name], capsys)
    assert status == 2 and out_text == ""
    assert re.fullmatch(f"npumem {command}: error: argument [A-Z|]+: {message}.*\n", err), err


def test_a_name_that_is_not_utf8_is_still_a_file_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes that are not UTF-8 reach Python as surrogates that `os.fsencode` writes back: a
    file name, not refused."""
    src = tmp_path / "in.csv"
    src.write_text("id,lower,upper,size\na,0,2,64\n")
    out = tmp_path / os.fsdecode(b"\xff.json")
    status, _, err = run_cli(
        ["plan", str(src), "-q", "--time-limit", "0.1", "-o", str(out)], capsys
    )
    assert (status, err) == (0, "")
    assert sorted(os.listdir(os.fsencode(tmp_path))) == [b"in.csv", b"\xff.json"]


def test_every_plain_text_argument_is_a_file_path() -> None:
    """The parser refuses text no file name can hold in every argument taken as plain text
    (no type, no choices): each of them must be a file path."""
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a.choices, dict)]
    plain = {
        (name, action.dest)
        for name, sub in commands.choices.items()
        for action in sub._actions
        if action.type is None
        and action.choices is None
        and action.nargs != 0
        and not isinstance(action.default, bool)
    }
    assert plain == {
        ("demo", "output"),
        ("replay", "trace"),
        ("plan", "input"),
        ("plan", "output"),
        ("report", "snapshot"),
        ("plot", "input"),
        ("plot", "output"),
        ("view", "input"),
        ("view", "output"),
        ("export", "trace"),
        ("export", "output"),
    }


def test_demo_checks_every_output_before_writing_any(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out"
    (folder / "trace.json").mkdir(parents=True)
    argv = [
        "demo",
        "--requests",
        "10",
        "--workers",
        "1",
        "--no-tiers",
        "--trace",
        "-o",
        str(folder),
    ]
    status, _, err = run_cli(argv, capsys)
    assert status == 2
    assert f"cannot write {folder / 'trace.json'}: it is a directory" in err
    assert [p.name for p in folder.iterdir()] == ["trace.json"]


@pytest.mark.parametrize("command", ["demo", "replay", "plan"])
@pytest.mark.parametrize("form", [["--capacity", "-1MiB"], ["--capacity=-1MiB"]])
def test_a_negative_size_reaches_the_size_parser(
    command: str, form: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command] + ([] if command == "demo" else ["in.json"]) + form
    status, _, err = run_cli(argv, capsys)
    assert status == 2
    assert f"npumem {command}: error: argument --capacity: '-1MiB' is not a byte count" in err
    assert "negative" in err


# ----- plan files ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    problem = Problem.from_json(
        {"buffers": [{"id": "x", "lower": 0, "upper": 2, "size": 64}], "name": "tiny"}
    )
    from npumem.plan import solve

    return solve(problem, time_limit=1).to_json_obj()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.pop("arena_size"), "missing field 'arena_size'"),
        (lambda o: o.pop("gap"), "missing field 'gap'"),
        (lambda o: o.pop("lower_bound"), "missing field 'lower_bound'"),
        (_set("arena_size", "64"), "arena_size must be an integer between 0 and"),
        (_set("lower_bound", 2**64), "lower_bound must be an integer between 0 and"),
        (_set("gap", "0"), "gap must be a finite number >= 0, got '0'"),
        (_set("gap", -0.5), "gap must be a finite number >= 0, got -0.5"),
        (_set("status", "done"), "status must be one of"),
        (_set("capacity", -1), "capacity must be null or an integer"),
        (_set("greedy", []), "greedy must be an object"),
        (_set("buffers.0.id", ""), "buffers[0] (id ''): the id is empty"),
    ],
)
@pytest.mark.parametrize("command", ["plot", "plan"])
def test_plan_files_with_missing_or_wrong_figures_are_refused(
    mutate: Callable[[dict[str, Any]], object],
    message: str,
    command: str,
    plan_saved: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = write(tmp_path / "plan.json", damaged(plan_saved, mutate))
    out = tmp_path / ("o.png" if command == "plot" else "o.csv")
    status, _, err = run_cli([command, str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert f"npumem {command}: error: {src}: {message}" in err
    assert err.count(str(src)) == 1  # the file is named once


LONE_SURROGATE = "a\\ud800b"  # JSON text for a string that no UTF-8 output can hold


def one_buffer_problem(path: Path, buffer_id: str = "a", more: str = "") -> Path:
    """A problem file at `path` of one buffer of 64 bytes, its id `buffer_id` (JSON text) and
    `more` fields (JSON text after a comma)."""
    fields = f'"id": "{buffer_id}", "lower": 0, "upper": 2, "size": 64' + (
        f", {more}" if more else ""
    )
    path.write_text('{"buffers": [{' + fields + "}]}")
    return path


@pytest.mark.parametrize(
    ("kind", "command", "suffix"),
    [
        ("snapshot", "report", None),
        ("snapshot", "view", ".html"),
        ("snapshot", "plot", ".png"),
        ("trace", "export", ".json"),
        ("trace", "replay", None),
    ],
)
def test_a_lone_surrogate_escape_is_refused_by_the_reader(
    saved: dict[str, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    command: str,
    suffix: str | None,
) -> None:
    # The pool's name, and a tag, carry the escape: it decodes to a lone surrogate.
    obj = json.loads(json.dumps(saved[kind]))
    obj["pool"] = "POOLNAME"
    src = tmp_path / f"{kind}.json"
    src.write_text(json.dumps(obj).replace("POOLNAME", LONE_SURROGATE))
    out = None if suffix is None else tmp_path / f"out{suffix}"
    argv = [command, str(src)] + ([] if out is None else ["-o", str(out)])
    status, _, err = run_cli(argv, capsys, output=out)
    assert status == 2
    assert "lone UTF-16 surrogate" in err and "\\ud800" in err


def test_a_lone_surrogate_escape_in_a_plan_input_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = one_buffer_problem(tmp_path / "problem.json", LONE_SURROGATE)
    out = tmp_path / "plan.csv"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2 and "lone UTF-16 surrogate" in err
    # A pair of escapes is one character, and is read.
    one_buffer_problem(src, "a\\ud83d\\ude00")
    status, _, err = run_cli(["plan", str(src), "-o", str(out), "-q"], capsys)
    assert status == 0, err
    assert "a\U0001f600" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize("weight", ["1" + "0" * 400, "1" + "0" * 309])
def test_a_weight_no_float_can_hold_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], weight: str
) -> None:
    src = one_buffer_problem(tmp_path / "problem.json", more=f'"weight": {weight}')
    out = tmp_path / "plan.json"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert "weight must be a number a float can hold" in err and len(err) < 300, err


@pytest.mark.parametrize(
    ("kind", "command"),
    [("snapshot", "plot"), ("snapshot", "view"), ("trace", "export"), ("problem", "plan")],
)
def test_an_output_path_that_is_the_input_is_refused(
    saved: dict[str, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    command: str,
) -> None:
    suffix = {"plot": ".png", "view": ".html", "export": ".json", "plan": ".json"}[command]
    src = tmp_path / f"input{suffix}"
    if kind == "problem":
        one_buffer_problem(src)
    else:
        src.write_text(json.dumps(saved[kind]))
    before = src.read_bytes()
    # Named as it is, and through a symbolic link to it.
    link = tmp_path / f"link{suffix}"
    link.symlink_to(src)
    for output in (src, link):
        status, _, err = run_cli([command, str(src), "-o", str(output)], capsys)
        assert status == 2
        assert "is the input file" in err, err
        assert src.read_bytes() == before, "the input was replaced"


def test_a_pool_capacity_not_met_is_said_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = one_buffer_problem(tmp_path / "problem.json")
    out = tmp_path / "plan.csv"
    argv = ["plan", str(src), "--pool", "sram=1", "--pool", "hbm=1", "-o", str(out)]
    status, _, err = run_cli(argv, capsys)
    assert status == 1
    assert err.strip() == (
        "npumem plan: capacity not met: pool hbm's arena is 64 bytes, over its 1; "
        f"{out} not written"
    )
    assert not out.exists()


def test_an_error_message_over_several_lines_is_printed_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As ONNX's shape inference words a bad operator: a list of signatures, a line each.
    from npumem.plan import cli as plan_cli

    def fails(*_: object, **__: object) -> None:
        raise PlanError(
            "m.onnx: ONNX shape inference failed (incompatible arguments:\n 1. f(a)\n 2. f(b))"
        )

    monkeypatch.setattr(plan_cli, "read_input", fails)
    src = tmp_path / "m.onnx"
    src.write_bytes(b"x")
    out = tmp_path / "plan.csv"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert err.strip() == (
        "npumem plan: error: m.onnx: ONNX shape inference failed "
        "(incompatible arguments: 1. f(a) 2. f(b))"
    )


@pytest.mark.parametrize("where", [0, 20, -2])
def test_a_nul_byte_in_a_text_input_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: int
) -> None:
    # A CSV reader keeps a NUL inside a field (an id "\x000"), and the plan wrote it back out.
    text = "id,lower,upper,size\n0,0,2,64\n1,1,3,128\n"
    at = where % len(text)
    src = tmp_path / "problem.csv"
    src.write_bytes((text[:at] + "\x00" + text[at:]).encode())
    out = tmp_path / "plan.csv"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert f"not a text file (a NUL byte at character {at})" in err, err


def test_the_readers_chunk_limit_is_the_pools(saved: dict[str, dict]) -> None:
    """A configuration of more chunks than an arena may span: the pool's own check (which
    `replay` meets) and the readers' give the same message."""
    config = dict(saved["trace"]["config"], chunk_size=2**17, min_block=256)
    config.update(capacity=2**47, max_capacity=2**47)
    with pytest.raises(npumem.ConfigError) as info:
        npumem.Pool(
            config["capacity"],
            cores=1,
            chunk_size=config["chunk_size"],
            min_block=config["min_block"],
            max_capacity=config["max_capacity"],
            backing="none",
        )
    with pytest.raises(FileFormatError) as read:
        check_config(config, "t.json")
    assert str(read.value).split("chunk_size ", 1)[1] in str(info.value)


LONG = 1_000_000


@pytest.mark.parametrize(
    ("kind", "mutate", "command", "words"),
    [
        ("snapshot", _set("format", "x" * LONG), "report", "(1,000,000 characters)"),
        ("snapshot", _set("format", "x" * LONG), "plot", "(1,000,000 characters)"),
        ("trace", _set("format", "x" * LONG), "replay", "(1,000,000 characters)"),
        ("trace", _set("format", "x" * LONG), "export", "(1,000,000 characters)"),
        ("snapshot", _set("blocks.0", list(range(LONG))), "report", "(a list of 1,000,000 values)"),
        ("trace", _set("events.0", ["x" * LONG]), "replay", "(1,000,000 characters)]"),
        ("trace", _set("version", int("9" * 4000)), "view", "(4,000 digits) is not supported"),
        ("snapshot", _set("config.placement", "y" * LONG), "view", "(1,000,000 characters)"),
    ],
)
def test_a_long_value_is_shown_cut_short(
    kind: str,
    mutate: Callable[[dict[str, Any]], object],
    command: str,
    words: str,
    saved: dict[str, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A message quotes at most `MAX_SHOWN` characters of a value from the file, then its
    length: never a line of megabytes."""
    src = write(tmp_path / "in.json", damaged(saved[kind], mutate))
    status, _, err = run_reader(command, src, tmp_path, capsys)
    assert status == 2
    assert words in err
    assert len(err) < 2 * MAX_SHOWN + 300, err


@pytest.mark.parametrize("column", ["lower", "upper", "size", "alignment", "offset"])
def test_a_csv_number_of_thousands_of_digits_is_a_format_error(
    column: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = {"lower": "0", "upper": "3", "size": "100", "alignment": "1", "offset": "0"}
    values[column] = "9" * 5000
    src = tmp_path / "digits.csv"
    src.write_text(",".join(["id", *values]) + "\n" + ",".join(["a", *values.values()]) + "\n")
    words = f"digits.csv, line 2, column {column}: a number of 5,000 digits is too long"
    with pytest.raises(ProblemFormatError, match=re.escape(words)):
        Problem.from_csv(src)
    with pytest.raises(ProblemFormatError, match=re.escape(words.replace("digits.csv", "<csv>"))):
        Problem.from_csv(io.StringIO(src.read_text()))
    out = tmp_path / "plan.json"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2 and words in err


def test_a_csv_with_lone_carriage_returns_is_refused_in_words_of_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "cr.csv"
    src.write_bytes(b"id,lower,upper,size\ra,0,3,100\r")
    out = tmp_path / "plan.json"
    status, _, err = run_cli(["plan", str(src), "-o", str(out)], capsys, output=out)
    assert status == 2
    assert "a line ends in a lone carriage return (CR); end lines with LF or CRLF" in err
    assert "universal-newline" not in err


@pytest.mark.parametrize("fail_on", ["write", "flush"])
@pytest.mark.parametrize(
    ("argv", "prog"),
    [(["--help"], "npumem"), (["--version"], "npumem"), (["plan", "--help"], "npumem plan")],
)
def test_help_to_a_stdout_that_fails_names_its_command(
    argv: list[str],
    prog: str,
    fail_on: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Full(io.StringIO):
        def write(self, text: str) -> int:
            if fail_on == "write":
                raise OSError(28, "No space left on device")
            return super().write(text)

        def flush(self) -> None:
            if fail_on == "flush":
                raise OSError(28, "No space left on device")

    monkeypatch.setattr("sys.stdout", Full())
    try:
        status = main(argv)
    except SystemExit as exc:  # the text lost without a word
        status = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status == 1, err
    assert err == f"{prog}: error: cannot write to stdout: No space left on device\n"
