"""What an allocation that runs out of memory reports, and when it counts as failed: a failed
batch's figures describe the pool as its failing item found it (before the batch was rolled
back); an allocation that the out-of-memory handler rescues is never counted nor traced as
failed, not even while the handler runs; a pool that grows refuses a request larger than any
region it can ever have; and `RequestTooLargeError` carries the figures of an
`OutOfMemoryError`."""

from __future__ import annotations

import threading
import time

import pytest

import npumem
from npumem.kv import KVCache
from npumem.monitor import Monitor, Thresholds, TraceRecorder

MIB = 1 << 20


def test_a_failed_batch_reports_the_pool_as_its_failing_item_found_it() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    with pytest.raises(npumem.OutOfMemoryError) as info:
        pool.alloc_many([3 * MIB] * 3)
    err = info.value
    text = str(err)
    assert err.requested == 3 * MIB
    assert err.largest_free_block is not None and err.largest_free_block < err.requested, text
    assert err.bytes_free is not None and err.bytes_free < err.requested, text
    assert "item 2 of the batch failed" in text
    assert "asks for 9.0 MiB" in text and "8.0 MiB" in text and "does not fit" in text, text
    assert "fragmented" not in text and "compaction" not in text, text
    s = pool.stats()
    assert (s.blocks_in_use, s.bytes_free, s.failed_allocs) == (0, 8 * MIB, 1), (
        "rolled back, one failure"
    )


def test_a_failed_batch_in_a_pool_that_grows_reports_the_room_it_had() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, max_capacity=32 * MIB, grow_by=8 * MIB)
    with pytest.raises(npumem.OutOfMemoryError) as info:
        pool.alloc_many([6 * MIB] * 6)
    err = info.value
    text = str(err)
    assert err.largest_free_block is not None and err.requested is not None
    assert err.largest_free_block < err.requested, text
    assert "asks for 36.0 MiB" in text and "fragmented" not in text, text
    assert pool.regions() == [(0, 8 * MIB)], "the regions the batch added went back"
    pool.check()


def test_a_batch_that_fits_as_a_whole_but_not_in_the_holes_blames_fragmentation() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, run_tails=False)
    chunks = [pool.alloc(2 * MIB) for _ in range(4)]
    chunks[0].free()
    chunks[2].free()
    with pytest.raises(npumem.OutOfMemoryError) as info:
        pool.alloc_many([MIB, 3 * MIB])
    assert info.value.bytes_free == 3 * MIB  # the first item held 1 MiB of the 4 free
    assert "fragmented" in str(info.value) and "does not fit" not in str(info.value)


def full_pool() -> tuple[npumem.Pool, list[npumem.Block]]:
    pool = npumem.Pool(16 * MIB, cores=1)
    return pool, [pool.alloc(12 * MIB)]


def test_an_error_whose_largest_free_block_holds_the_request_says_why() -> None:
    # The short last chunk (1 KiB) after a block with a front that ends in the tail of chunk 4
    # leaves 2 MiB - 1 KiB free from 8 MiB + 1 KiB on: from the bank boundary at 8 MiB + 4 KiB,
    # a block across the chunk's end holds 2,045 KiB, which the figures name; a request of 1 KiB
    # less would end inside the chunk, where a run of a whole chunk is its layout.
    pool = npumem.Pool(
        10 * MIB + 1024, cores=1, chunk_size=2 * MIB, min_block=1024, bank_size=4096, backing="none"
    )
    kept = [pool.alloc(n) for n in (3 * MIB // 2, MIB, 5 * MIB + 1)]
    asked = 2045 * 1024 - 1025
    with pytest.raises(npumem.OutOfMemoryError) as info:
        pool.alloc(asked)
    err = info.value
    text = str(err)
    assert err.largest_free_block == 2045 * 1024 == pool.stats().largest_free_block, text
    assert "fragmented" not in text, text
    assert (
        "no free place holds a block of this size" in text and "2.0 MiB (2094080 bytes)" in text
    ), text
    pool.alloc(err.largest_free_block).free()
    for block in kept:
        block.free()
    pool.check()


def test_a_rescued_allocation_is_never_counted_or_traced_as_failed() -> None:
    pool, hog = full_pool()
    mon = Monitor(pool, thresholds=Thresholds(usage=0.99, fragmentation=0.99))
    mon.sample()
    seen: list[int] = []

    def handler(nbytes: int) -> bool:
        seen.append(pool.stats().failed_allocs)
        mon.sample()  # another reader, while the allocation is being rescued
        hog.pop().free()
        return True

    pool.set_oom_handler(handler)
    with TraceRecorder(pool) as rec:
        block = pool.alloc(8 * MIB)
    mon.sample()
    assert seen == [0]
    assert pool.stats().failed_allocs == 0
    assert [e.kind for e in rec.trace.events] == ["free", "alloc"]
    assert [a.kind for a in mon.alerts] == []
    assert [s.failed_allocs for s in mon.history] == [0, 0, 0]
    block.free()


def test_a_rescued_batch_is_never_counted_and_a_declined_one_once() -> None:
    pool, hog = full_pool()
    seen: list[int] = []

    def handler(nbytes: int) -> bool:
        seen.append(pool.stats().failed_allocs)
        if not hog:
            return False
        hog.pop().free()
        return True

    pool.set_oom_handler(handler)
    with TraceRecorder(pool) as rec:
        blocks = pool.alloc_many([4 * MIB, 4 * MIB])
        with pytest.raises(npumem.OutOfMemoryError):
            pool.alloc_many([4 * MIB, 12 * MIB])  # declined: fails for good
    assert seen == [0, 0]
    assert pool.stats().failed_allocs == 1
    failed = [(e.kind, e.size) for e in rec.trace.events if e.kind == "failed"]
    assert failed == [("failed", 12 * MIB)], "the item that found no room, traced once"
    for b in blocks:
        b.free()


def test_a_handler_that_raises_counts_one_failure() -> None:
    pool, _ = full_pool()

    def handler(nbytes: int) -> bool:
        assert pool.stats().failed_allocs == 0
        raise RuntimeError("no remedy")

    pool.set_oom_handler(handler)
    with TraceRecorder(pool) as rec, pytest.raises(npumem.OutOfMemoryError) as info:
        pool.alloc(8 * MIB)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert pool.stats().failed_allocs == 1
    assert [e.kind for e in rec.trace.events] == ["failed"]


def test_a_kv_cache_page_rescued_by_the_handler_is_not_counted() -> None:
    pool = npumem.Pool(4 * MIB, cores=1)
    hog = [pool.alloc(4 * MIB)]
    seen: list[int] = []

    def handler(nbytes: int) -> bool:
        seen.append(pool.stats().failed_allocs)
        hog.pop().free()
        return True

    pool.set_oom_handler(handler)
    kv = KVCache(pool, num_layers=1, num_kv_heads=1, head_dim=64, page_tokens=16)
    kv.add_sequence(1, 16)
    assert seen == [0]
    assert pool.stats().failed_allocs == 0
    kv.close()


def test_a_pool_that_grows_refuses_a_request_larger_than_its_largest_region() -> None:
    # 2 chunks present, 32 at most, the first region never given back and regions a chunk
    # apart: no region, so no block, can hold more than 30 chunks.
    pool = npumem.Pool(4 * MIB, max_capacity=64 * MIB, cores=1)
    for size in (64 * MIB, 61 * MIB):
        with pytest.raises(npumem.RequestTooLargeError) as info:
            pool.alloc(size)
        text = str(info.value)
        assert "60.0 MiB" in text and "first region" in text, text
        assert info.value.requested == size
    with pytest.raises(npumem.RequestTooLargeError, match=r"sizes\[1\]"):
        pool.alloc_many([MIB, 61 * MIB])
    s = pool.stats()
    assert (s.grow_events, s.failed_allocs) == (0, 3)
    block = pool.alloc(60 * MIB)
    assert pool.regions() == [(0, 4 * MIB), (6 * MIB, 60 * MIB)]
    block.free()


def test_request_too_large_carries_the_figures_of_an_out_of_memory_error() -> None:
    pool = npumem.Pool(64 * MIB, cores=1)
    pool.alloc(8 * MIB)
    s = pool.stats()
    for size in (1 << 30, 1 << 70):
        with pytest.raises(npumem.OutOfMemoryError) as info:
            pool.alloc(size)
        err = info.value
        assert isinstance(err, npumem.RequestTooLargeError)
        assert err.requested == size
        assert err.bytes_free == s.bytes_free
        assert (
            err.largest_free_block is not None
            and 0 < err.largest_free_block <= s.largest_free_block
        )


def _fill(
    pool: npumem.Pool, sizes: list[int]
) -> tuple[list[npumem.Block], npumem.OutOfMemoryError]:
    """Allocate `sizes` in turn (cycling) until one fails; the blocks and the error."""
    live: list[npumem.Block] = []
    i = 0
    while True:
        try:
            live.append(pool.alloc(sizes[i % len(sizes)]))
        except npumem.OutOfMemoryError as err:
            return live, err
        i += 1


@pytest.mark.parametrize(
    ("capacity", "sizes"),
    [
        (2 * MIB, [500_000]),
        (256 * MIB, [1_500_000]),
        (64 * MIB, [700_000, 90_000]),
        (64 * MIB, [3 * MIB + 5, 65_537]),
        ((2 * MIB) + 300_000, [2 * MIB + 299_000]),
        (97 * MIB + 777, [1_048_577, 4_097, 300_001]),
    ],
)
def test_a_request_of_the_largest_free_block_reported_succeeds(
    capacity: int, sizes: list[int]
) -> None:
    # The figure counts each free place as the largest request whose layout it holds: the
    # statistics' and the error's both succeed, and the statistics' is exact: a request of one
    # byte more fails (no slab holds objects here, whose free objects could take it).
    pool = npumem.Pool(capacity, cores=1, backing="none")
    live, err = _fill(pool, sizes)
    reported = [pool.stats().largest_free_block, err.largest_free_block]
    for size in reported:
        assert size is not None
        if size > 0:
            pool.alloc(size).free()
    largest = pool.stats().largest_free_block
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(largest + 1)
    assert pool.stats().blocks_in_use == len(live)
    pool.check()


@pytest.mark.parametrize("cores", [1, 2, 3])
@pytest.mark.parametrize("short", [0, 256 * 1024])
def test_a_front_before_the_free_chunks_at_the_arena_end_counts(cores: int, short: int) -> None:
    # An 8 KiB block at the start of the first of two chunks (and a short third one): one
    # block with a front takes every byte after it to the arena's end, and the largest free
    # block says so, exactly.
    pool = npumem.Pool(4 * MIB + short, cores=cores, backing="none")
    small = pool.alloc(8192)
    assert small.offset == 0
    largest = pool.stats().largest_free_block
    assert largest == 4 * MIB + short - 8192
    block = pool.alloc(largest)
    assert block.offset == 8192
    block.free()
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(largest + 1)
    small.free()
    pool.check()


def test_an_empty_pool_with_a_short_last_chunk_serves_its_whole_usable_capacity() -> None:
    # 2 MiB + 300,000 B: the last chunk is short, and a request of every usable byte (a chunk
    # and a rest the last chunk holds in bytes but not cut to a tail's granule) takes both
    # chunks whole.
    pool = npumem.Pool(2 * MIB + 300_000, cores=1)
    usable = pool.stats().usable_capacity
    assert pool.stats().largest_free_block == usable
    for size in (usable, usable - 256, usable - 4096):
        block = pool.alloc(size)
        assert block.block_bytes >= size
        block.free()
    pool.check()


@pytest.mark.parametrize("case", ["refused as too large", "given up by the handler"])
def test_a_failure_recorded_during_another_threads_pause_lets_that_thread_run(case: str) -> None:
    """The record of a failed allocation waits for another thread's pause (it writes a trace
    event, and the rings change only under a pause) without the GIL, so the pausing thread's
    Python code runs on and ends its pause: the failure is raised after the pause, not after
    the pause's timeout with the pausing thread stalled."""
    pool = npumem.Pool(4 * MIB, cores=1)
    rec = TraceRecorder(pool)
    rec.start()
    hog = pool.alloc(3 * MIB)
    paused = threading.Event()
    steps: list[float] = []

    def hold() -> None:
        with pool.pause(timeout=2.0):
            paused.set()
            for _ in range(50):
                steps.append(time.monotonic())
                time.sleep(0.001)

    holder = threading.Thread(target=hold)
    if case == "refused as too large":
        holder.start()
        paused.wait()
        error: type[npumem.OutOfMemoryError] = npumem.RequestTooLargeError
        size = 8 * MIB
    else:

        def give_up(nbytes: int) -> bool:
            holder.start()
            paused.wait()
            return False

        pool.set_oom_handler(give_up)
        error, size = npumem.OutOfMemoryError, 2 * MIB
    with pytest.raises(error):
        pool.alloc(size)
    raised = time.monotonic()
    holder.join()
    assert len(steps) == 50 and steps[-1] < raised, "the pausing thread stalled"
    assert pool.stats().failed_allocs == 1
    trace = rec.stop()
    assert [(e.kind, e.size) for e in trace.events if e.kind == "failed"] == [("failed", size)]
    hog.free()
    pool.check()
