"""Plan and problem JSON: the buffers' and tensors' rows are formatted directly, not encoded one
by one with `json`'s encoder (a few microseconds a row, most of the time a large plan took to
write), and the text stays byte for byte what `npumem.fileio.json_text` writes."""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

import npumem.fileio
from npumem.fileio import json_text
from npumem.plan import Alias, Buffer, Problem, Solution, solve


class _Counting:
    """Stands in for fileio's row encoder, counting its calls."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self.calls = 0

    def encode(self, value: object) -> str:
        self.calls += 1
        text: str = self.encoder.encode(value)
        return text


@pytest.fixture
def row_encodings(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Counting]:
    counting = _Counting(npumem.fileio._ROW_ENCODER)
    monkeypatch.setattr(npumem.fileio, "_ROW_ENCODER", counting)
    yield counting


def random_problem(seed: int, n: int = 300) -> Problem:
    """Buffers with every kind of field: alignments, pins, weights (int and float), ids that
    JSON escapes; aliases and empty tensors."""
    rng = random.Random(seed)
    buffers = []
    pinned_top = 0
    for i in range(n):
        lower = rng.randrange(n)
        size = rng.randrange(1, 1 << 20)
        weight: float | None = rng.choice((None, None, 3, 2.5, 1e-7, 1e22, 0.1))
        pin = None
        if i % 17 == 0:  # pinned, one above the other: no two overlap
            pin, pinned_top = pinned_top, pinned_top + size
        ident = rng.choice(("t", 'q"uote', "back\\slash", "ünïcode", "tab\t", "€", "a/b"))
        buffers.append(
            Buffer(
                f"{ident}{i}",
                lower,
                lower + rng.randrange(1, 30),
                size,
                1 if pin is not None else rng.choice((1, 1, 64, 4096)),
                offset=pin,
                weight=weight,
            )
        )
    aliases = [Alias(f"view{k}", buffers[k].id, 0, 1) for k in range(1, 40, 3)]
    return Problem(buffers, aliases=aliases, name='mixed "name"', empty=["empty0", "empty1"])


@pytest.mark.parametrize("seed", range(4))
def test_plan_json_is_the_same_text_without_encoding_each_row(
    seed: int, row_encodings: _Counting
) -> None:
    problem = random_problem(seed)
    if seed % 2:
        problem = problem.pipelined([problem.buffers[1].id, problem.buffers[2].id], 3)
    solution = solve(problem, time_limit=5.0, node_limit=1000)
    expected_plan = json_text(solution.to_json_obj(), indent=1)
    expected_problem = json_text(problem.to_json_obj(), indent=1)
    row_encodings.calls = 0
    assert solution.to_json() == expected_plan
    assert problem.to_json() == expected_problem
    # Not one encoder call per buffer or tensor: a few for the figures, aliases and slots.
    assert row_encodings.calls < 100 < len(problem.buffers)
    # The plan reads back as the problem with every buffer pinned where it was placed.
    again = Problem.from_json(json.loads(solution.to_json()))
    assert [b.offset for b in again.buffers] == [solution.offsets[b.id] for b in problem.buffers]


class Size(enum.IntEnum):
    SMALL = 8


def test_rows_of_other_types_and_no_rows_keep_the_text(row_encodings: _Counting) -> None:
    problem = Problem([Buffer(f"b{i}", i, i + 2, 64) for i in range(200)])
    solution = Solution(problem, [64 * (i % 2) for i in range(200)])
    expected = json_text(solution.to_json_obj(), indent=1)
    row_encodings.calls = 0
    assert solution.to_json() == expected
    assert row_encodings.calls < 50 < len(problem.buffers)
    # A field of a subclass of int: `json_text` spreads such a row over lines; so does the plan.
    odd = Problem([Buffer("a", 0, 1, Size.SMALL), Buffer("b", 0, 1, 8)])
    odd_solution = Solution(odd, [0, 8])
    assert odd_solution.to_json() == json_text(odd_solution.to_json_obj(), indent=1)
    assert odd.to_json() == json_text(odd.to_json_obj(), indent=1)
    # No buffers at all.
    empty = Solution(Problem([]), [])
    assert empty.to_json() == json_text(empty.to_json_obj(), indent=1)
    assert Problem([]).to_json() == json_text(Problem([]).to_json_obj(), indent=1)
