"""Reading and writing planning problems: CSV and JSON, and the errors bad input gets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from npumem.errors import NpumemError
from npumem.plan import (
    Alias,
    Buffer,
    Graph,
    PlanArgumentError,
    PlanError,
    Problem,
    ProblemFormatError,
    lower_bound,
    solve,
)
from npumem.plan.bounds import alignment_bound, fixed_bound, live_bytes, live_profile
from npumem.plan.cli import load_problem
from npumem.plan.problem import MAX_IN_FLIGHT

DATA = Path(__file__).resolve().parent / "data" / "minimalloc"

EXAMPLE = "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n"


def write(tmp_path: Path, text: str, name: str = "p.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reads_the_minimalloc_example(tmp_path: Path) -> None:
    problem = Problem.from_csv(write(tmp_path, EXAMPLE))
    assert problem.ids == ["b1", "b2", "b3", "b4", "b5"]
    assert problem["b4"] == Buffer("b4", 9, 21, 4)
    assert live_bytes(problem) == 12
    assert lower_bound(problem) == 12
    assert problem.total_size == 20


def test_columns_in_any_order_with_alignment_and_pinned_offset(tmp_path: Path) -> None:
    text = "size,upper,lower,id,alignment,offset\n10,5,0,a,8,\n4,5,0,b,1,16\n"
    problem = Problem.from_csv(write(tmp_path, text))
    assert problem["a"] == Buffer("a", 0, 5, 10, 8, None)
    assert problem["b"] == Buffer("b", 0, 5, 4, 1, 16)
    assert fixed_bound(problem) == 20


def test_csv_round_trip(tmp_path: Path) -> None:
    problem = Problem([Buffer("x", 0, 2, 5, 4), Buffer("y", 1, 3, 7, 1, 8), Buffer("z,1", 2, 4, 1)])
    again = Problem.from_csv(write(tmp_path, problem.to_csv()))
    assert again.buffers == problem.buffers


def test_json_round_trip(tmp_path: Path) -> None:
    problem = Problem([Buffer("x", 0, 2, 5, 4), Buffer("y", 1, 3, 7, 1, 8)], name="demo")
    again = Problem.from_json(write(tmp_path, problem.to_json(), "p.json"))
    assert again.buffers == problem.buffers
    assert again.name == "demo"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("id,lower,upper\na,0,1\n", 1, "missing column(s) 'size'"),
        ("id,lower,size\na,0,1\n", 1, "'upper'"),
        ("id,lower,upper,size,colour\na,0,1,2,red\n", 1, "unknown column(s) 'colour'"),
        ("id,lower,upper,size\na,0,1,4\nb,0,1,-3\n", 3, "size must be a positive integer, got -3"),
        ("id,lower,upper,size\na,0,1,0\n", 2, "size must be a positive integer, got 0"),
        (
            "id,lower,upper,size\na,0,1,4\n\nb,5,5,4\n",
            4,
            "upper (5) must be greater than lower (5)",
        ),
        ("id,lower,upper,size\na,7,3,4\n", 2, "upper (3) must be greater than lower (7)"),
        ("id,lower,upper,size\na,0,1,4.5\n", 2, "size must be an integer, got '4.5'"),
        ("id,lower,upper,size\na,zero,1,4\n", 2, "lower must be an integer, got 'zero'"),
        ("id,lower,upper,size\na,0,,4\n", 2, "upper must be an integer, got ''"),
        ("id,lower,upper,size\na,0,1,4,9\n", 2, "expected 4 fields"),
        ("id,lower,upper,size\na,0,1,4\na,2,3,4\n", 3, "already used on line 2"),
        ("id,lower,upper,size\n,0,1,4\n", 2, "the id is empty"),
        ("id,lower,upper,size,alignment\na,0,1,4,3\n", 2, "alignment must be a power of two"),
        ("id,lower,upper,size,offset\na,0,1,4,-8\n", 2, "offset must be non-negative"),
    ],
)
def test_bad_csv_names_the_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ProblemFormatError) as info:
        Problem.from_csv(path)
    message = str(info.value)
    assert message.startswith(f"{path}, line {line}:"), message
    assert words in message


def test_bad_input_errors_are_npumem_and_value_errors(tmp_path: Path) -> None:
    with pytest.raises(NpumemError):
        Problem.from_csv(write(tmp_path, "id,lower,upper,size\na,0,1,-1\n"))
    with pytest.raises(ValueError, match="empty"):
        Problem.from_csv(write(tmp_path, ""))
    with pytest.raises(ProblemFormatError, match="cannot read"):
        Problem.from_csv(tmp_path / "missing.csv")


def test_pinned_buffers_that_clash_are_refused(tmp_path: Path) -> None:
    text = "id,lower,upper,size,offset\na,0,4,8,0\nb,2,6,8,4\n"
    with pytest.raises(ProblemFormatError, match="'a' and 'b'"):
        Problem.from_csv(write(tmp_path, text))


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        ({}, "expected a 'buffers' list"),
        ({"buffers": [{"id": "a", "lower": 0, "upper": 1}]}, "buffers[0]: missing field(s) 'size'"),
        ({"buffers": [{"id": "a", "lower": 0, "upper": 1, "size": -2}]}, "size must be a positive"),
        (
            {"buffers": [{"id": "a", "lower": 0, "upper": 1, "size": 1.5}]},
            "size must be an integer",
        ),
        (
            {"buffers": [{"id": "a", "lower": 0, "upper": 1, "size": True}]},
            "size must be an integer",
        ),
        (
            {"buffers": [{"id": "a", "lower": 2, "upper": 1, "size": 1}]},
            "upper (1) must be greater",
        ),
        (
            {"buffers": [{"id": "a", "lower": 0, "upper": 1, "size": 1, "colour": 1}]},
            "unknown field(s) 'colour'",
        ),
        (
            {"buffers": [{"id": "a\u0000b", "lower": 0, "upper": 1, "size": 1}]},
            "the id holds a NUL character",
        ),
        (
            {
                "buffers": [{"id": "a", "lower": 0, "upper": 1, "size": 4}],
                "aliases": [{"name": None, "base": "a", "size": 2}],
            },
            "aliases[0]: expected {'name', 'base', 'offset', 'size'} with string name",
        ),
        (
            {"buffers": [{"id": "a", "lower": 0, "upper": 1, "size": 4}], "name": 5},
            "'name' must be a string, got a number",
        ),
        (
            {"buffers": [{"id": "a", "lower": 0, "upper": 1, "size": 4}], "aliases": [None]},
            "integer offset and size, got null",
        ),
        (
            {
                "buffers": [{"id": "a", "lower": 0, "upper": 1, "size": 4}],
                "aliases": [{"name": "v", "base": "a", "offset": 1e3, "size": 2}],
            },
            "; offset is a number 1000.0",
        ),
        (
            {
                "buffers": [{"id": "a", "lower": 0, "upper": 1, "size": 4}],
                "aliases": [{"name": "v", "base": "a"}],
            },
            "; missing 'size'",
        ),
    ],
)
def test_bad_json_names_the_entry(obj: dict[str, object], words: str) -> None:
    with pytest.raises(ProblemFormatError) as info:
        Problem.from_json(obj)
    assert words in str(info.value)


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, '{"buffers": [\n  {"id": "a",,}\n]}', "bad.json")
    with pytest.raises(ProblemFormatError, match=r"line 2, column"):
        Problem.from_json(path)


def test_buffers_given_in_code_are_checked() -> None:
    with pytest.raises(ProblemFormatError, match="buffer 'x': size"):
        Problem([Buffer("x", 0, 1, 0)])
    with pytest.raises(ProblemFormatError, match="appears twice"):
        Problem([Buffer("x", 0, 1, 1), Buffer("x", 1, 2, 1)])
    with pytest.raises(ProblemFormatError, match="not a multiple of the alignment"):
        Problem([Buffer("x", 0, 1, 1, alignment=8, offset=4)])


def test_bounds() -> None:
    # Live: [0,2): a+b = 3+5; [2,4): b+c = 5+7 -> LB 12.
    problem = Problem([Buffer("a", 0, 2, 3), Buffer("b", 0, 4, 5), Buffer("c", 2, 4, 7)])
    assert live_profile(problem) == [(0, 8), (2, 12), (4, 0)]
    assert live_bytes(problem) == 12
    # Aligned to 8: every offset is a multiple of 8, so b (5) and c (7) take 8 each, but the
    # topmost needs only its size: at least 8 + 8 less the larger padding (3 of b), 13.
    aligned = problem.with_alignment(8)
    assert alignment_bound(aligned) == 8 + 8 - 3
    # Aligned to 64: b below c ends at 64 + 7, c below b at 64 + 5 (the bound).
    assert alignment_bound(problem.with_alignment(64)) == 64 + 64 - 59
    # Two 1-byte buffers aligned to 16 and an unaligned one, live together: the aligned pair
    # alone needs 16 + 1, whatever the unaligned one needs (it fits in the padding).
    mixed = Problem([Buffer("a", 0, 2, 1, 16), Buffer("b", 0, 2, 1, 16), Buffer("c", 0, 2, 1)])
    assert alignment_bound(mixed) == lower_bound(mixed) == 17
    assert solve(mixed, time_limit=1.0).arena_size == 17
    assert lower_bound(Problem([])) == 0


def test_hard_suite_lower_bounds_match_the_readme() -> None:
    expected = {"A": 1048576, "B": 1048576, "C": 1039360, "D": 986112, "E": 1048576, "F": 1048576}
    for name, bound in expected.items():
        problem = Problem.from_csv(DATA / f"{name}.1048576.csv")
        assert live_bytes(problem) == bound, name


def readers() -> list[Callable[[Any], object]]:
    return [Problem.from_csv, Problem.from_json, Graph.from_json, load_problem]


@pytest.mark.parametrize("reader", readers(), ids=lambda f: f"{f.__qualname__}")
@pytest.mark.parametrize(
    ("source", "words"),
    [
        (None, "got NoneType"),
        (123, "got int"),
        (b"model.csv", "got bytes"),
        (["model.csv"], "got list"),
        ("a\x00b.csv", "NUL character"),
    ],
)
def test_readers_refuse_what_is_not_a_path(
    reader: Callable[[Any], object], source: object, words: str
) -> None:
    with pytest.raises(PlanError, match=words) as info:
        reader(source)
    assert isinstance(info.value, ProblemFormatError)  # GraphError for graphs is one too


@pytest.mark.parametrize("alignment", ["8", 2.0, True, 0, 3, -4, 1 << 70])
def test_alignments_that_are_not_power_of_two_integers_are_refused(alignment: object) -> None:
    with pytest.raises(ProblemFormatError, match="alignment"):
        load_problem(DATA / "input.12.csv", alignment=alignment)  # type: ignore[arg-type]
    with pytest.raises(ProblemFormatError, match="alignment"):
        Problem.from_csv(DATA / "input.12.csv").with_alignment(alignment)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("buffer", "words"),
    [
        (Buffer(7, 0, 1, 4), "id must be a string"),  # type: ignore[arg-type]
        (Buffer("a", "0", 1, 4), "lower must be an integer"),  # type: ignore[arg-type]
        (Buffer("a", 0, 1, 4.0), "size must be an integer"),  # type: ignore[arg-type]
        (Buffer("a", 0, 1, 4, alignment=None), "alignment must be"),  # type: ignore[arg-type]
        (Buffer("a", 0, 1, 4, offset="0"), "offset must be an integer"),  # type: ignore[arg-type]
        (Buffer("a", 0, 1, 4, weight="1"), "weight must be a number"),  # type: ignore[arg-type]
    ],
)
def test_buffers_of_the_wrong_types_are_refused(buffer: Buffer, words: str) -> None:
    with pytest.raises(ProblemFormatError, match=words):
        Problem([buffer])


@pytest.mark.parametrize(
    ("alias", "words"),
    [
        (Alias("v", "a", 0.5, 1), "alias 'v': offset must be an integer, got 0.5"),
        (Alias("v", "a", 0, 2.5), "alias 'v': size must be an integer, got 2.5"),
        (Alias("v", "a", 0, "1"), "alias 'v': size must be an integer, got '1'"),
        (Alias("v", "a", True, 1), "alias 'v': offset must be an integer, got True"),
        (Alias("v", "a", None, 1), "alias 'v': offset must be an integer, got None"),
        (Alias(5, "a", 0, 1), "alias 5: the name must be a string, got 5"),
        (Alias("v", 5, 0, 1), "alias 'v': the base must be a string, got 5"),
        (Alias("", "a", 0, 1), "alias '': the name is empty"),
        (Alias("v\x00w", "a", 0, 1), "alias 'v\\x00w': the name holds a NUL character"),
        (("v", "a", 0, 1), "alias entry 0 is a tuple, not an Alias"),
        (None, "alias entry 0 is a NoneType, not an Alias"),
    ],
)
def test_aliases_of_the_wrong_types_are_refused(alias: object, words: str) -> None:
    with pytest.raises(ProblemFormatError) as info:
        Problem([Buffer("a", 0, 2, 4)], aliases=[alias])  # type: ignore[list-item]
    assert str(info.value).startswith(words)
    assert type(info.value) is ProblemFormatError


def test_good_aliases_still_pass_and_reach_the_c_header() -> None:
    problem = Problem(
        [Buffer("a", 0, 2, 4)], aliases=[Alias("v", "a", 1, 3), Alias("e", "a", 4, 0)]
    )
    header = solve(problem, time_limit=1.0).to_c_header()
    assert '{"v", 1u, 3u},' in header and '{"e", 4u, 0u},' in header


@pytest.mark.parametrize("in_flight", [0, 257, 10**6, 2.0, "2"])
def test_in_flight_is_bounded(in_flight: object) -> None:
    problem = Problem([Buffer("a", 0, 2, 4)])
    # An argument the call cannot take, not a malformed problem: a PlanArgumentError (so a
    # ValueError too) whose message gives the range.
    with pytest.raises(PlanArgumentError, match=r"in_flight must be an integer from 1 to 256"):
        problem.pipelined(["a"], in_flight)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        problem.pipelined(["a"], in_flight)  # type: ignore[arg-type]
    assert len(problem.pipelined(["a"], MAX_IN_FLIGHT)) == MAX_IN_FLIGHT
