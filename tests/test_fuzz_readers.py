"""Fuzzing the file readers and the ``npumem`` commands that read files.

Valid seed files (a MiniMalloc CSV, a problem JSON, a graph JSON, an ONNX model, a snapshot and
a trace of a real pool) are mutated byte by byte and field by field, and CSV and JSON files are
also generated from scratch. Each file goes to its reader and to every command that reads it
(``plan``, ``report``, ``plot``, ``replay``): the reader returns or raises its own error type,
and the command succeeds or exits 2 with one line on stderr, nothing on stdout and no output
file (see ``cli_contract.py``); never a traceback, never a hang (an alarm fails the example).

Examples per test follow the hypothesis profile (``dev`` locally, ``ci`` under ``CI=1``);
the slow commands (``plot`` draws a picture, ``plan`` searches) run a fraction of them.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npumem
from cli_contract import run_cli
from kv_helpers import SHAPE
from npumem.kv import KVCache
from npumem.monitor import TraceRecorder
from npumem.monitor.errors import MonitorError
from npumem.monitor.saved_file import load_saved_file
from npumem.plan import Problem
from npumem.plan.errors import PlanError
from npumem.plan.graph import Graph
from npumem.tiers import TieredPool
from npumem.tiers.observe import load_tier_snapshot

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

MIB = 1 << 20
DATA = Path(__file__).parent / "data" / "minimalloc"
SECONDS_PER_RUN = 30
"""A command that takes longer on a small file is taken to hang."""
REPLAY_CAPACITY_LIMIT = 256 * MIB
"""Mutated traces whose arena is larger are only loaded, not replayed (a replay makes a pool of
that size)."""


def examples(fraction: float) -> Any:
    """Settings with ``fraction`` of the profile's examples (at least 5)."""
    return settings(
        settings.default,
        max_examples=max(5, int(settings.default.max_examples * fraction)),
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """Fail (rather than hang) when the body runs longer than ``seconds``."""

    def expired(signum: int, frame: object) -> None:
        raise AssertionError(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------------------
# Seed files


def graph_seed() -> dict[str, Any]:
    return {
        "format": "npumem-graph",
        "version": 1,
        "name": "tiny",
        "tensors": [
            {"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32"},
            {"name": "w", "size": 1728, "weight": True},
            {"name": "y", "size": 4096},
            {"name": "y2", "size": 4096, "view_of": "y"},
            {"name": "z", "size": 2048, "alignment": 64},
        ],
        "inputs": ["x"],
        "outputs": ["z"],
        "ops": [
            {"name": "conv", "inputs": ["x", "w"], "outputs": ["y"]},
            {"name": "relu", "inputs": ["y"], "outputs": ["y2"], "inplace": {"y2": "y"}},
            {"name": "pool", "inputs": ["y2"], "outputs": ["z"]},
        ],
    }


def onnx_seed() -> bytes | None:
    try:
        import numpy as np
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    w1 = numpy_helper.from_array(np.ones((16, 16), np.float32), "w1")
    w2 = numpy_helper.from_array(np.ones((16, 8), np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(nodes, "small", [x], [y], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data: bytes = model.SerializeToString()
    onnx.checker.check_model(model)
    return data


@pytest.fixture(scope="module")
def seeds() -> dict[str, bytes]:
    csv_text = (DATA / "input.12.csv").read_text()
    pool = npumem.Pool(8 * MIB, cores=1, name="fuzz")
    cache = KVCache(pool, page_tokens=4, capacity_tokens=16, tag="kv", **SHAPE)
    cache.add_sequence(0, num_tokens=6)
    with TraceRecorder(pool) as rec:
        blocks = [pool.alloc(n, tag=f"t{n % 3}") for n in (100, 5000, 70_000, 300_000, 64)]
        snap = pool.snapshot().with_kv(cache)
        for b in blocks[::2]:
            b.free()
    tiered = TieredPool(
        [npumem.Pool(MIB, cores=1, name="sram"), npumem.Pool(MIB, cores=1, name="sram1")],
        npumem.Pool(4 * MIB, cores=1, name="hbm"),
    )
    hot = [tiered.alloc(50_000, core=c % 2, hot=True, tag="hot") for c in range(3)]
    tiered.touch(hot[0], 4)
    out = {
        "csv": csv_text.encode(),
        "problem": Problem.from_csv(DATA / "input.12.csv").to_json().encode(),
        "graph": json.dumps(graph_seed()).encode(),
        "snapshot": json.dumps(snap.to_json_obj()).encode(),
        "trace": json.dumps(rec.trace.to_json_obj()).encode(),
        "tiers": json.dumps(tiered.snapshot(label="fuzz").to_json_obj()).encode(),
    }
    onnx_bytes = onnx_seed()
    if onnx_bytes is not None:
        out["onnx"] = onnx_bytes
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# ------------------------------------------------------------------------------------------
# Strategies

TOKENS = [
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b'"',
    b":",
    b"\n",
    b"\x00",
    b"\xff",
    b"-1",
    b"0",
    b"1e999",
    b"NaN",
    b"null",
    b"true",
    b"18446744073709551626",
    b"1180591620717411303424",
    b"9" * 40,
    b"[" * 3000,
    b"x" * 140_000,
]

mutation = st.tuples(
    st.sampled_from(["flip", "delete", "insert", "duplicate", "truncate"]),
    st.floats(0, 1),
    st.floats(0, 1),
    st.one_of(st.sampled_from(TOKENS), st.binary(min_size=1, max_size=8)),
)


def mutate(data: bytes, steps: list[tuple[str, float, float, bytes]]) -> bytes:
    """``data`` after byte-level ``steps`` (positions are fractions of the length)."""
    buf = bytearray(data)
    for op, a, b, token in steps:
        n = len(buf)
        i = min(int(a * n), max(n - 1, 0))
        j = min(n, i + 1 + int(b * 64))
        if op == "flip" and n:
            buf[i] ^= 1 << int(b * 7.99)
        elif op == "delete":
            del buf[i:j]
        elif op == "insert":
            buf[i:i] = token
        elif op == "duplicate":
            buf[i:i] = buf[i:j]
        elif op == "truncate":
            del buf[i:]
    return bytes(buf)


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([-1, 0, 2**63, 2**64, 2**64 + 10, 2**70, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)


def nodes(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every value inside ``obj``."""
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from nodes(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from nodes(v, (*path, i))


def replace_at(obj: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    if not path:
        return value
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj


@st.composite
def json_mutant(draw: st.DrawFn, seed: bytes) -> bytes:
    """The seed JSON with some values replaced by arbitrary JSON, or deleted."""
    obj = json.loads(seed)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(nodes(obj))
        path = draw(st.sampled_from(paths))
        obj = replace_at(obj, path, draw(json_value), delete=bool(path) and draw(st.booleans()))
    return json.dumps(obj).encode()


csv_cell = st.one_of(
    st.integers(-5, 2**70).map(str),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r"), max_size=12),
)
generated_csv = st.builds(
    lambda header, rows: "\n".join(",".join(r) for r in [header, *rows]).encode(),
    st.lists(
        st.sampled_from(["id", "lower", "upper", "size", "alignment", "offset", "x"]),
        min_size=1,
        max_size=7,
    ),
    st.lists(st.lists(csv_cell, min_size=1, max_size=7), max_size=8),
)


def file_bytes(kind: str, seeds: dict[str, bytes]) -> st.SearchStrategy[bytes]:
    """Mutants of seed ``kind``: byte-level, and field-level for JSON."""
    if kind not in seeds:
        return st.nothing()
    seed = seeds[kind]
    byte_level = st.lists(mutation, min_size=1, max_size=4).map(lambda s: mutate(seed, s))
    if kind in ("csv", "onnx"):
        return byte_level
    return st.one_of(byte_level, json_mutant(seed))


# ------------------------------------------------------------------------------------------
# The readers


def expect_reader(read: Callable[[Path], object], path: Path, errors: tuple[type, ...]) -> None:
    """``read(path)`` returns or raises one of ``errors`` (a one-line message)."""
    with alarm(SECONDS_PER_RUN):
        try:
            read(path)
        except errors as exc:
            assert "\n" not in str(exc).strip(), str(exc)


PLAN_KINDS = ["csv", "problem", "graph", "onnx"]
SUFFIX = {"csv": ".csv", "problem": ".json", "graph": ".json", "onnx": ".onnx"}


@pytest.mark.parametrize("kind", PLAN_KINDS)
def test_plan_readers_on_mutated_files(
    kind: str, seeds: dict[str, bytes], workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if kind not in seeds:
        pytest.skip("needs the onnx extra")
    src = workdir / f"in-{kind}{SUFFIX[kind]}"
    out = workdir / "plan-out.csv"

    @examples(0.5)
    @given(data=file_bytes(kind, seeds))
    def check(data: bytes) -> None:
        src.write_bytes(data)
        readers = {
            "csv": Problem.from_csv,
            "problem": Problem.from_json,
            "graph": Graph.from_json,
            "onnx": Problem.from_onnx,
        }
        expect_reader(readers[kind], src, (PlanError,))
        with alarm(SECONDS_PER_RUN):
            run_cli(
                ["plan", str(src), "-o", str(out), "--time-limit", "0.05", "-q"], capsys, output=out
            )

    check()


@examples(0.5)
@given(data=generated_csv)
def test_plan_on_generated_csv(
    data: bytes, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = workdir / "generated.csv"
    src.write_bytes(data)
    expect_reader(Problem.from_csv, src, (PlanError,))
    out = workdir / "generated-out.h"
    with alarm(SECONDS_PER_RUN):
        run_cli(
            ["plan", str(src), "-o", str(out), "--time-limit", "0.05", "-q"], capsys, output=out
        )


@examples(0.5)
@given(value=json_value)
def test_every_reader_on_generated_json(
    value: Any, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = workdir / "generated.json"
    src.write_text(json.dumps(value))
    expect_reader(Problem.from_json, src, (PlanError,))
    expect_reader(Graph.from_json, src, (PlanError,))
    expect_reader(load_saved_file, src, (MonitorError,))
    for command in ("plan", "report", "replay"):
        with alarm(SECONDS_PER_RUN):
            status, _, _ = run_cli([command, str(src)], capsys)
        assert status == 2 or command == "plan"


@pytest.mark.parametrize("kind", ["snapshot", "trace"])
def test_report_and_replay_on_mutated_files(
    kind: str, seeds: dict[str, bytes], workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = workdir / f"saved-{kind}.json"

    @examples(1.0)
    @given(data=file_bytes(kind, seeds))
    def check(data: bytes) -> None:
        src.write_bytes(data)
        expect_reader(load_saved_file, src, (MonitorError,))
        with alarm(SECONDS_PER_RUN):
            run_cli(["report", str(src)], capsys)
        try:
            loaded = load_saved_file(src)
        except MonitorError:
            loaded = None
        if loaded is not None and loaded.config["capacity"] > REPLAY_CAPACITY_LIMIT:
            return
        with alarm(SECONDS_PER_RUN):
            run_cli(["replay", str(src)], capsys)

    check()


@pytest.mark.parametrize("kind", ["snapshot", "trace"])
def test_plot_on_mutated_files(
    kind: str, seeds: dict[str, bytes], workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    src = workdir / f"plot-{kind}.json"
    out = workdir / f"plot-{kind}.png"

    @examples(0.15)
    @given(data=file_bytes(kind, seeds))
    def check(data: bytes) -> None:
        src.write_bytes(data)
        with alarm(SECONDS_PER_RUN):
            run_cli(["plot", str(src), "-o", str(out)], capsys, output=out)

    check()


@pytest.mark.parametrize(("command", "fraction"), [("report", 0.5), ("plot", 0.15)])
def test_tier_snapshot_reader_and_commands_on_mutated_files(
    command: str,
    fraction: float,
    seeds: dict[str, bytes],
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if command == "plot":
        pytest.importorskip("matplotlib")
    src = workdir / f"tiers-{command}.json"
    out = workdir / f"tiers-{command}.png"

    @examples(fraction)
    @given(data=file_bytes("tiers", seeds))
    def check(data: bytes) -> None:
        src.write_bytes(data)
        expect_reader(load_tier_snapshot, src, (MonitorError,))
        argv = [command, str(src)] + (["-o", str(out)] if command == "plot" else [])
        with alarm(SECONDS_PER_RUN):
            run_cli(argv, capsys, output=out if command == "plot" else None)

    check()
