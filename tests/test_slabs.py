"""Slab caches: small blocks, per-class statistics, remote frees, reclamation, and the batch
API (all or nothing)."""

from __future__ import annotations

import os
import threading

import pytest

import npumem
from helpers import (
    assert_block_rules,
    assert_unchanged,
    assert_unchanged_but_one_failure,
    state_of,
)

KIB, MIB = 1 << 10, 1 << 20
CLASSES = (64, 128, 256, 512, 1024, 2048, 4096)


def classes(pool: npumem.Pool) -> dict[int, npumem.SizeClassStats]:
    return {c.size: c for c in pool.stats().size_classes}


def test_small_requests_go_to_the_next_class_up_and_waste_is_counted() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blocks = [pool.alloc(n) for n in (1, 64, 65, 100, 128, 129, 4000, 4096)]
    assert [b.block_bytes for b in blocks] == [64, 64, 128, 128, 128, 192, 4096, 4096]
    for b in blocks:
        assert_block_rules(pool, b)
    by_size = classes(pool)
    assert by_size[64].blocks_in_use == 2 and by_size[128].blocks_in_use == 3
    assert by_size[64].waste_bytes == 63 and by_size[128].waste_bytes == (128 - 65) + (128 - 100)
    assert by_size[4096].waste_bytes == 96
    s = pool.stats()
    assert s.slab_allocs == 8 and s.core_allocs == 0 and s.global_allocs == 0
    assert s.bytes_in_use == sum(b.block_bytes for b in blocks)
    assert s.requested_bytes_in_use == sum(b.nbytes for b in blocks)
    big = pool.alloc(8 * KIB)
    huge = pool.alloc(3 * MIB)
    s = pool.stats()
    assert (s.slab_allocs, s.core_allocs, s.global_allocs) == (8, 1, 1)
    for b in [*blocks, big, huge]:
        b.free()
    assert pool.check() == 0
    assert all(c.blocks_in_use == 0 and c.waste_bytes == 0 for c in pool.stats().size_classes)


def test_objects_never_straddle_banks_and_honour_alignment_in_odd_classes() -> None:
    pool = npumem.Pool(16 * MIB, cores=1, alignment=8, slab_sizes=(24, 96, 200, 1000, 3000))
    held = []
    for size in (1, 24, 25, 96, 150, 200, 999, 1000, 2999):
        for align in (None, 8, 16, 32, 64):
            for _ in range(70):  # more than a slab's worth
                blk = pool.alloc(size, align=align)
                assert_block_rules(pool, blk, align)
                held.append(blk)
    pool.check()
    for blk in held:
        blk.free()
    pool.check()


def test_a_slab_emptied_by_remote_frees_goes_back_to_the_buddy_pool() -> None:
    pool = npumem.Pool(64 * MIB, cores=1)
    blocks = [pool.alloc(1000) for _ in range(500)]  # 1024-byte class: several slabs
    slabs_full = classes(pool)[1024].slabs
    assert slabs_full >= 8

    def consumer() -> None:
        for blk in blocks:
            blk.free()

    t = threading.Thread(target=consumer)
    t.start()
    t.join()
    c = classes(pool)[1024]
    assert c.blocks_in_use == 0
    assert c.slabs <= 1, "all but the owner's current slab went back"
    assert pool.stats().bytes_in_use == 0
    assert pool.check() == 0


def _run_on_cpu(cpu: int, work: object) -> None:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            os.sched_setaffinity(0, {cpu})
            work()  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if errors:
        raise errors[0]


def test_a_large_allocation_reclaims_memory_cached_in_another_cores_slabs() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    pool = npumem.Pool(2 * MIB, cores=len(cpus), chunk_size=2 * MIB)

    def fill_and_free_every_class() -> None:
        blocks = [pool.alloc(size) for size in CLASSES for _ in range(3)]
        for blk in blocks:
            blk.free()

    _run_on_cpu(cpus[-1], fill_and_free_every_class)
    cached = sum(c.slabs for c in pool.stats().size_classes)
    assert cached == len(CLASSES), "each class keeps its current slab as reserve"
    s = pool.stats()
    assert s.bytes_in_use == 0 and s.largest_free_block == 2 * MIB, "cached slabs count as free"
    got: list[npumem.Block] = []
    _run_on_cpu(cpus[0], lambda: got.append(pool.alloc(2 * MIB)))
    assert got[0].offset == 0
    assert sum(c.slabs for c in pool.stats().size_classes) == 0
    pool.check()


def test_alloc_many_returns_blocks_in_order() -> None:
    pool = npumem.Pool(16 * MIB, cores=2)
    sizes = [1, 100, 5000, 64, 3 * MIB, 4096]
    blocks = pool.alloc_many(sizes, tag="batch")
    assert [b.nbytes for b in blocks] == sizes
    assert all(b.tag == "batch" and b.alive for b in blocks)
    assert len({b.offset for b in blocks}) == len(blocks)
    pool.free_many(blocks)
    assert not any(b.alive for b in blocks)
    assert pool.check() == 0
    assert pool.alloc_many([]) == []
    import numpy as np

    more = pool.alloc_many(np.array([64, 128], dtype=np.int64), align=256)
    assert all(b.offset % 256 == 0 for b in more)


def test_alloc_many_is_all_or_nothing() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    keep = pool.alloc(100)
    before = state_of(pool)
    with pytest.raises(npumem.OutOfMemoryError, match="item 3 of the batch failed") as err:
        pool.alloc_many([100, 2 * MIB, 200, 7 * MIB, 300])
    assert err.value.requested == 7 * MIB
    after = pool.stats().as_dict()
    assert after["failed_allocs"] == 1
    assert after["bytes_in_use"] == before["stats"]["bytes_in_use"], "nothing was kept"
    assert pool.blocks() == before["blocks"]
    pool.check()
    assert keep.alive


BAD_BATCHES = [
    ([1, 0, 3], npumem.InvalidArgumentError, r"sizes\[1\] must be greater than 0"),
    ([1, 2.5], npumem.ArgumentTypeError, r"sizes\[1\] must be an int, got float"),
    ([64, 1 << 40], npumem.RequestTooLargeError, r"sizes\[1\]"),
    (5, npumem.ArgumentTypeError, "sizes must be an iterable of ints, got int"),
]


@pytest.mark.parametrize(("sizes", "error", "message"), BAD_BATCHES)
def test_alloc_many_misuse_changes_nothing(
    sizes: object, error: type[Exception], message: str
) -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    pool.alloc(10)
    before = state_of(pool)
    with pytest.raises(error, match=message):
        pool.alloc_many(sizes)  # type: ignore[arg-type]
    if error is npumem.RequestTooLargeError:  # also a failed allocation, counted as one
        assert_unchanged_but_one_failure(pool, before)
    else:
        assert_unchanged(pool, before)


def test_free_many_checks_every_block_before_freeing_any() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    other = npumem.Pool(1 * MIB, cores=1)
    a, b, c = pool.alloc_many([10, 20, 30])
    freed = pool.alloc(40)
    freed.free()
    foreign = other.alloc(10)
    view_holder = pool.alloc(50)
    view = memoryview(view_holder)
    cases = [
        ([a, b, freed], npumem.DoubleFreeError, "item 2 of the batch"),
        ([a, b, a], npumem.DoubleFreeError, r"names one block twice \(items 0 and 2\)"),
        ([a, foreign], npumem.InvalidHandleError, "item 1 of the batch belongs to another pool"),
        ([a, view_holder], npumem.PinnedBlockError, "item 1 of the batch"),
        ([a, "x"], npumem.ArgumentTypeError, r"blocks\[1\] must be an npumem.Block"),
        (7, npumem.ArgumentTypeError, "blocks must be an iterable"),
    ]
    for blocks, error, message in cases:
        before = state_of(pool)
        with pytest.raises(error, match=message):
            pool.free_many(blocks)  # type: ignore[arg-type]
        assert_unchanged(pool, before)
        assert a.alive and b.alive and c.alive
    view.release()
    pool.free_many([a, b, c, view_holder])
    assert pool.check() == 0
