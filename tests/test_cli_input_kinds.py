"""Every JSON input of the command line refuses a key given twice, and a command given a file of
another kind says what the file is and what it expected: one line, exit status 2."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import npumem
from cli_contract import run_cli
from npumem.monitor import TraceRecorder
from npumem.plan import Problem, solve
from npumem.plan.networks import mobilenet_v2
from npumem.tiers import TieredPool

MIB = 1 << 20
DATA = Path(__file__).parent / "data" / "minimalloc"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One JSON object of each kind of file the command line reads, as npumem writes it."""
    pool = npumem.Pool(16 * MIB, cores=1, name="kinds")
    with TraceRecorder(pool) as rec:
        blocks = [pool.alloc(1000, tag="x") for _ in range(3)]
        snap = pool.snapshot()
        for b in blocks:
            b.free()
    mem = TieredPool(
        [npumem.Pool(2 * MIB, cores=1, name="sram0")], npumem.Pool(16 * MIB, cores=1, name="hbm")
    )
    mem.alloc(100_000, core=0, hot=True, tag="hot")
    problem = Problem.from_csv(DATA / "input.12.csv")
    return {
        "problem": json.loads(problem.to_json()),
        "graph": json.loads(mobilenet_v2().to_json()),
        "plan": json.loads(solve(problem, time_limit=0.2).to_json()),
        "tier-plan": json.loads(solve(problem, pools=["sram=8", "hbm"], time_limit=0.2).to_json()),
        "snapshot": snap.to_json_obj(),
        "trace": rec.trace.to_json_obj(),
        "tiers": mem.snapshot(label="tiers").to_json_obj(),
    }


def dumps_with_duplicate(obj: Any, at: Sequence[str | int]) -> str:
    """`obj` as JSON text in which the object at the path `at` gives its first key twice (with
    the same value, which `json` alone would accept without a word)."""

    def encode(item: Any, here: tuple[str | int, ...]) -> str:
        if isinstance(item, dict):
            pairs = [f"{json.dumps(k)}: {encode(v, (*here, k))}" for k, v in item.items()]
            if here == tuple(at):
                pairs.append(pairs[0])
            return "{" + ", ".join(pairs) + "}"
        if isinstance(item, list):
            return "[" + ", ".join(encode(v, (*here, i)) for i, v in enumerate(item)) + "]"
        return json.dumps(item)

    return encode(obj, ())


def first_key(obj: Any, at: Sequence[str | int]) -> str:
    for step in at:
        obj = obj[step]
    return str(next(iter(obj)))


# (kind, the object given a key twice, as the message names it, the commands that read the kind)
DUPLICATES: list[tuple[str, tuple[str | int, ...], str, tuple[str, ...]]] = [
    ("problem", ("buffers", 1), "buffers[1]", ("plan",)),
    ("graph", ("ops", 2), "ops[2]", ("plan",)),
    ("plan", (), "the top-level object", ("plan", "plot")),
    ("plan", ("greedy",), "greedy", ("plan", "plot")),
    ("tier-plan", (), "the top-level object", ("plot",)),
    ("tier-plan", ("pools", 1), "pools[1]", ("plot",)),
    ("snapshot", ("stats",), "stats", ("report", "plot", "view")),
    ("snapshot", ("config",), "config", ("report", "plot", "view")),
    ("trace", (), "the top-level object", ("replay", "plot", "view", "export")),
    ("trace", ("stats_at_stop", "per_core", 0), "stats_at_stop.per_core[0]", ("replay",)),
    ("tiers", ("stats", "fast", 0), "stats.fast[0]", ("report", "plot")),
    ("tiers", ("tiers",), "tiers", ("report", "plot")),
]

OUTPUTS = {"plan": "out.json", "plot": "out.png", "view": "out.html", "export": "out.json"}


def run_on(
    command: str, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """`npumem COMMAND SRC`, with `-o` for the commands that write a file (which must not be
    left behind by a refusal)."""
    out = tmp_path / OUTPUTS[command] if command in OUTPUTS else None
    extra = ["--time-limit", "0.1"] if command == "plan" else []
    argv = [command, str(src), *extra, *(["-o", str(out)] if out else [])]
    return run_cli(argv, capsys, output=out)


@pytest.mark.parametrize(
    ("kind", "at", "where", "command"),
    [(k, at, where, c) for k, at, where, commands in DUPLICATES for c in commands],
)
def test_a_key_given_twice_is_refused_by_every_reader(
    kind: str,
    at: tuple[str | int, ...],
    where: str,
    command: str,
    inputs: dict[str, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = tmp_path / f"{kind}.json"
    src.write_text(dumps_with_duplicate(inputs[kind], at))
    status, _, err = run_on(command, src, tmp_path, capsys)
    assert status == 2
    key = first_key(inputs[kind], at)
    assert f"{src}: the key {key!r} is given twice in {where} " in err, err


@pytest.mark.parametrize(
    ("kind", "command"),
    sorted({(k, c) for k, _, _, commands in DUPLICATES for c in commands}),
)
def test_the_same_files_without_the_duplicate_are_read(
    kind: str,
    command: str,
    inputs: dict[str, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = tmp_path / f"{kind}.json"
    src.write_text(dumps_with_duplicate(inputs[kind], ("no such object",)))
    status, _, err = run_on(command, src, tmp_path, capsys)
    assert status == 0, err


# ----- a file of another kind ------------------------------------------------------------------

# (command, the kinds it reads, as its message names them)
READS = {
    "report": "a snapshot or a tier snapshot",
    "plot": "a snapshot, a trace, a plan, a plan over several pools or a tier snapshot",
    "view": "a snapshot or a trace",
    "export": "a trace",
    "replay": "a trace",
}
WHAT = {
    "snapshot": "a snapshot",
    "trace": "a trace",
    "plan": "a plan",
    "tier-plan": "a plan over several pools",
    "tiers": "a tier snapshot",
    "graph": "a planner graph",
}
READERS = {
    "snapshot": "npumem report, plot and view read snapshots",
    "trace": "npumem replay, plot, view and export read traces",
    "plan": "npumem plot draws plans",
    "tier-plan": "npumem plot draws plans over several pools",
    "tiers": "npumem report and plot read tier snapshots",
    "graph": "npumem plan reads graphs",
}
ACCEPTS = {
    "report": {"snapshot", "tiers"},
    "plot": {"snapshot", "trace", "plan", "tier-plan", "tiers"},
    "view": {"snapshot", "trace"},
    "export": {"trace"},
    "replay": {"trace"},
}


@pytest.mark.parametrize(
    ("command", "kind"),
    [(c, k) for c in READS for k in WHAT if k not in ACCEPTS[c]],
)
def test_a_file_of_another_kind_is_named_with_what_was_expected(
    command: str,
    kind: str,
    inputs: dict[str, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = tmp_path / "given.json"
    obj = dict(inputs[kind])
    if kind == "graph":
        obj.update(format="npumem-graph", version=1)
    src.write_text(json.dumps(obj))
    status, _, err = run_on(command, src, tmp_path, capsys)
    assert status == 2
    expected = f"npumem {command}: error: {src} is {WHAT[kind]}, not {READS[command]}; "
    assert err.strip() == expected + READERS[kind], err


@pytest.mark.parametrize("command", list(READS))
def test_the_output_of_another_command_is_named(
    command: str,
    inputs: dict[str, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(inputs["trace"]))
    exported = tmp_path / "t.perfetto.json"
    assert run_cli(["export", str(trace), "-o", str(exported)], capsys)[0] == 0
    status, _, err = run_on(command, exported, tmp_path, capsys)
    assert status == 2
    assert f"{exported} is a Chrome trace (npumem export), not {READS[command]}" in err, err


@pytest.mark.parametrize("command", list(READS))
def test_a_json_object_of_no_known_format_names_the_formats_expected(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "other.json"
    src.write_text('{"format": "something-else"}')
    status, _, err = run_on(command, src, tmp_path, capsys)
    assert status == 2
    assert f"{src}: not {READS[command]} (format is 'something-else', expected 'npumem-" in err
