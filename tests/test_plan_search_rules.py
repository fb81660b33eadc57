"""Rules of the decision search that the plain canonical search lacks, checked on instances
where they decide the outcome: forced sections on perfect packings (every section full)."""

from __future__ import annotations

import pytest

import npumem
from npumem._core import PackingInstance
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


@pytest.mark.parametrize(("kind", "seed"), [("guillotine", 15), ("skyline", 10)])
def test_perfect_packings_with_mixed_alignments_are_found_within_a_node_budget(
    kind: str, seed: int
) -> None:
    # Buffers aligned to 64 B to 1 MiB, the optimum 1 MiB (the cut): with the orders led by the
    # alignment, the minimize mode reaches it within the budget (with MiniMalloc's orders alone,
    # guillotine-15 ends 19% and skyline-10 0.1% above it). The node limit makes the run the
    # same on any machine.
    problem = instance(kind, seed, aligned=True)
    solution = solve(problem, time_limit=120.0, node_limit=20_000)
    solution.validate()
    assert solution.arena_size == MIB
    assert solution.status == "optimal"


def test_decision_runs_take_the_alignment_as_a_key() -> None:
    # Three buffers of 8 bytes live together, aligned to 1, 16 and 4. By rank alone the first
    # takes offset 0 and the 16-aligned one goes up to 16; led by `G`, the largest alignment
    # comes first at offset 0, then the next largest at 8.
    inst = _together([8, 8, 8], [1, 16, 4])
    verdict, offsets, _ = inst.decide("", [1] * 3, [0, 1, 2], U64_MAX, 10_000, 10.0)
    assert (verdict, offsets) == ("found", [0, 16, 8])
    verdict, offsets, _ = inst.decide("G", [1] * 3, [0, 1, 2], U64_MAX, 10_000, 10.0)
    assert (verdict, offsets) == ("found", [16, 0, 8])
    with pytest.raises(npumem.InvalidArgumentError, match="unknown order key 'Q'"):
        inst.decide("Q", [1] * 3, [0, 1, 2], U64_MAX, 10_000, 10.0)


U64_MAX = (1 << 64) - 1
MAX_SPAN = (1 << 63) - 1


def _together(sizes: list[int], alignments: list[int]) -> PackingInstance:
    """Buffers all live at the same time, in one section."""
    n = len(sizes)
    neighbors = [[j for j in range(n) if j != i] for i in range(n)]
    return PackingInstance(sizes, alignments, [0] * n, [1] * n, 1, neighbors, [[]] * n)


@pytest.mark.parametrize(
    ("sizes", "alignments", "message"),
    [
        ([U64_MAX - 5, 8], [1, 1 << 63], "size 18446744073709551610 is more than"),
        ([1 << 63, 8], [1, 1], "size 9223372036854775808 is more than"),
        ([1 << 62, 1 << 62], [1, 1], "add up to 9223372036854775808 bytes"),  # one too many
    ],
)
def test_an_instance_that_no_packing_within_the_span_can_hold_is_refused(
    sizes: list[int], alignments: list[int], message: str
) -> None:
    with pytest.raises(npumem.InvalidArgumentError, match=r"2\^63 - 1") as e:
        _together(sizes, alignments)
    assert message in str(e.value)


def test_an_instance_whose_padding_passes_the_span_is_searched() -> None:
    # Sizes and padding add up beyond 2^63 - 1, yet 0 and 2^62 hold two bytes aligned to 2^62;
    # two aligned to 2^63 have no second place below it.
    inst = _together([1, 1], [1 << 62, 1 << 62])
    exhausted, offsets, arena, _ = inst.search([0, 1], U64_MAX, 0, 10_000, 10.0)
    assert exhausted and arena == (1 << 62) + 1
    assert offsets is not None and sorted(offsets) == [0, 1 << 62]
    inst = _together([8, 8], [1 << 63, 1 << 63])
    exhausted, offsets, _, _ = inst.search([0, 1], U64_MAX, 0, 10_000, 10.0)
    assert exhausted and offsets is None
    verdict, _, _ = inst.decide("WAT", [1, 1], [0, 1], U64_MAX, 10_000, 10.0)
    assert verdict == "exhausted"


def test_an_obstacle_past_the_span_is_refused() -> None:
    with pytest.raises(npumem.InvalidArgumentError, match="obstacle ends at"):
        PackingInstance([8], [1], [0], [1], 1, [[]], [[(0, MAX_SPAN + 1)]])
    # One that ends at the span leaves no room above it.
    inst = PackingInstance([8], [1], [0], [1], 1, [[]], [[(0, MAX_SPAN)]])
    exhausted, offsets, _, _ = inst.search([0], U64_MAX, 0, 10_000, 10.0)
    assert exhausted and offsets is None


def test_a_packing_at_the_span_bound_never_claims_to_fit_below_its_sum() -> None:
    third = MAX_SPAN // 3
    inst = _together([third] * 3, [1] * 3)
    exhausted, offsets, arena, _ = inst.search([0, 1, 2], U64_MAX, 0, 10_000, 10.0)
    assert exhausted and arena == 3 * third
    assert offsets is not None and sorted(offsets) == [0, third, 2 * third]
    verdict, offsets, _ = inst.decide("WAT", [1] * 3, [0, 1, 2], U64_MAX, 10_000, 10.0)
    assert verdict == "found" and offsets is not None and max(offsets) == 2 * third
    verdict, _, _ = inst.decide("WAT", [1] * 3, [0, 1, 2], 3 * third - 1, 10_000, 10.0)
    assert verdict == "exhausted"


def test_an_order_that_names_a_buffer_twice_is_refused() -> None:
    from npumem._core import PlanTimeline

    timeline = PlanTimeline([0, 0], [2, 2], [8, 8], [1, 1], [None, None])
    assert timeline.place_in_order([1, 0], best_fit=True) == [8, 0]
    assert timeline.place_in_order([0], best_fit=True) == [0, -1], (
        "an unnamed buffer stays unplaced"
    )
    with pytest.raises(npumem.InvalidArgumentError, match="names buffer 0 twice"):
        timeline.place_in_order([0, 0], best_fit=True)
    with pytest.raises(npumem.InvalidArgumentError, match="buffer 2 of 2"):
        timeline.place_in_order([0, 2], best_fit=True)
