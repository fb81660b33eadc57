"""The failing allocation of the seed articles, harder: blocks of many sizes interleaved, every
other one freed, then a block larger than the largest hole but smaller than the free bytes.
Without a compactor it fails; with one attached (the on-failure policy) it succeeds, and every
other block keeps its bytes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

import npumem
from compaction_helpers import MIB, fill, fragmented, intact
from npumem._core import oom_handler_may_wait, oom_request_sizes, oom_retry_may_grow
from npumem._fork_safe import ForkSafeRLock
from npumem.compaction import Compactor, Policy
from npumem.kv import KVCache


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


def test_a_batch_whose_items_fit_apart_after_a_compaction_is_rescued() -> None:
    # Blocks of 256 KiB fill the pool, one at 3/4 of it is pinned, every other one is freed:
    # no compaction joins the batch's total into one block (the pin splits the free space into
    # 12 and 4 MiB less what stays), but one packs the blocks so that each item fits apart.
    pool = npumem.Pool(16 * MIB, cores=1)
    made = [pool.alloc(256 * 1024) for _ in range(64)]
    pinned = next(b for b in made if b.offset == 12 * MIB)
    pinned.pin()
    kept = []
    for i, blk in enumerate(made):
        if i % 2 and blk is not pinned:
            blk.free()
        else:
            fill(blk, i)
            kept.append((blk, i))
    items = [7 * MIB // 2, 7 * MIB // 2]
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc_many(items)
    compactor = Compactor(pool).attach()
    assert compactor.plan("full").largest_free_after < sum(items)
    blocks = pool.alloc_many(items)
    assert [b.nbytes for b in blocks] == items
    assert compactor.compactions == 1
    assert compactor.reports[-1].reason.startswith("batch allocation of")
    assert pool.stats().failed_allocs == 1  # the try without the compactor
    for blk, ident in kept:
        assert intact(blk, ident), f"block {ident} lost its bytes"
    assert pinned.offset == 12 * MIB
    pool.check()


def pinned_every_fourth(budget: float | None = None) -> tuple[npumem.Pool, Compactor, list]:
    """A 16 MiB pool of 512 KiB blocks in 4 MiB chunks: every fourth pinned, so free space
    never joins past 1.5 MiB; of the others, the first three and every other one freed."""
    pool = npumem.Pool(16 * MIB, cores=1, chunk_size=4 * MIB)
    unit = 512 << 10
    blocks = [pool.alloc(unit) for _ in range(32)]
    assert [b.offset for b in blocks] == [i * unit for i in range(32)]
    kept = []
    for i, blk in enumerate(blocks):
        if i % 4 == 3:
            blk.pin()
            kept.append(blk)
        elif (i < 3 and budget is None) or i % 2 == 0:
            blk.free()
        else:
            kept.append(blk)
    return pool, Compactor(pool, pause_budget=budget).attach(), kept


def test_a_batch_is_rescued_when_a_compaction_lets_its_items_fit_apart() -> None:
    # No compaction makes a larger free block than the one there is (1.5 MiB at the start),
    # but one packs the 512 KiB holes so that two 1 MiB items fit apart.
    pool, compactor, kept = pinned_every_fourth()
    largest = pool.stats().largest_free_block
    assert compactor.plan("full").largest_free_after <= largest
    blocks = pool.alloc_many([MIB, MIB])
    assert [b.nbytes for b in blocks] == [MIB, MIB]
    assert compactor.compactions == 1 and sum(s.blocks for s in compactor.reports[-1].steps) > 0
    assert pool.stats().failed_allocs == 0
    assert all(b.alive for b in kept)
    pool.check()


def test_under_a_pause_budget_a_batch_rescue_ends_with_one_full_compaction() -> None:
    pool, compactor, _ = pinned_every_fourth(budget=1e-6)
    blocks = pool.alloc_many([MIB, MIB])
    assert [b.nbytes for b in blocks] == [MIB, MIB]
    report = compactor.reports[-1]
    assert report.mode == "full" and any("over the budget" in note for note in report.notes)
    pool.check()


def test_waiting_for_room_ends_when_a_batch_fits_apart() -> None:
    # Four pinned blocks in the middle; the blocks around them are freed while the batch waits:
    # two 4 MiB holes, never one 8 MiB block.
    pool = npumem.Pool(16 * MIB, cores=1)
    blocks = [pool.alloc(2 * MIB) for _ in range(8)]
    for blk in blocks[2:6]:
        blk.pin()
    compactor = Compactor(pool, policy=Policy(wait_for_room=5.0, min_interval=0.0)).attach()

    def free_later() -> None:
        time.sleep(0.2)
        for blk in blocks[:2] + blocks[6:]:
            blk.free()

    freer = threading.Thread(target=free_later)
    freer.start()
    started = time.monotonic()
    got = pool.alloc_many([4 * MIB, 4 * MIB])
    waited = time.monotonic() - started
    freer.join()
    assert sorted(b.offset for b in got) == [0, 12 * MIB]
    assert compactor.waits == 1 and compactor.waits_failed == 0
    assert waited < 4.0, f"waited {waited:.2f} s for room that came after 0.2 s"
    pool.check()


def test_a_thread_holding_the_pause_does_not_wait_for_another_threads_compaction() -> None:
    # The other thread's compaction holds the compactor and waits for this thread's pause:
    # this thread's failing allocation must not wait for that compaction.
    pool = npumem.Pool(16 * MIB, cores=1)
    made = [pool.alloc(256 << 10) for _ in range(64)]
    for blk in made[::2]:
        blk.free()
    compactor = Compactor(pool, policy=Policy(min_interval=0), pause_timeout=5.0).attach()
    outcome: list[str] = []

    def compacting() -> None:
        try:
            compactor.compact("full")
            outcome.append("compacted")
        except npumem.NpumemError as err:
            outcome.append(type(err).__name__)

    with pool.pause(30.0):
        other = threading.Thread(target=compacting)
        other.start()
        time.sleep(0.3)  # the other thread holds the compactor and waits for the pause
        started = time.monotonic()
        with pytest.raises(npumem.OutOfMemoryError):
            pool.alloc(4 * MIB)
        refused_after = time.monotonic() - started
    other.join(10)
    assert refused_after < 1.0, f"the failing allocation waited {refused_after:.2f} s"
    assert outcome == ["compacted"]
    pool.check()


def test_under_its_own_pause_a_thread_gets_no_rescue_and_the_next_failure_compacts() -> None:
    # A compaction stops the pool itself: under this thread's pause the rescue does not run
    # (no PoolBusyError behind the OutOfMemoryError), and it does not use up the interval
    # between automatic compactions, so the failure after the resume is rescued.
    pool, kept, want = seed_pool()
    compactor = Compactor(pool, policy=Policy(min_interval=3600.0)).attach()
    assert not pool.paused_by_caller()
    with pool.pause(5.0):
        assert pool.paused_by_caller()
        with pytest.raises(npumem.OutOfMemoryError) as err:
            pool.alloc(want)
    assert not pool.paused_by_caller()
    assert err.value.__cause__ is None
    assert compactor.compactions == 0
    big = pool.alloc(want)
    assert compactor.compactions == 1
    for blk, ident in kept:
        assert intact(blk, ident), f"block {ident} lost its bytes"
    big.free()
    pool.check()


def test_another_threads_pause_is_not_the_callers() -> None:
    pool = npumem.Pool(4 * MIB, cores=1)
    seen: list[bool] = []
    with pool.pause(5.0):
        other = threading.Thread(target=lambda: seen.append(pool.paused_by_caller()))
        other.start()
        other.join(10)
        assert pool.paused_by_caller()
    assert seen == [False]


def test_a_kv_page_rescue_does_not_wait_for_a_compaction_whose_hook_reads_the_cache() -> None:
    # Thread A compacts and its pause hook reads the cache; thread B's page allocation fails
    # under the cache's lock and its rescue would wait for A's compactor: a deadlock, unless
    # the rescue declines at once (B's allocation then fails and lets A go on).
    pool = npumem.Pool(16 * MIB, cores=1)
    cache = KVCache(pool, num_layers=8, num_kv_heads=8, head_dim=128, page_tokens=16)
    cache.add_sequence(0, num_tokens=16)
    made = [pool.alloc(256 << 10) for _ in range(56)]
    for blk in made[::2]:
        blk.free()
    in_hook, go = threading.Event(), threading.Event()

    def on_pause() -> None:
        if threading.current_thread().name == "compacting":
            in_hook.set()
            go.wait(2)
            cache.block_table(0)

    compactor = Compactor(pool, on_pause=on_pause, policy=Policy(min_interval=0)).attach()
    outcome: dict[str, str] = {}

    def compacting() -> None:
        compactor.compact("full")
        outcome["compacting"] = "done"

    def adding() -> None:
        in_hook.wait(5)
        timer = threading.Timer(0.3, go.set)
        timer.start()
        try:
            cache.add_sequence(1, num_tokens=16 * 8)
            outcome["adding"] = "served"
        except npumem.OutOfMemoryError:
            outcome["adding"] = "refused"
        timer.join()

    threads = [
        threading.Thread(target=compacting, name="compacting", daemon=True),
        threading.Thread(target=adding, name="adding", daemon=True),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not any(t.is_alive() for t in threads), "deadlock: the threads still wait"
    assert outcome["compacting"] == "done" and outcome["adding"] in ("served", "refused")
    pool.check()


def test_a_rescue_takes_the_policys_incremental_steps() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    made = [pool.alloc(500_000) for _ in range(30)]
    for blk in made[::2]:
        blk.free()
    step = 1 * MIB
    policy = Policy(mode="incremental", max_bytes=step, min_interval=0)
    compactor = Compactor(pool, policy=policy).attach()
    big = pool.alloc(6 * MIB)
    report = compactor.reports[-1]
    assert big.nbytes == 6 * MIB
    assert report.mode == "incremental" and len(report.steps) > 1
    assert all(s.bytes <= step for s in report.steps), [s.bytes for s in report.steps]
    pool.check()


def allocate_while_freed(
    blocks: list[npumem.Block], allocate: Callable[[], npumem.Block]
) -> tuple[npumem.Block, float]:
    """Run `allocate()` while another thread frees `blocks` 0.3 s into it: its block, and how
    long it took (seconds)."""

    def free_later() -> None:
        time.sleep(0.3)
        for blk in blocks:
            blk.free()

    freer = threading.Thread(target=free_later)
    freer.start()
    started = time.monotonic()
    try:
        got = allocate()
    finally:
        freer.join()
    return got, time.monotonic() - started


def test_a_pool_that_cannot_grow_by_the_request_waits_for_room() -> None:
    # 4 MiB of growth left: too little for 6 MiB, so the retry cannot grow; another thread
    # frees the first region's blocks while the allocation waits.
    pool = npumem.Pool(8 * MIB, max_capacity=12 * MIB, grow_by=4 * MIB, cores=1)
    compactor = Compactor(pool, policy=Policy(wait_for_room=5.0, min_interval=0)).attach()
    held = [pool.alloc(MIB) for _ in range(8)]
    big, waited = allocate_while_freed(held, lambda: pool.alloc(6 * MIB))
    assert big.nbytes == 6 * MIB and compactor.waits == 1 and compactor.waits_failed == 0
    assert 0.2 < waited < 4.0, waited
    pool.check()


def test_a_pool_whose_growth_is_refused_waits_for_room() -> None:
    # The pool may grow by the request, but its on_grow refuses (the device has no memory to
    # map): the allocation's growth failed before the handler ran, so the handler waits for
    # another thread's frees instead of failing at once.
    def refuse(offset: int, nbytes: int) -> None:
        raise RuntimeError("the device has no memory to map")

    pool = npumem.Pool(8 * MIB, max_capacity=64 * MIB, cores=1, on_grow=refuse)
    compactor = Compactor(pool, policy=Policy(wait_for_room=5.0, min_interval=0)).attach()
    held = [pool.alloc(MIB) for _ in range(8)]
    got, waited = allocate_while_freed(held[:4], lambda: pool.alloc(4 * MIB))
    assert got.nbytes == 4 * MIB and pool.capacity == 8 * MIB
    assert compactor.waits == 1 and compactor.waits_failed == 0
    assert 0.2 < waited < 4.0, waited
    pool.check()


def test_the_handler_learns_whether_the_retry_may_grow_the_pool() -> None:
    # A pool that can grow asks its handler before it grows; when the growth then fails, it
    # asks again, told that the pool will not grow, and the allocation fails once.
    seen: list[tuple[int, bool]] = []

    def handler(nbytes: int) -> bool:
        seen.append((nbytes, oom_retry_may_grow()))
        return False

    refusals = 0

    def refuse(offset: int, nbytes: int) -> None:
        nonlocal refusals
        refusals += 1
        raise RuntimeError("no device memory")

    refused = npumem.Pool(4 * MIB, max_capacity=16 * MIB, cores=1, on_grow=refuse)
    held = refused.alloc(4 * MIB)
    refused.set_oom_handler(handler)
    with pytest.raises(npumem.OutOfMemoryError) as raised:
        refused.alloc(2 * MIB)
    assert seen == [(2 * MIB, True), (2 * MIB, False)] and refusals == 1
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert refused.stats().failed_allocs == 1 and refused.capacity == 4 * MIB

    seen.clear()
    grows = npumem.Pool(4 * MIB, max_capacity=16 * MIB, cores=1)
    filled = [grows.alloc(4 * MIB)]
    grows.set_oom_handler(handler)
    got = grows.alloc(2 * MIB)
    assert seen == [(2 * MIB, True)] and grows.capacity > 4 * MIB
    assert grows.stats().failed_allocs == 0

    seen.clear()
    fixed = npumem.Pool(4 * MIB, cores=1)
    filled.append(fixed.alloc(4 * MIB))
    fixed.set_oom_handler(handler)
    with pytest.raises(npumem.OutOfMemoryError):
        fixed.alloc(2 * MIB)
    assert seen == [(2 * MIB, False)] and fixed.stats().failed_allocs == 1
    assert oom_retry_may_grow() is False  # outside a handler
    for blk in [got, held, *filled]:
        blk.free()
    for pool in (refused, grows, fixed):
        pool.check()


def test_a_growth_hook_that_raises_keyboard_interrupt_ends_the_allocation() -> None:
    seen: list[bool] = []

    def interrupt(offset: int, nbytes: int) -> None:
        raise KeyboardInterrupt

    pool = npumem.Pool(4 * MIB, max_capacity=16 * MIB, cores=1, on_grow=interrupt)
    held = pool.alloc(4 * MIB)
    pool.set_oom_handler(lambda nbytes: seen.append(oom_retry_may_grow()) or False)
    with pytest.raises(KeyboardInterrupt):
        pool.alloc(2 * MIB)
    assert seen == [True]  # not asked again: Ctrl-C ends the call
    assert pool.stats().failed_allocs == 1
    held.free()
    pool.check()


def test_the_handler_learns_the_sizes_of_the_request_it_runs_for() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    seen: list[tuple[int, list[int] | None]] = []
    held = pool.alloc(4 * MIB)
    pool.set_oom_handler(lambda nbytes: seen.append((nbytes, oom_request_sizes())) or False)
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(5 * MIB)
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc_many([3 * MIB, 1 * MIB, 1 * MIB])
    assert seen == [(5 * MIB, [5 * MIB]), (5 * MIB, [3 * MIB, 1 * MIB, 1 * MIB])]
    assert oom_request_sizes() is None  # outside a handler
    held.free()
    pool.check()


def test_room_in_half_empty_slabs_is_rescued_too() -> None:
    # Slab objects fill the pool, every other one is freed: nothing is free, half of it is
    # unused slab room (`slab_cached_bytes`), which a compaction packs into free chunks.
    pool = npumem.Pool(32 * MIB, cores=1)
    blocks = []
    while True:
        try:
            blocks.append(pool.alloc(4096))
        except npumem.OutOfMemoryError:
            break
    for block in blocks[1::2]:
        block.free()
    kept = blocks[::2]
    for i, block in enumerate(kept):
        fill(block, i)
    stats = pool.stats()
    assert stats.bytes_free < 2 * MIB <= stats.slab_cached_bytes, stats
    compactor = Compactor(pool, policy=Policy(min_interval=0.0)).attach()
    large = pool.alloc(2 * MIB)
    assert compactor.compactions == 1
    assert all(intact(block, i) for i, block in enumerate(kept))
    large.free()
    pool.check()


def test_no_compaction_when_it_cannot_help_or_the_policy_says_no() -> None:
    pool, _, want = seed_pool()
    compactor = Compactor(pool).attach()
    with pytest.raises(npumem.OutOfMemoryError):
        # More than is free, or unused in partly used slabs: compacting is pointless.
        stats = pool.stats()
        pool.alloc(stats.bytes_free + stats.slab_cached_bytes + 1)
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


def test_a_handler_that_raises_is_the_cause_and_one_that_allocates_does_not_recurse() -> None:
    pool, _, want = seed_pool()
    before = pool.stats()

    def broken(nbytes: int) -> bool:
        raise RuntimeError(f"handler failed for {nbytes}")

    class NoTruth:
        def __bool__(self) -> bool:
            raise ValueError("no truth value")

    # The allocation fails as it would have (`except MemoryError` still catches it), with the
    # handler's exception as its cause; nothing changes but the failure counted.
    for handler, cause in ((broken, RuntimeError), (lambda n: NoTruth(), ValueError)):
        pool.set_oom_handler(handler)
        for alloc in (lambda: pool.alloc(want), lambda: pool.alloc_many([want])):
            with pytest.raises(npumem.OutOfMemoryError) as caught:
                alloc()
            assert isinstance(caught.value.__cause__, cause)
    after = pool.stats()
    assert (after.bytes_in_use, after.blocks_in_use) == (before.bytes_in_use, before.blocks_in_use)
    assert after.failed_allocs == before.failed_allocs + 4

    # Ctrl-C in the handler goes through as it is.
    def interrupted(nbytes: int) -> bool:
        raise KeyboardInterrupt

    pool.set_oom_handler(interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.alloc(want)
    pool.set_oom_handler(broken)
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


def full_pool() -> tuple[npumem.Pool, npumem.Block, npumem.Block]:
    """A pool that cannot grow, with two blocks of half its room each: a third half-sized
    allocation fails until one of them is freed, and no compaction can help."""
    pool = npumem.Pool(8 * MIB, cores=1)
    a = pool.alloc(4 * MIB, tag="a")
    b = pool.alloc(4 * MIB, tag="b")
    return pool, a, b


def test_waiting_for_room_serves_an_allocation_that_another_thread_makes_room_for() -> None:
    pool, a, b = full_pool()
    compactor = Compactor(pool, policy=Policy(wait_for_room=30.0)).attach()
    freer = threading.Timer(0.05, a.free)
    freer.start()
    started = time.monotonic()
    c = pool.alloc(4 * MIB, tag="c")  # waits until the timer's thread frees `a`
    waited = time.monotonic() - started
    freer.join()
    assert not a.alive and c.alive
    assert 0.04 <= waited < 30.0
    assert pool.stats().failed_allocs == 0  # served: it did not raise
    assert (compactor.waits, compactor.waits_failed) == (1, 0)
    assert 0.04 <= compactor.waited_seconds < 30.0
    c.free()
    b.free()
    pool.check()


def test_waiting_in_vain_raises_after_the_wait_and_no_wait_raises_at_once() -> None:
    pool, a, b = full_pool()
    compactor = Compactor(pool, policy=Policy(wait_for_room=0.05)).attach()
    started = time.monotonic()
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(4 * MIB)
    assert time.monotonic() - started >= 0.05
    assert (compactor.waits, compactor.waits_failed) == (1, 1)
    assert pool.stats().failed_allocs == 1
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(4 * MIB)  # right after a wait in vain: no wait
    assert (compactor.waits, pool.stats().failed_allocs) == (1, 2)
    compactor.detach()
    never = Compactor(pool).attach()  # the default policy does not wait
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(4 * MIB)
    assert never.waits == 0
    a.free()
    b.free()
    pool.check()


def test_one_allocation_waits_at_a_time_and_the_others_raise_at_once() -> None:
    pool, a, b = full_pool()
    compactor = Compactor(pool, policy=Policy(wait_for_room=30.0)).attach()
    outcome: list[npumem.Block] = []
    waiter = threading.Thread(target=lambda: outcome.append(pool.alloc(4 * MIB)))
    waiter.start()
    deadline = time.monotonic() + 10
    while not compactor._waiting and time.monotonic() < deadline:
        time.sleep(0.001)
    assert compactor._waiting
    started = time.monotonic()
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(4 * MIB)  # another thread waits: this one raises and can go on to free
    assert time.monotonic() - started < 10.0
    a.free()  # the freeing the waiter waits for
    waiter.join()
    assert len(outcome) == 1 and outcome[0].alive
    assert (compactor.waits, compactor.waits_failed) == (1, 0)
    outcome[0].free()
    b.free()
    pool.check()


def test_a_pool_that_can_grow_grows_instead_of_waiting() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, max_capacity=16 * MIB, grow_by=8 * MIB)
    a, b = pool.alloc(4 * MIB), pool.alloc(4 * MIB)
    compactor = Compactor(pool, policy=Policy(wait_for_room=30.0)).attach()
    started = time.monotonic()
    c = pool.alloc(4 * MIB)
    assert time.monotonic() - started < 10.0
    assert compactor.waits == 0 and pool.capacity == 16 * MIB
    for blk in (a, b, c):
        blk.free()
    pool.check()


def test_a_kv_cache_page_does_not_wait_while_the_cache_is_locked() -> None:
    """A page of a KV cache is allocated under the cache's lock: a handler waiting there would
    keep every other thread's cache calls (their frees too) waiting, so it does not wait."""
    pool, a, b = full_pool()
    seen: list[bool] = []
    pool.set_oom_handler(lambda nbytes: seen.append(oom_handler_may_wait()) or False)
    kv = KVCache(pool, num_layers=1, num_kv_heads=1, head_dim=64, page_tokens=16)
    with pytest.raises(npumem.OutOfMemoryError):
        kv.add_sequence(1, 16)
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(4 * MIB)
    assert seen == [False, True]  # inside the cache's page allocation, then a plain one
    assert oom_handler_may_wait()
    compactor = Compactor(pool, policy=Policy(wait_for_room=30.0)).attach()
    started = time.monotonic()
    with pytest.raises(npumem.OutOfMemoryError):
        kv.add_sequence(2, 16)
    assert time.monotonic() - started < 10.0
    assert compactor.waits == 0
    compactor.detach()
    kv.close()
    a.free()
    b.free()
    pool.check()


def test_a_thread_that_holds_the_pause_does_not_wait_for_room() -> None:
    """Nothing another thread frees reaches a pool this thread pauses: no handler waits."""
    pool, a, b = full_pool()
    seen: list[bool] = []
    pool.set_oom_handler(lambda nbytes: seen.append(oom_handler_may_wait()) or False)
    with pool.pause(), pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(4 * MIB)
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(4 * MIB)
    assert seen == [False, True]  # inside the pause, then after it
    compactor = Compactor(pool, policy=Policy(wait_for_room=30.0)).attach()
    started = time.monotonic()
    with pool.pause(), pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(4 * MIB)
    assert time.monotonic() - started < 10.0
    assert compactor.waits == 0
    compactor.detach()
    a.free()
    b.free()
    pool.check()


def full_growing_pool(
    on_grow: Callable[[int, int], object],
) -> tuple[npumem.Pool, list[npumem.Block]]:
    pool = npumem.Pool(4 * MIB, max_capacity=16 * MIB, grow_by=4 * MIB, cores=1, on_grow=on_grow)
    return pool, [pool.alloc(MIB) for _ in range(4)]


class GrowRefused(Exception):
    pass


class HandlerFailed(Exception):
    pass


def refuse_growth(offset: int, nbytes: int) -> None:
    raise GrowRefused(f"no device memory at {offset:#x}")


def test_a_handler_that_raises_after_a_refused_growth_is_the_cause() -> None:
    # The growth's exception stays reachable as the context of the handler's.
    pool, held = full_growing_pool(refuse_growth)
    calls: list[bool] = []

    def handler(nbytes: int) -> bool:
        calls.append(oom_retry_may_grow())
        if len(calls) == 2:
            raise HandlerFailed("the handler failed")
        return False

    pool.set_oom_handler(handler)
    with pytest.raises(npumem.OutOfMemoryError) as raised:
        pool.alloc(MIB)
    assert calls == [True, False]
    assert isinstance(raised.value.__cause__, HandlerFailed)
    assert isinstance(raised.value.__cause__.__context__, GrowRefused)
    assert pool.stats().failed_allocs == 1
    for blk in held:
        blk.free()
    pool.check()


def test_a_failing_allocation_inside_a_handler_keeps_the_outer_growth_cause() -> None:
    pool, held = full_growing_pool(refuse_growth)
    probes: list[str] = []

    def handler(nbytes: int) -> bool:
        if not oom_retry_may_grow():
            with pytest.raises(npumem.OutOfMemoryError) as probe:
                pool.alloc(nbytes // 2)
            probes.append(type(probe.value.__cause__).__name__)
        return False

    pool.set_oom_handler(handler)
    with pytest.raises(npumem.OutOfMemoryError) as raised:
        pool.alloc(MIB)
    assert isinstance(raised.value.__cause__, GrowRefused)
    assert probes == ["GrowRefused"]  # the probe's own growth was refused too
    for blk in held:
        blk.free()
    pool.check()


def test_the_last_retry_does_not_grow_the_pool_the_handler_was_told_would_not() -> None:
    grows: list[int] = []

    def refuse_once(offset: int, nbytes: int) -> None:
        grows.append(nbytes)
        if len(grows) == 1:
            raise GrowRefused("not now")

    pool, held = full_growing_pool(refuse_once)
    pool.set_oom_handler(lambda nbytes: True)
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(MIB)
    assert len(grows) == 1 and pool.capacity == 4 * MIB and len(pool.regions()) == 1
    got = pool.alloc(MIB)  # a later allocation asks again
    assert len(grows) == 2 and pool.capacity == 8 * MIB
    for blk in [*held, got]:
        blk.free()
    pool.check()


def test_an_allocation_inside_a_growth_hook_asks_no_handler() -> None:
    # The region change the hook is part of holds the pool: a handler could neither grow it
    # nor pause it, and a Compactor's would wait for the pause in vain.
    asked: list[int] = []
    nested: list[str] = []

    def on_grow(offset: int, nbytes: int) -> None:
        with pytest.raises(npumem.OutOfMemoryError):
            pool.alloc(MIB)
        nested.append("refused")

    pool, held = full_growing_pool(on_grow)
    pool.set_oom_handler(lambda nbytes: asked.append(nbytes) or False)
    got = pool.alloc(MIB)
    assert asked == [MIB] and nested == ["refused"] and pool.capacity == 8 * MIB
    for blk in [*held, got]:
        blk.free()
    pool.check()


def test_inside_one_pools_handler_another_pools_handler_runs() -> None:
    spill = npumem.Pool(4 * MIB, cores=1)
    spilled = [spill.alloc(MIB) for _ in range(4)]
    spill_asked: list[int] = []

    def spill_handler(nbytes: int) -> bool:
        spill_asked.append(nbytes)
        spilled.pop().free()
        return True

    spill.set_oom_handler(spill_handler)
    pool = npumem.Pool(4 * MIB, cores=1)
    held = [pool.alloc(MIB) for _ in range(4)]
    moved: list[npumem.Block] = []

    def handler(nbytes: int) -> bool:
        moved.append(spill.alloc(MIB))  # the spill pool's own handler makes room there
        held.pop().free()
        return True

    pool.set_oom_handler(handler)
    got = pool.alloc(MIB)
    assert spill_asked == [MIB] and len(moved) == 1
    for blk in [*held, got, *moved, *spilled]:
        blk.free()
    pool.check()
    spill.check()


def test_a_compactors_plan_waits_no_longer_than_its_pause_timeout() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    blocks = [pool.alloc(256 << 10) for _ in range(16)]
    for blk in blocks[1::2]:
        blk.free()
    compactor = Compactor(pool, pause_timeout=0.3)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with pool.pause(30):
            held.set()
            release.wait(15)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    started = time.monotonic()
    try:
        with pytest.raises(npumem.PoolBusyError):
            compactor.compact("full")
        waited = time.monotonic() - started
    finally:
        release.set()
        thread.join()
    assert waited < 5.0, f"the plan waited {waited:.1f} s with a pause timeout of 0.3 s"
    pool.check()


def test_a_handler_reads_the_figures_by_tag_without_the_failing_request() -> None:
    pool = npumem.Pool(4 * MIB, cores=1)
    held = [pool.alloc(MIB, tag="weights") for _ in range(4)]
    seen: list[tuple[int, int]] = []

    def handler(nbytes: int) -> bool:
        weights = next(t for t in pool.stats().by_tag if t.tag == "weights")
        seen.append((weights.blocks_in_use, weights.requested_bytes_in_use))
        return False

    pool.set_oom_handler(handler)
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc_many([MIB, MIB], tag="weights")
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(MIB, tag="weights")
    assert seen == [(4, 4 * MIB), (4, 4 * MIB)]
    weights = next(t for t in pool.stats().by_tag if t.tag == "weights")
    assert (weights.blocks_in_use, weights.peak_requested_bytes_in_use) == (4, 4 * MIB)
    for blk in held:
        blk.free()
    pool.check()


def test_an_interrupt_as_a_rescue_takes_the_compactors_lock_leaves_it_free() -> None:
    """Ctrl-C may land right after the rescue took the compactor's lock, before the code that
    gives it back runs: the lock is given back all the same, so other threads' rescues and
    compactions do not wait for it for ever."""
    pool = npumem.Pool(16 * MIB, cores=1)
    compactor = Compactor(pool).attach()

    class InterruptedAfterTaking(ForkSafeRLock):
        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            super().acquire(blocking, timeout)
            raise KeyboardInterrupt

    compactor._lock = InterruptedAfterTaking("Compactor")
    with pytest.raises(KeyboardInterrupt):
        compactor._rescue(1 << 20, False)
    assert not compactor._lock.held_here()
    taken: list[bool] = []
    other = threading.Thread(
        target=lambda: taken.append(ForkSafeRLock.acquire(compactor._lock, True, 5))
    )
    other.start()
    other.join(10)
    assert taken == [True]
