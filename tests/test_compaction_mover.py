"""A mover that raises halfway through a batch: the batch is undone, the pool and every handle
are exactly as before, and the caller sees the mover's own exception."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest

import npumem
from compaction_helpers import MIB, fragmented, intact
from helpers import assert_unchanged, state_of
from npumem._core import StepReport
from npumem.compaction import Compactor, HostMirror

CHUNK = 2 * MIB
T = TypeVar("T")


class DeviceLost(Exception):
    pass


class HalfwayMover:
    """Copies the first half of a batch into the mirror, then raises."""

    def __init__(self, mirror: HostMirror) -> None:
        self.mirror = mirror
        self.seen = 0

    def __call__(self, transfers: Sequence[tuple[int, int, int]]) -> None:
        self.seen += len(transfers)
        self.mirror(list(transfers)[: len(transfers) // 2])
        raise DeviceLost("the copy engine stopped halfway")


def crosses_a_chunk_end(offset: int, nbytes: int) -> bool:
    within = offset % CHUNK
    return within != 0 and within + nbytes > CHUNK


def device_pool() -> tuple[npumem.Pool, HostMirror, list[tuple[npumem.Block, int]]]:
    pool = npumem.Pool(40 * MIB, cores=2, backing="none")
    mirror = HostMirror(pool.capacity)
    return pool, mirror, fragmented(pool, 6, mirror=mirror)


def test_a_failing_mover_in_move_blocks_leaves_everything_as_it_was() -> None:
    pool, mirror, kept = device_pool()
    before = state_of(pool)
    offsets = {blk.handle: blk.offset for blk, _ in kept}
    candidates = [blk for blk, _ in kept if 4096 < blk.nbytes <= 300_000]
    with pool.pause() as pause:
        spare = [pool.alloc(b.nbytes) for b in candidates]  # free places of the right shapes ...
        # ... of the same kind: a block that crosses a chunk's end (a front) moves only to
        # another such place, and one that does not only to a place inside one chunk.
        pairs = [
            (b, s.offset)
            for b, s in zip(candidates, spare, strict=True)
            if crosses_a_chunk_end(b.offset, b.nbytes) == crosses_a_chunk_end(s.offset, s.nbytes)
        ]
        assert len(pairs) >= 4, "the scenario offers blocks to move"
        movable = [b for b, _ in pairs]
        targets = [t for _, t in pairs]
        for s in spare:
            s.free()  # ... given back, so the moves can take them
        before = state_of(pool)
        mover = HalfwayMover(HostMirror(pool.capacity))
        with pytest.raises(DeviceLost, match="halfway"):
            pool.move_blocks(pause, list(zip(movable, targets, strict=True)), mover=mover)
        assert mover.seen == len(movable), "the mover got the whole batch"
        assert_unchanged(pool, before)
    assert {blk.handle: blk.offset for blk, _ in kept} == offsets
    for blk, ident in kept:
        assert intact(blk, ident, mirror)
    # The same batch with a mover that works goes through.
    with pool.pause() as pause:
        pool.move_blocks(pause, list(zip(movable, targets, strict=True)), mover=mirror)
    assert [b.offset for b in movable] == targets
    for blk, ident in kept:
        assert intact(blk, ident, mirror)


def test_a_failing_mover_in_a_compaction_leaves_everything_as_it_was() -> None:
    pool, mirror, kept = device_pool()
    before = state_of(pool)
    broken = Compactor(pool, mover=HalfwayMover(HostMirror(pool.capacity)))
    with pytest.raises(DeviceLost):
        broken.compact("full")
    assert_unchanged(pool, before)
    with pool.pause(0.5) as pause:  # the failed compaction did not leave the pool paused
        assert pause.held
    with pytest.raises(DeviceLost):
        broken.compact("incremental", max_bytes=4 * MIB)
    assert_unchanged(pool, before)
    # A working mover compacts the same pool.
    report = Compactor(pool, mover=mirror).compact("full")
    assert report.blocks_moved > 0
    for blk, ident in kept:
        assert intact(blk, ident, mirror)
    pool.check()


def test_a_full_compaction_on_a_device_is_one_batch() -> None:
    # One batch (its waves are the mover's calls), so a mover failing at any point of it
    # undoes the whole compaction.
    pool, mirror, kept = device_pool()
    assert any(blk.nbytes <= 4096 for blk, _ in kept), "slab objects take part"
    before = {blk.handle: blk.offset for blk, _ in kept}
    calls: list[list[tuple[int, int, int]]] = []

    def counting(transfers: Sequence[tuple[int, int, int]]) -> None:
        calls.append(list(transfers))
        mirror(transfers)

    report = Compactor(pool, mover=counting).compact("full")
    assert report.blocks_moved > 0
    assert len(report.steps) == 1
    # The batch's copies cover every block that moved (a slab moved whole carries its objects
    # in one copy, a block may be copied in pieces: copies and blocks need not pair up).
    copied: list[list[int]] = []
    for start, end in sorted((dst, dst + n) for wave in calls for _, dst, n in wave):
        if copied and start <= copied[-1][1]:
            copied[-1][1] = max(copied[-1][1], end)
        else:
            copied.append([start, end])
    starts = [start for start, _ in copied]
    moved = [blk for blk, _ in kept if blk.offset != before[blk.handle]]
    assert moved
    for blk in moved:
        i = bisect.bisect_right(starts, blk.offset) - 1
        assert i >= 0 and copied[i][1] >= blk.offset + blk.nbytes, f"{blk} moved without a copy"
    for blk, ident in kept:
        assert intact(blk, ident, mirror)
    pool.check()


def read_during_a_compaction(
    pool: npumem.Pool, read: Callable[[], T]
) -> tuple[StepReport, list[T]]:
    """Compact `pool` fully while another thread calls `read` once the mover has started (the
    mover waits up to 0.5 s for the read to finish: a read that waits for the compaction
    cannot). Returns the compaction's report and what the read returned."""
    import threading

    moving, done = threading.Event(), threading.Event()
    seen: list[T] = []

    def mover(transfers: Sequence[tuple[int, int, int]]) -> None:
        moving.set()
        done.wait(0.5)

    def reader() -> None:
        moving.wait(10)
        seen.append(read())
        done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    with pool.pause(10.0) as pause:
        report = pool.compact_step(pause, "full", mover=mover)
    thread.join(10)
    return report, seen


def test_another_thread_reads_a_moving_blocks_figures_whole() -> None:
    """While the mover runs, another thread that reads the moving block's `block_bytes` (or
    `offset`) gets them as the move leaves them, never a mix of the old place and the new: a
    run with a tail read at its old place after its chunks went back held less than asked."""
    pool = npumem.Pool(64 * MIB, cores=1, backing="none")
    pad = [pool.alloc(CHUNK) for _ in range(4)]
    block = pool.alloc(3 * CHUNK + 1)
    for p in pad:
        p.free()
    report, seen = read_during_a_compaction(pool, lambda: (block.block_bytes, block.offset))
    assert report.blocks == 1
    assert seen == [(block.block_bytes, block.offset)]
    assert block.block_bytes >= block.nbytes
    block.free()
    pool.check()


def test_blocks_listed_during_another_threads_compaction_are_those_after_it() -> None:
    """`blocks()` lists the blocks at one moment: a thread that asks while another thread's
    compaction is moving them waits for it, and gets every block at its new place. Read during
    the moves, a block moved away from a place and another moved into it were both listed
    there."""
    pool = npumem.Pool(64 * MIB, cores=1, backing="none")
    pads = [pool.alloc(CHUNK) for _ in range(6)]
    movable = [pool.alloc(CHUNK) for _ in range(3)]
    for p in pads:
        p.free()
    before = [(d.offset, d.nbytes) for d in pool.blocks()]
    report, seen = read_during_a_compaction(
        pool, lambda: [(d.offset, d.nbytes) for d in pool.blocks()]
    )
    after = [(d.offset, d.nbytes) for d in pool.blocks()]
    assert report.blocks >= 1 and after != before
    assert seen == [after]
    for b in movable:
        b.free()
    pool.check()


@pytest.mark.parametrize(
    "touch",
    [lambda b: b.offset, lambda b: b.pin(), lambda b: memoryview(b)],
    ids=["offset", "pin", "memoryview"],
)
def test_another_thread_waits_for_a_moving_block_no_longer_than_the_pause(
    touch: Callable[[npumem.Block], object],
) -> None:
    """A thread that reads, pins or views a block while a mover moves it waits as an allocation
    waits for the pause the move runs under: at most the pause's timeout, then
    `PoolBusyError`, however long the mover takes (a mover waiting on such a thread would
    otherwise wait forever)."""
    pool = npumem.Pool(16 * MIB, cores=1)
    pad = pool.alloc(4 * MIB)
    blk = pool.alloc(40_000)
    pad.free()
    start = blk.offset
    outcome: list[object] = []

    def other() -> None:
        try:
            outcome.append(touch(blk))
        except npumem.PoolBusyError as err:
            outcome.append(err)

    def mover(transfers: Sequence[object]) -> None:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=5.0)

    with pool.pause(0.3) as pause:
        report = pool.compact_step(pause, "full", mover=mover)
    assert report.blocks == 1 and blk.offset != start
    assert len(outcome) == 1 and isinstance(outcome[0], npumem.PoolBusyError), outcome
    assert blk.pins == 0
    pool.check()


@pytest.mark.parametrize("collector_on", [True, False])
def test_the_cyclic_collector_is_off_while_a_mover_runs_and_as_it_was_after(
    collector_on: bool,
) -> None:
    # A mover's batches run under the pool's pause. A collection that the mover's calls
    # happened to trigger read every tracked object of the process inside the pause (457 ms
    # of a 516-830 ms pause with 400,000 live blocks); it now waits for the moves to end.
    import gc

    pool, mirror, kept = device_pool()
    seen: list[bool] = []

    def mover(transfers: Sequence[tuple[int, int, int]]) -> None:
        seen.append(gc.isenabled())
        mirror(transfers)

    was = gc.isenabled()
    if not collector_on:
        gc.disable()
    try:
        with pool.pause() as pause:
            report = pool.compact_step(pause, "full", mover=mover)
        assert report.blocks > 0 and seen and not any(seen)
        assert gc.isenabled() is collector_on, "the collector is as it was before"
        assert all(intact(blk, ident, mirror) for blk, ident in kept)
    finally:
        if was:
            gc.enable()


def test_the_collector_stays_off_until_the_last_of_two_compactions_with_movers_ends() -> None:
    # The collector is the process's: the first compaction to end turned it back on while
    # the other's mover still ran.
    import gc

    first, first_mirror, _ = device_pool()
    second, second_mirror, _ = device_pool()
    second_in, first_done = threading.Event(), threading.Event()
    seen: list[bool] = []

    def first_mover(transfers: Sequence[tuple[int, int, int]]) -> None:
        assert second_in.wait(10)
        first_mirror(transfers)

    def second_mover(transfers: Sequence[tuple[int, int, int]]) -> None:
        second_in.set()
        assert first_done.wait(10)
        seen.append(gc.isenabled())
        second_mirror(transfers)

    def compact(pool: npumem.Pool, mover: Callable[[Sequence[tuple[int, int, int]]], None]) -> None:
        with pool.pause() as pause:
            pool.compact_step(pause, "full", mover=mover)

    assert gc.isenabled()
    other = threading.Thread(target=compact, args=(second, second_mover))
    other.start()
    compact(first, first_mover)
    first_done.set()
    other.join(10)
    assert seen and not any(seen), "off while the second mover runs"
    assert gc.isenabled(), "on again once both ended"
