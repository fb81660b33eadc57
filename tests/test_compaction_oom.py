"""The failing allocation of the seed articles, harder: blocks of many sizes interleaved, every
other one freed, then a block larger than the largest hole but smaller than the free bytes.
Without a compactor it fails; with one attached (the on-failure policy) it succeeds, and every
other block keeps its bytes."""

from __future__ import annotations

import pytest

import npumem
from compaction_helpers import MIB, fragmented, intact
from npumem.compaction import Compactor, Policy


def seed_pool() -> tuple[npumem.Pool, list[tuple[npumem.Block, int]], int]:
    pool = npumem.Pool(40 * MIB, cores=2)
    kept = fragmented(pool, 6)
    s = pool.stats()
    want = s.largest_free_block + pool.chunk_size  # larger than the largest hole ...
    assert want < s.bytes_free  # ... but well within the free bytes
    return pool, kept, want


def test_without_a_compactor_the_allocation_fails() -> None:
    pool, _, want = seed_pool()
    with pytest.raises(npumem.OutOfMemoryError) as err:
        pool.alloc(want)
    assert pool.stats().failed_allocs == 1
    assert err.value.requested == want
    assert err.value.largest_free_block is not None and err.value.largest_free_block < want
    assert err.value.bytes_free is not None and err.value.bytes_free > want


def test_an_attached_compactor_makes_it_succeed_and_keeps_every_byte() -> None:
    pool, kept, want = seed_pool()
    compactor = Compactor(pool).attach()
    assert compactor.attached and pool.oom_handler is not None
    big = pool.alloc(want, tag="after compaction")
    assert big.nbytes == want
    assert compactor.compactions == 1
    assert compactor.reports[-1].reason.startswith("allocation of")
    assert pool.stats().failed_allocs == 0  # rescued: the allocation did not raise
    for blk, ident in kept:
        assert intact(blk, ident), f"block {ident} lost its bytes"
    pool.check()
    big.free()
    compactor.detach()
    assert pool.oom_handler is None and not compactor.attached


def test_alloc_many_retries_too_and_detach_restores_the_failure() -> None:
    pool, kept, want = seed_pool()
    with Compactor(pool) as compactor:  # attached inside the with block
        blocks = pool.alloc_many([want // 2, want // 2])
        assert compactor.compactions == 1
        assert pool.stats().failed_allocs == 0
    for b in blocks:
        b.free()
    # Fragment again: without the compactor the same request fails again.
    pool2, _, want2 = seed_pool()
    with pytest.raises(npumem.OutOfMemoryError):
        pool2.alloc(want2)
    for blk, ident in kept:
        assert intact(blk, ident)


def test_no_compaction_when_it_cannot_help_or_the_policy_says_no() -> None:
    pool, _, want = seed_pool()
    compactor = Compactor(pool).attach()
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(pool.stats().bytes_free + 1)  # more than is free: compacting is pointless
    assert compactor.compactions == 0
    compactor.detach()
    off = Compactor(pool, policy=Policy(on_failure=False)).attach()
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(want)
    assert off.compactions == 0
    # The interval: a second failure right after a compaction does not compact again.
    pool3, _, want3 = seed_pool()
    c3 = Compactor(pool3, policy=Policy(min_interval=3600)).attach()
    pool3.alloc(want3)
    assert c3.compactions == 1
    with pytest.raises(npumem.OutOfMemoryError):
        pool3.alloc(pool3.stats().largest_free_block + pool3.chunk_size)
    assert c3.compactions == 1


def test_a_handler_that_raises_propagates_and_one_that_allocates_does_not_recurse() -> None:
    pool, _, want = seed_pool()

    def broken(nbytes: int) -> bool:
        raise RuntimeError(f"handler failed for {nbytes}")

    pool.set_oom_handler(broken)
    with pytest.raises(RuntimeError, match="handler failed"):
        pool.alloc(want)
    calls: list[int] = []

    def greedy(nbytes: int) -> bool:
        calls.append(nbytes)
        with pytest.raises(npumem.OutOfMemoryError):
            pool.alloc(nbytes)  # inside the handler: no second handler call
        return False

    assert pool.set_oom_handler(greedy) is broken
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(want)
    assert calls == [want]
    with pytest.raises(npumem.ArgumentTypeError):
        pool.set_oom_handler(42)  # type: ignore[arg-type]
    pool.set_oom_handler(None)
    pool.check()
