"""What a person reads: error messages in human units that name the cause, report tables whose
titles match their rows, figures that agree, JSON output for programs, Prometheus names that
follow the naming guide, and pictures with one colour per tag, complete legends and titles
that say what they show."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import npumem
from npumem._shown import MAX_SHOWN, shown
from npumem.cli import main
from npumem.compaction import Compactor
from npumem.compaction.policy import Policy
from npumem.errors import NpumemError
from npumem.monitor import (
    PrometheusCollector,
    TraceRecorder,
    plot_address_map,
    plot_before_after,
    plot_plan,
    plot_timeline,
    plot_trace,
    report_text,
)
from npumem.monitor.colors import TAG_PALETTE, tag_color
from npumem.monitor.plots import chunk_owners, moved_blocks
from npumem.monitor.prometheus import COUNTERS, GAUGES
from npumem.plan import Problem, solve
from npumem.sizes import parse_bytes

MIB = 1 << 20


# ----- error messages ----------------------------------------------------------------------------


def test_out_of_memory_from_fragmentation_says_so_and_suggests_the_compactor() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, core_reserve=0)
    blocks = [pool.alloc(MIB) for _ in range(8)]
    for b in blocks[::2]:
        b.free()
    with pytest.raises(npumem.OutOfMemoryError) as info:
        pool.alloc(2 * MIB)
    text = str(info.value)
    assert "asked for 2.0 MiB (2097152 bytes)" in text
    assert "4.0 MiB (4194304 bytes) are free" in text and "fragmented" in text
    assert "Compactor" in text
    assert info.value.requested == 2 * MIB  # the numbers stay available as attributes
    with pytest.raises(npumem.OutOfMemoryError) as info:
        pool.alloc(5 * MIB)
    text = str(info.value)
    assert "more than the 4.0 MiB" in text and "fragmented" not in text


def test_request_too_large_is_in_human_units() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    with pytest.raises(npumem.RequestTooLargeError, match=r"9\.0 MiB .* capacity is 8\.0 MiB"):
        pool.alloc(9 * MIB)


def test_a_request_beyond_the_usable_bytes_is_too_large() -> None:
    # The arena ends in 100 bytes, less than its smallest block: those can never hold one.
    pool = npumem.Pool(3 * MIB + 100, cores=1, backing="none")
    usable = pool.stats().usable_capacity
    assert usable < 3 * MIB + 100
    asked: list[int] = []
    pool.set_oom_handler(lambda nbytes: asked.append(nbytes))
    with pytest.raises(npumem.RequestTooLargeError, match=f"blocks can use {usable}"):
        pool.alloc(usable + 1)
    assert asked == [], "no handler runs for a request that can never succeed"
    pool.alloc(usable).free()


def test_an_unbound_onnx_dimension_names_the_command_line_option() -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from npumem.plan import GraphError
    from npumem.plan.onnx_import import graph_from_onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]))
    assert onnx.checker.check_model(model) is None
    with pytest.raises(GraphError) as info:
        graph_from_onnx(model)
    text = str(info.value)
    assert "--dim N=1" in text and "N x 16" in text and "['N'" not in text


# ----- the report --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A two-core pool with slabs, runs, many tags and a fragmented arena; a compaction."""
    out = tmp_path_factory.mktemp("user")
    pool = npumem.Pool(64 * MIB, cores=2, name="busy")
    held: list[npumem.Block] = []
    lock = threading.Lock()

    def work(cpu: int) -> None:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, {cpu % (os.cpu_count() or 1)})
        for i in range(80):
            b = pool.alloc(1000 + (i % 7) * 60_000, tag=f"tag{i % 12}")
            with lock:
                held.append(b)

    threads = [threading.Thread(target=work, args=(c,)) for c in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held.append(pool.alloc(5 * MIB, tag="weights"))
    with TraceRecorder(pool) as rec:
        held += [pool.alloc(70_000, tag="late") for _ in range(40)]
        for b in held[::3]:
            b.free()
        before = pool.snapshot().with_label("before")
        Compactor(pool).compact("full")
        after = pool.snapshot().with_label("after")
    return {
        "pool": pool,
        "before": before,
        "after": after,
        "trace": rec.trace,
        "dir": out,
        "snapshot": before.save(out / "before.json"),
        "trace_file": rec.trace.save(out / "t.json"),
    }


def test_report_titles_count_the_rows_they_show(busy: dict[str, object]) -> None:
    snap = busy["before"]
    text = report_text(snapshot=snap, top=3)  # type: ignore[arg-type]
    runs = len(snap.free_runs)  # type: ignore[attr-defined]
    assert runs > 3
    assert f"Largest free runs (3 of {runs} runs," in text
    assert re.search(r"Live blocks by tag \([0-9,]+ blocks, top 3 of 14 tags\)", text)
    table = text.split("Largest free runs")[1].split("Live blocks")[0]
    assert len(re.findall(r"^│ +\d+ │", table, re.M)) == 3


def test_report_figures_agree(busy: dict[str, object]) -> None:
    snap = busy["before"]
    text = report_text(snapshot=snap)  # type: ignore[arg-type]
    s = snap.stats  # type: ignore[attr-defined]
    # The slab line splits the snapshot's slab space as the stats count it.
    assert "cached in slabs" in text and "slab space without live objects" in text
    # The largest free block is given exactly, and the free runs table says why it may differ.
    assert f"{s.largest_free_block:,} B, one allocation" in text
    assert "one allocation may get less" in text
    # Per-core counts say what they leave out.
    if s.slab_allocs:
        assert f"the {s.slab_allocs:,} slab allocations are not split" in text


def test_report_and_replay_json(
    busy: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(busy["snapshot"]), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["format"] == "npumem-report" and obj["version"] == 1
    assert obj["stats"]["bytes_in_use"] == busy["before"].stats.bytes_in_use  # type: ignore[attr-defined]
    assert sum(t["blocks"] for t in obj["by_tag"]) == len(busy["before"].blocks)  # type: ignore[attr-defined]
    assert main(["replay", str(busy["trace_file"]), "--json"]) in (0, 1)
    out = capsys.readouterr().out
    obj = json.loads(out)
    assert obj["format"] == "npumem-replay" and obj["events"] > 0
    assert isinstance(obj["first_failures"], list)


def test_docstrings_and_help_have_no_rest_markup_or_issue_numbers() -> None:
    from npumem.cli import build_parser

    texts = [build_parser().format_help()]
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    texts += [p.format_help() for p in sub.values()]
    for text in texts:
        assert "``" not in text and ":class:" not in text and not re.search(r"issue \d", text)


# ----- Prometheus --------------------------------------------------------------------------------


def test_prometheus_names_end_in_their_unit_and_capacity_is_exported() -> None:
    for metric, field, _ in GAUGES:
        assert metric.endswith(("_bytes", "_ratio")) or field == "blocks_in_use", metric
        assert "bytes_" not in metric.removeprefix("npumem_")  # the unit comes last
    for metric, _, _ in COUNTERS:
        assert metric.endswith("_total")
    pool = npumem.Pool(8 * MIB, cores=1, name="cap")
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(pool))
    text = generate_latest(registry).decode()
    assert 'npumem_capacity_bytes{pool="cap"} 8.388608e+06' in text
    assert 'npumem_in_use_bytes{pool="cap"} 0.0' in text


# ----- pictures ----------------------------------------------------------------------------------


def test_a_tag_has_one_colour_everywhere() -> None:
    assert tag_color("weights") == tag_color("weights") in TAG_PALETTE
    demo_tags = [
        "resnet50.weights",
        "mobilenet_v2.weights",
        "text.weights",
        "text.kv-cache",
        "resnet50.activations",
        "request",
        "kernel-args",
        "text.prefill",
        "text.decode",
        "text.logits",
        "resnet50.output",
        "mobilenet_v2.output",
        "mobilenet_v2.activations",
    ]
    assert len({tag_color(t) for t in demo_tags}) == len(demo_tags)


def _svg_text(path: Path) -> str:
    text = path.read_text()
    assert text.lstrip().startswith("<?xml")
    return text


def test_address_map_legend_names_every_tag(busy: dict[str, object]) -> None:
    snap = busy["before"]
    out = plot_address_map(snap, busy["dir"] / "map.svg")  # type: ignore[arg-type, operator]
    svg = _svg_text(out)
    for tag in {b.tag for b in snap.blocks}:  # type: ignore[attr-defined]
        assert f">{tag}<" in svg, tag
        assert tag_color(tag).lower() in svg.lower()
    assert ">free<" in svg and "by tag" in svg


def test_address_map_by_core_shows_the_owner_of_every_chunk(busy: dict[str, object]) -> None:
    snap = busy["before"]
    owners = chunk_owners(snap)  # type: ignore[arg-type]
    assert "global" in owners.values()
    out = plot_address_map(snap, busy["dir"] / "cores.svg", color_by="core")  # type: ignore[arg-type, operator]
    svg = _svg_text(out)
    assert "with the owner of every chunk" in svg and "global run" in svg
    for core in {o for o in owners.values() if isinstance(o, int)}:
        assert f">core {core}<" in svg and f"free in a chunk of core {core}" in svg


def test_compaction_picture_marks_what_moved(busy: dict[str, object]) -> None:
    before, after = busy["before"], busy["after"]
    moves = moved_blocks(before, after)  # type: ignore[arg-type]
    assert moves and all(old.offset != new.offset for old, new in moves)
    out = plot_before_after(
        before,  # type: ignore[arg-type]
        after,  # type: ignore[arg-type]
        busy["dir"] / "compaction.svg",  # type: ignore[operator]
        titles=("before compaction", "after compaction"),
    )
    svg = _svg_text(out)
    assert f"{len(moves):,} blocks moved" in svg
    assert ">moved here<" in svg and ">moved away from<" in svg
    assert ">before compaction<" in svg and ">after compaction<" in svg


def test_trace_and_timeline_legends_name_every_line(
    busy: dict[str, object], tmp_path: Path
) -> None:
    svg = _svg_text(plot_trace(busy["trace"], tmp_path / "t.svg"))  # type: ignore[arg-type]
    for label in (
        "bytes live (asked for)",
        "capacity",
        "live blocks (right axis)",
        "compaction (blocks moved)",
        "allocations per second",
    ):
        assert f">{label}<" in svg, label
    from npumem.monitor import Monitor

    pool = npumem.Pool(4 * MIB, cores=1)
    mon = Monitor(pool)
    mon.sample()
    with contextlib.suppress(npumem.OutOfMemoryError):
        pool.alloc(3 * MIB), pool.alloc(3 * MIB)
    mon.sample()
    svg = _svg_text(plot_timeline(mon.history, tmp_path / "time.svg"))
    for label in (
        "bytes in use",
        "peak",
        "usable capacity",
        "failed allocations",
        "external fragmentation",
    ):
        assert f">{label}<" in svg, label


def test_plan_picture_title_names_what_was_planned(tmp_path: Path) -> None:
    problem = Problem.from_json({"name": "bert_base", "buffers": [
        {"id": "a", "lower": 0, "upper": 2, "size": 100}]})  # fmt: skip
    solution = solve(problem, time_limit=1)
    svg = _svg_text(plot_plan(solution, tmp_path / "p.svg", name="text, batch 1, sequence 128"))
    assert "text, batch 1, sequence 128: 1 buffers" in svg and "bert_base" not in svg
    assert "lower bound" in svg and ">arena<" in svg


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("abc", "'abc'"),
        (12, "12"),
        ([1, (2,), {"a": None}], "[1, (2,), {'a': None}]"),
        ("x" * 1000, "'" + "x" * 80 + "'... (1,000 characters)"),
        (10**100, "1" + "0" * 79 + "... (101 digits)"),
        (-(10**5000), "-1" + "0" * 79 + "... (5,001 digits)"),
        (list(range(10**6)), "(a list of 1,000,000 values)"),
        (["y" * 10**6], "'... (1,000,000 characters)]"),
    ],
    ids=["str", "int", "nested", "long str", "long int", "huge int", "long list", "long item"],
)
def test_a_quoted_value_is_its_repr_or_cut_short(value: object, expected: str) -> None:
    """`shown()`: what every message quotes of a value it refuses, never longer than a line."""
    text = shown(value)
    assert text == expected or text.endswith(expected), text
    assert len(text) < 2 * MAX_SHOWN


LONG = "v" * 100_000


def _plot_coloured_by_long_value() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    plot_address_map(pool.snapshot(), "never-written.png", color_by=LONG)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "refuse",
    [
        lambda: parse_bytes(LONG),
        lambda: Policy(mode=LONG),
        lambda: npumem.plan.run_rule(npumem.plan.Problem([]), LONG),
        _plot_coloured_by_long_value,
    ],
    ids=["parse_bytes", "compaction policy", "greedy rule", "plot color_by"],
)
def test_api_refusals_cut_a_long_value_short(refuse: Callable[[], object]) -> None:
    with pytest.raises(NpumemError) as info:
        refuse()
    text = str(info.value)
    assert len(text) < 400 and "(100,000 characters)" in text, text[:400]
