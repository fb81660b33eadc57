"""Mover faults at every prefix: the mover really copies ``k`` of a compaction's transfers into
its mirror and then raises, for every ``k``, in full and incremental modes, on device pools
(``backing="none"``) and host pools (whose mover keeps a mirror in step). Afterwards every live
block's bytes are where its handle says, and the same compaction then goes through."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import npumem
from compaction_helpers import MIB, fill, fragmented, intact
from npumem.compaction import HostMirror


class DeviceFault(Exception):
    pass


class FailsOnceAt:
    """Copies ``budget`` transfers into the mirror, then raises once (a transient fault: the
    pool's copies back go through)."""

    def __init__(self, mirror: HostMirror, budget: int) -> None:
        self.mirror, self.budget, self.done, self.failed = mirror, budget, 0, False

    def __call__(self, transfers: Sequence[tuple[int, int, int]]) -> None:
        for t in transfers:
            if self.done == self.budget and not self.failed:
                self.failed = True
                raise DeviceFault(f"fault after {self.done} transfers")
            self.mirror([t])
            self.done += 1


def setup(backing: str) -> tuple[npumem.Pool, HostMirror, list[tuple[npumem.Block, int]]]:
    pool = npumem.Pool(24 * MIB, cores=1, backing=backing)
    mirror = HostMirror(pool.capacity)
    kept = fragmented(pool, 3, mirror=mirror)
    if backing == "host":
        for blk, ident in kept:
            fill(blk, ident)
    return pool, mirror, kept


def all_intact(kept: list[tuple[npumem.Block, int]], mirror: HostMirror, host: bool) -> bool:
    return all(intact(b, i, mirror) and (not host or intact(b, i)) for b, i in kept)


@pytest.mark.parametrize("backing", ["none", "host"])
@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_a_mover_failing_at_every_prefix_loses_no_byte(backing: str, mode: str) -> None:
    max_bytes = 4 * MIB if mode == "incremental" else None
    budget = 0
    while True:
        pool, mirror, kept = setup(backing)
        mover = FailsOnceAt(mirror, budget)
        with pool.pause(5.0) as pause:
            try:
                pool.compact_step(pause, mode, max_bytes=max_bytes, mover=mover)
                finished = True
            except DeviceFault:
                finished = False
        pool.check()
        assert all_intact(kept, mirror, backing == "host"), f"{backing} {mode}: fault at {budget}"
        if finished:
            assert budget > 0, "the pool needs moves for this test"
            break
        with pool.pause(5.0) as pause:
            pool.compact_step(pause, mode, max_bytes=max_bytes, mover=mirror)
        assert all_intact(kept, mirror, backing == "host")
        budget += 1
