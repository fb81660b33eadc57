"""Solutions: validation, exports (CSV, JSON, C header) and binding into a pool block."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from npumem.plan import (
    Alias,
    Buffer,
    PlanArgumentError,
    PlanArgumentTypeError,
    PlanError,
    PlanValidationError,
    Problem,
    Solution,
    TieredSolution,
    solve,
)
from npumem.plan.tiers import parse_pools


def example() -> Problem:
    return Problem(
        [Buffer("a", 0, 3, 4), Buffer("b", 2, 5, 8, alignment=8), Buffer("c", 4, 6, 4)],
        aliases=[Alias("a.view", "a", 2, 2)],
        name="example",
    )


def test_validate_accepts_a_good_packing() -> None:
    solution = Solution(example(), {"a": 0, "b": 8, "c": 0})
    solution.validate()
    solution.validate(capacity=16)
    assert solution.arena_size == 16


@pytest.mark.parametrize(
    ("offsets", "words"),
    [
        ({"a": 0, "b": 0, "c": 8}, "'a' (live [0, 3), bytes [0, 4)) and 'b'"),
        ({"a": 0, "b": 12, "c": 0}, "not a multiple of its alignment 8"),
        ({"a": 0, "b": 8}, "buffer 'c' has no offset"),
        ({"a": -4, "b": 8, "c": 0}, "not an integer >= 0"),
    ],
)
def test_validate_rejects(offsets: dict[str, int], words: str) -> None:
    with pytest.raises(PlanValidationError) as info:
        Solution(example(), offsets).validate()
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("offsets", "words"),
    [
        ([0.9, 8, 0], "offset 0.9 is not an integer >= 0"),
        ([0, True, 0], "offset True is not an integer >= 0"),
        ({"a": 0}, "buffer 'b' has no offset"),
        ([-5, 8, 0], "offset -5 is not an integer >= 0"),
        # 8 bytes, below the lower bound of 12: a and b share bytes while both live.
        ([0, 0, 4], "'a' (live [0, 3), bytes [0, 4)) and 'b'"),
    ],
)
def test_a_solution_is_made_of_whole_offsets_and_never_below_the_bound(
    offsets: list[object] | dict[str, int], words: str
) -> None:
    # Such offsets used to be truncated, or the plan called optimal with a negative gap.
    with pytest.raises(PlanValidationError) as info:
        Solution(example(), offsets)  # type: ignore[arg-type]
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"capacity": math.nan}, TypeError, "capacity must be a whole number of bytes"),
        ({"capacity": 16.5}, TypeError, "capacity must be a whole number of bytes"),
        ({"capacity": True}, TypeError, "capacity must be a whole number of bytes"),
        ({"capacity": -1}, ValueError, "capacity must be >= 0, got -1"),
        ({"time_limit": "1"}, TypeError, "time_limit must be a number of seconds, got '1'"),
        ({"time_limit": None}, TypeError, "time_limit must be a number of seconds"),
        ({"time_limit": math.nan}, ValueError, "time_limit must be a finite number"),
        ({"node_limit": 1.5}, TypeError, "node_limit must be a whole number of search nodes"),
        ({"node_limit": -5}, ValueError, "node_limit must be >= 0, got -5"),
        ({"seed": None}, TypeError, f"seed must be an integer from 0 to {2**64 - 1}, got None"),
        ({"seed": 1.5}, TypeError, "seed must be an integer from 0 to"),
        ({"seed": "x"}, TypeError, "seed must be an integer from 0 to"),
        ({"seed": True}, TypeError, "got True"),
        ({"seed": [1]}, TypeError, "got [1]"),
        ({"seed": -1}, ValueError, f"seed must be an integer from 0 to {2**64 - 1}, got -1"),
        ({"seed": 2**64}, ValueError, f"got {2**64}"),
        ({"progress": 5}, TypeError, "progress must be None or a callable taking a Progress"),
        ({"progress": "print"}, TypeError, "got 'print'"),
    ],
)
def test_solve_refuses_options_of_the_wrong_kind(
    options: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=re.escape(words)):
        solve(example(), **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"seed": None}, PlanArgumentTypeError),
        ({"seed": 2.0}, PlanArgumentTypeError),
        ({"seed": -1}, PlanArgumentError),
        ({"progress": 5}, PlanArgumentTypeError),
    ],
)
def test_seed_and_progress_are_checked_before_the_search(
    options: dict[str, object], error: type[Exception]
) -> None:
    # Greedy 28 above the bound 26: the search runs and would report its progress.
    rows = [(3, 6, 7), (0, 4, 3), (1, 2, 8), (4, 6, 9), (5, 6, 1), (5, 6, 9), (2, 5, 4), (0, 5, 5)]
    problem = Problem([Buffer(f"b{i}", *row) for i, row in enumerate(rows)])
    with pytest.raises(error) as info:
        solve(problem, time_limit=1.0, **options)  # type: ignore[arg-type]
    assert type(info.value) is error
    with pytest.raises(error):  # the same checks with several pools
        solve(problem, pools=["sram=16", "hbm"], time_limit=0.1, **options)  # type: ignore[arg-type]


def test_seeds_from_0_to_2_to_the_64_minus_1_are_taken() -> None:
    seen: list[int] = []
    for seed in (0, 2**64 - 1):
        solution = solve(example(), time_limit=1.0, seed=seed, progress=lambda p: None)
        seen.append(solution.arena_size)
    assert seen == [12, 12]


def test_validate_checks_capacity_and_pins() -> None:
    with pytest.raises(PlanValidationError, match="16 bytes, above the capacity of 15"):
        Solution(example(), {"a": 0, "b": 8, "c": 0}).validate(capacity=15)
    pinned = Problem([Buffer("p", 0, 1, 4, offset=8)])
    with pytest.raises(PlanValidationError, match="pinned at 8, placed at 0"):
        Solution(pinned, {"p": 0}).validate()


def test_buffers_with_disjoint_lives_may_share_bytes() -> None:
    problem = Problem([Buffer("x", 0, 2, 4), Buffer("y", 2, 4, 4)])
    Solution(problem, [0, 0]).validate()


def test_csv_export_round_trips_through_pinned_offsets(tmp_path: Path) -> None:
    solution = solve(example(), time_limit=2.0)
    path = tmp_path / "out.csv"
    solution.to_csv(path)
    header, *rows = path.read_text().splitlines()
    assert header == "id,lower,upper,size,alignment,offset"
    assert len(rows) == 3
    # A solution CSV read back is a problem with every buffer pinned where it was placed.
    again = Problem.from_csv(path)
    assert {b.id: b.offset for b in again.buffers} == solution.offsets
    Solution(again, solution.offsets).validate()


def test_json_export(tmp_path: Path) -> None:
    solution = solve(example(), time_limit=2.0)
    obj = json.loads(solution.to_json(tmp_path / "out.json"))
    assert obj["arena_size"] == solution.arena_size == 12  # b at 0, then a and c above it
    assert obj["lower_bound"] == 12
    assert obj["status"] == "optimal"
    assert {b["id"]: b["offset"] for b in obj["buffers"]} == solution.offsets
    tensors = {t["name"]: (t["offset"], t["size"]) for t in obj["tensors"]}
    assert tensors["a.view"] == (solution.offsets["a"] + 2, 2)
    assert json.loads((tmp_path / "out.json").read_text()) == obj


def test_no_reuse_figure_counts_the_padding_alignment_needs(tmp_path: Path) -> None:
    # a at 0 (4 bytes), b at the next multiple of 8 (8 bytes), c right after it (4 bytes).
    solution = solve(example(), time_limit=1.0)
    assert example().total_size == 16
    assert solution.naive_size == 20
    assert json.loads(solution.to_json())["naive_size"] == 20
    aligned = solve(example().with_alignment(1024), time_limit=1.0)
    assert aligned.naive_size == 2 * 1024 + 4 >= aligned.arena_size
    # Problem order decides the padding: two 1-byte buffers aligned to 64 after a 1-byte one.
    mixed = Problem([Buffer("x", 0, 1, 1), Buffer("y", 0, 1, 1, 64), Buffer("z", 0, 1, 1, 64)])
    assert Solution(mixed, [128, 0, 64]).naive_size == 64 + 64 + 1


def test_c_header_has_the_offset_table(tmp_path: Path) -> None:
    problem = Problem([Buffer('odd "name"', 0, 2, 4), Buffer("b", 1, 3, 4)])
    solution = Solution(problem, {'odd "name"': 4, "b": 0})
    text = solution.to_c_header(tmp_path / "plan.h", prefix="my-model")
    assert "#define MY_MODEL_ARENA_SIZE 8u" in text
    assert "#define MY_MODEL_NUM_TENSORS 2u" in text
    entries = re.findall(r'\{"((?:[^"\\]|\\.)*)", (\d+)u, (\d+)u\}', text)
    assert entries == [('odd \\"name\\"', "4", "4"), ("b", "0", "4")]
    assert text.count("{") == text.count("}")
    assert (tmp_path / "plan.h").read_text() == text


@dataclass
class FakeBlock:
    offset: int
    nbytes: int


def test_bind_gives_absolute_offsets_inside_the_block() -> None:
    solution = Solution(example(), {"a": 0, "b": 8, "c": 0})
    table = solution.bind(FakeBlock(offset=4096, nbytes=64))
    assert table == {"a": 4096, "b": 4104, "c": 4096, "a.view": 4098}


def test_bind_refuses_a_small_or_misaligned_block() -> None:
    solution = Solution(example(), {"a": 0, "b": 8, "c": 0})
    with pytest.raises(PlanError, match="needs 16 bytes but the block holds only 15"):
        solution.bind(FakeBlock(offset=0, nbytes=15))
    with pytest.raises(PlanError, match="not a multiple of 8"):
        solution.bind(FakeBlock(offset=4, nbytes=64))


def test_summary_and_gap() -> None:
    problem = Problem([Buffer("x", 0, 2, 4), Buffer("y", 1, 3, 4)])
    solution = Solution(problem, [0, 6])  # 10 bytes where 8 would do
    assert solution.lower_bound == 8
    assert solution.gap == pytest.approx(0.25)
    assert solution.status == "feasible"
    assert "gap 25.00%" in solution.summary()
    with pytest.raises(PlanError, match="1 offsets given for 2 buffers"):
        Solution(problem, [0])


def test_bind_into_a_real_pool_block_keeps_live_tensors_apart() -> None:
    """A planned arena lives inside a block of a runtime pool: every tensor's bytes are inside
    the block, and tensors live at the same time never share a byte (checked by writing them)."""
    import numpy as np

    import npumem
    from npumem.plan import networks, solve

    problem = Problem.from_graph(networks.mobilenet_v2(image_size=96), alignment=64)
    solution = solve(problem, time_limit=2.0)
    solution.validate()
    pool = npumem.Pool(64 << 20, cores=2)
    before = pool.alloc(12345)  # something before it, so the block does not start at offset 0
    block = pool.alloc(solution.arena_size, align=64, tag="mobilenet activations")
    table = solution.bind(block)
    arena = np.frombuffer(block, dtype=np.uint8)
    by_name = {b.id: b for b in problem.buffers}
    for name, size in ((b.id, b.size) for b in problem.buffers):
        start = table[name] - block.offset
        assert start >= 0 and start + size <= block.nbytes
    # Walk time: at each step write every live tensor's index into its bytes, then read back.
    steps = sorted({b.lower for b in problem.buffers})
    for t in steps[:: max(1, len(steps) // 25)]:
        live = [b for b in problem.buffers if b.lower <= t < b.upper]
        for i, b in enumerate(live):
            arena[table[b.id] - block.offset : table[b.id] - block.offset + b.size] = i % 251
        for i, b in enumerate(live):
            view = arena[table[b.id] - block.offset : table[b.id] - block.offset + b.size]
            assert (view == i % 251).all(), f"{b.id} shares bytes with another live tensor at t={t}"
    assert set(by_name) <= set(table)
    del arena, view
    table.release()  # the table pins the block while it holds the offsets
    block.free()
    before.free()
    pool.check()


HOSTILE_NAMES = [
    "x */ #error injected\n /* ",
    "trigraph ??= ??/ ??' end",
    'quote " back\\slash',
    "tab\tnewline\nnul-free \x7f del",
    "é ü 名 \U0001f600",
    "a/*b*/c/",
]


def c_compiler() -> str | None:
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def hostile_headers(tmp_path: Path) -> tuple[Problem, list[Path]]:
    """A plan and a plan over pools whose problem, buffer, alias and pool names all try to
    break out of the C header: written as `one.h` and `tiers.h`."""
    problem = Problem(
        [Buffer(name, i, i + 2, 8) for i, name in enumerate(HOSTILE_NAMES)],
        aliases=[Alias("alias */ #error in alias\n", HOSTILE_NAMES[0], 0, 4)],
        name="problem */ #error injected\n /* ??/",
    )
    solution = solve(problem, time_limit=1.0)
    one = tmp_path / "one.h"
    solution.to_c_header(one, prefix="one")
    sram = Problem(problem.buffers[:3], aliases=problem.aliases, name=problem.name)
    hbm = Problem(problem.buffers[3:], name=problem.name)
    tiered = TieredSolution(
        problem,
        [("fast */ #error pool\n", 1 << 20), ("slow", None)],
        {
            "fast */ #error pool\n": solve(sram, time_limit=1.0),
            "slow": solve(hbm, time_limit=1.0),
        },
        weight_bound=1.0,
    )
    tiers = tmp_path / "tiers.h"
    tiered.to_c_header(tiers, prefix="9 tiers-plan")
    return problem, [one, tiers]


def test_c_headers_keep_hostile_names_inside_comments_and_strings(tmp_path: Path) -> None:
    problem, headers = hostile_headers(tmp_path)
    for header in headers:
        text = header.read_text()
        assert text.isascii()
        # What is left once comments and string literals are taken out is plain C.
        code = re.sub(r'"(?:[^"\\\n]|\\.)*"|/\*.*?\*/', "", text, flags=re.S)
        assert "#error" not in code and "*/" not in code and '"' not in code
        assert "??" not in text.replace("\\?", "")
    cc = c_compiler()
    if cc is None:
        return  # the text checks above are all this machine can do
    # Every name comes back byte for byte from the table, and the header compiles cleanly.
    program = tmp_path / "names.c"
    program.write_text(
        '#include <stdio.h>\n#include "one.h"\n#include "tiers.h"\n'
        "static void dump(const char *name) {\n"
        '    for (; *name; ++name) printf("%02x", (unsigned char)*name);\n'
        '    printf("\\n");\n'
        "}\n"
        "int main(void) {\n"
        "    size_t i;\n"
        "    for (i = 0; i < ONE_NUM_TENSORS; ++i) dump(one_table[i].name);\n"
        "    for (i = 0; i < _9_TIERS_PLAN_FAST_____ERROR_POOL__NUM_TENSORS; ++i)\n"
        "        dump(_9_tiers_plan_fast_____error_pool__table[i].name);\n"
        "    for (i = 0; i < _9_TIERS_PLAN_SLOW_NUM_TENSORS; ++i)\n"
        "        dump(_9_tiers_plan_slow_table[i].name);\n"
        "    return 0;\n"
        "}\n"
    )
    exe = tmp_path / "names"
    command = [cc, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", str(program)]
    built = subprocess.run([*command, "-o", str(exe)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    names = [bytes.fromhex(line).decode("utf-8") for line in ran.stdout.splitlines()]
    expected = [b.id for b in problem.buffers] + [a.name for a in problem.aliases]
    assert names[: len(expected)] == expected
    assert sorted(names[len(expected) :]) == sorted(expected)


def test_pool_names_that_differ_only_in_case_are_refused() -> None:
    # Upper-cased in the C header's macros, they would define the same names twice.
    with pytest.raises(PlanError, match="ignoring case"):
        parse_pools([("sram", 1024), ("SRAM", None)])


def test_an_id_a_csv_file_cannot_keep_is_refused_there_only(tmp_path: Path) -> None:
    # The CSV reader strips ids: " a" would be read back as "a", a duplicate.
    problem = Problem([Buffer("a", 0, 2, 4), Buffer(" a", 1, 3, 4)])
    solution = solve(problem, time_limit=0.5)
    for write in (solution.to_csv, problem.to_csv):
        with pytest.raises(PlanError, match=r"buffer ' a': a CSV file cannot keep the spaces"):
            write(tmp_path / "plan.csv")
    assert not (tmp_path / "plan.csv").exists()
    again = Problem.from_json(json.loads(solution.to_json()))
    assert [b.id for b in again.buffers] == ["a", " a"]
