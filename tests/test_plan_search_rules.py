"""Rules of the decision search that the plain canonical search lacks, checked on instances
where they decide the outcome: forced sections on perfect packings (every section full)."""

from __future__ import annotations

import pytest

from npumem.plan import solve
from npumem.plan.generator import instance
from npumem.plan.search import components

MIB = 1 << 20


@pytest.mark.parametrize("seed", [3, 12, 15])
def test_perfect_guillotine_packings_are_found_within_a_small_node_budget(seed: int) -> None:
    # Training instances that the search without forced sections did not fit in 10 s (nor
    # MiniMalloc): with them, a few thousand nodes suffice. The node limit makes the run the
    # same on any machine.
    problem = instance("guillotine", seed)
    solution = solve(problem, capacity=MIB, time_limit=120.0, node_limit=20_000)
    solution.validate()
    assert solution.fits
    assert solution.arena_size == MIB
    assert solution.stats.nodes <= 20_000


def test_a_decision_run_at_the_bound_of_a_perfect_packing_finds_it() -> None:
    problem = instance("guillotine", 12)
    comp = max(components(problem), key=lambda c: len(c.sizes))
    assert comp.lower_bound == MIB and len(comp.sizes) > 100
    packing = comp.packing_instance()
    rank = list(range(len(comp.sizes)))
    verdict, offsets, nodes = packing.decide("WAT", comp.lifetimes, rank, MIB, 50_000, 60.0)
    assert verdict == "found"
    assert offsets is not None
    assert nodes < 50_000
    ends = [o + s for o, s in zip(offsets, comp.sizes, strict=True)]
    assert max(ends) <= MIB
    for i in range(len(offsets)):
        for j in comp.neighbors[i]:
            assert ends[i] <= offsets[j] or ends[j] <= offsets[i]
