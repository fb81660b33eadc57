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


class InterruptedCopyBack:
    """Fails the batch's last call (after copying its transfers), then raises `interrupt` at
    the first `interrupts` copies back before copying, as Ctrl-C landing in the mover would."""

    def __init__(self, mirror: HostMirror, interrupts: int, interrupt: BaseException) -> None:
        self.mirror, self.interrupts, self.interrupt = mirror, interrupts, interrupt
        self.calls: list[Sequence[tuple[int, int, int]]] = []
        self.failed = False

    def __call__(self, transfers: Sequence[tuple[int, int, int]]) -> None:
        self.calls.append(list(transfers))
        if self.failed and self.interrupts > 0:
            self.interrupts -= 1
            raise self.interrupt
        self.mirror(transfers)
        if not self.failed and len(self.calls) == 2:  # the second wave
            self.failed = True
            raise DeviceFault("the second wave failed")


def test_an_interrupted_copy_back_is_tried_again_and_the_interrupt_goes_on() -> None:
    """Ctrl-C in the mover while it copies back: the copy back is tried again, every byte comes
    back, and the `KeyboardInterrupt` propagates with the mover's first failure as its
    context."""
    pool, mirror, kept = setup("none")
    mover = InterruptedCopyBack(mirror, 2, KeyboardInterrupt())
    with pool.pause(5.0) as pause, pytest.raises(KeyboardInterrupt) as raised:
        pool.compact_step(pause, "full", mover=mover)
    assert isinstance(raised.value.__context__, DeviceFault)
    assert len(mover.calls) == 5  # two waves, then one copy back tried three times
    pool.check()
    assert all_intact(kept, mirror, False)


def test_a_copy_back_that_keeps_failing_raises_corruption_even_in_a_rescue() -> None:
    """A mover that fails its copies back every time loses bytes: `CorruptionError`, also when
    the compaction ran in an out-of-memory handler (never the `__cause__` of an
    `OutOfMemoryError`)."""
    pool, mirror, _kept = setup("none")  # the blocks stay live
    mover = InterruptedCopyBack(mirror, 10, DeviceFault("copy back failed"))
    before = [(b.offset, b.nbytes) for b in pool.blocks()]
    with pool.pause(5.0) as pause, pytest.raises(npumem.CorruptionError, match="3 times") as info:
        pool.compact_step(pause, "full", mover=mover)
    # The metadata was undone: the error blames the device's bytes, not the metadata, and
    # carries the mover's failure as its cause.
    assert "inconsistent" not in str(info.value) and "lost bytes on the device" in str(info.value)
    assert isinstance(info.value.__cause__, DeviceFault)
    assert str(info.value.__cause__) == "the second wave failed"
    assert [(b.offset, b.nbytes) for b in pool.blocks()] == before
    pool.check()
    pool, mirror, _kept = setup("none")
    rescuer = InterruptedCopyBack(mirror, 10, DeviceFault("copy back failed"))

    def rescue(nbytes: int) -> bool:
        with pool.pause(5.0) as pause:
            pool.compact_step(pause, "full", mover=rescuer)
        return True

    pool.set_oom_handler(rescue)
    with pytest.raises(npumem.CorruptionError, match="3 times"):
        pool.alloc(pool.stats().largest_free_block + 1)
    pool.check()
