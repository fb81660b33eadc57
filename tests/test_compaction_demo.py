"""The demo with a real compactor: the compactions it reports are the compactor's own,
and the pool stays consistent."""

from __future__ import annotations

import npumem
from npumem.compaction import Compactor
from npumem.workloads import run_demo

MIB = 1 << 20


def test_the_demo_counts_the_compactors_own_compactions() -> None:
    made: list[Compactor] = []

    def factory(pool: npumem.Pool) -> Compactor:
        made.append(Compactor(pool).attach())
        return made[-1]

    # A tight arena: allocations fail, the compactor is called (by the pool and by the demo).
    result = run_demo(requests=30, workers=1, capacity=190 * MIB, compactor=factory)
    assert len(made) == 1 and made[0].attached
    assert result.compactor and result.compactions == made[0].compactions > 0
    assert result.requests_served + result.rejected == 30
    assert result.checked_blocks >= 0  # check() passed at the end of the run
