"""The instance generator: perfect packings at 1 MiB, deterministic, and the kept test set."""

from __future__ import annotations

from pathlib import Path

import pytest

from npumem.plan import Problem, best_greedy, lower_bound
from npumem.plan.generator import (
    ALIGNMENTS,
    KINDS,
    MAX_BUFFERS,
    MIN_BUFFERS,
    instance,
    instance_set,
    spec,
)

TEST_SET = Path(__file__).resolve().parent / "data" / "generated" / "test"
MIB = 1 << 20


@pytest.mark.parametrize("kind", KINDS)
def test_instances_are_perfect_packings_of_the_square(kind: str) -> None:
    for seed in range(3):
        problem = instance(kind, seed)
        assert MIN_BUFFERS <= len(problem) <= MAX_BUFFERS
        assert lower_bound(problem) == MIB
        # Every section is full: the bytes live at each time step sum to exactly 1 MiB.
        steps = sorted({t for b in problem.buffers for t in (b.lower, b.upper)})
        for t in steps[:-1]:
            assert sum(b.size for b in problem.buffers if b.lower <= t < b.upper) == MIB
        assert instance(kind, seed).to_csv() == problem.to_csv()  # deterministic
        assert problem.name == f"{kind}-{seed}"


def test_sets_are_disjoint_hard_and_the_kept_test_set_is_reproduced() -> None:
    train = instance_set("train", 6)
    assert [p.name.rsplit("-", 1)[0] for p in train] == list(KINDS) * 2
    kept = sorted(TEST_SET.glob("*.csv"))
    assert len(kept) == 50
    names = {p.stem for p in kept}
    assert not names & {p.name for p in train}
    for path in kept[:3]:
        kind, seed = path.stem.rsplit("-", 1)
        assert instance(kind, int(seed)).to_csv() == path.read_text()
        problem = Problem.from_csv(path)
        assert lower_bound(problem) == MIB
        assert best_greedy(problem).arena_size > MIB
    with pytest.raises(ValueError, match="unknown set"):
        instance_set("validation", 1)
    with pytest.raises(ValueError, match="unknown kind"):
        spec("spiral", 0)


@pytest.mark.parametrize("kind", KINDS)
def test_aligned_instances_are_the_same_cuts_with_mixed_large_alignments(kind: str) -> None:
    for seed in range(3):
        plain = instance(kind, seed)
        problem = instance(kind, seed, aligned=True)
        assert problem.name == f"aligned-{kind}-{seed}"
        assert [(b.lower, b.upper, b.size) for b in problem.buffers] == [
            (b.lower, b.upper, b.size) for b in plain.buffers
        ]
        assert {b.alignment for b in problem.buffers} <= set(ALIGNMENTS)
        assert len({b.alignment for b in problem.buffers}) >= 3
        # The cut is an aligned packing at 1 MiB: the alignment bound cannot exceed it.
        assert lower_bound(problem) == MIB
        assert instance(kind, seed, aligned=True).to_csv() == problem.to_csv()  # deterministic


def test_a_bad_aligned_flag_is_refused() -> None:
    with pytest.raises(TypeError, match="aligned must be a bool, got 1"):
        instance("skyline", 0, aligned=1)  # type: ignore[arg-type]
