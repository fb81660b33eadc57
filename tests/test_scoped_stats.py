"""Statistics by tag (PoolStats.by_tag, bounded), pool.reset_peak(), with pool.measure() as m:
scoped statistics that nest, and requests larger than the arena counted as failed allocations."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

import npumem
from npumem.monitor import PrometheusCollector, TraceRecorder

MIB = 1 << 20


def by_tag(pool: npumem.Pool) -> dict[str | None, tuple[int, int, int]]:
    return {
        t.tag: (t.blocks_in_use, t.requested_bytes_in_use, t.peak_requested_bytes_in_use)
        for t in pool.stats().by_tag
    }


def test_by_tag_counts_blocks_bytes_and_peaks() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    a = [pool.alloc(1000, tag="a") for _ in range(3)]
    b = pool.alloc_many([5000, 7000], tag="b")
    c = pool.alloc(300)
    assert by_tag(pool) == {"a": (3, 3000, 3000), "b": (2, 12000, 12000), None: (1, 300, 300)}
    a[0].free()
    pool.free(a[1])
    pool.free_many(b)
    with pool.alloc(100, tag="a"):
        pass
    assert by_tag(pool) == {"a": (1, 1000, 3000), "b": (0, 0, 12000), None: (1, 300, 300)}
    # Largest bytes first; the dict form is what snapshots keep.
    assert pool.stats().by_tag[0].tag == "a"
    assert pool.stats().as_dict()["by_tag"][0]["tag"] == "a"
    assert pool.snapshot().stats.by_tag == pool.stats().by_tag
    # A refused free or a double free changes nothing.
    with pytest.raises(npumem.DoubleFreeError):
        a[0].free()
    assert by_tag(pool)["a"] == (1, 1000, 3000)
    a[2].free()
    c.free()


def test_by_tag_has_bounded_cardinality() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blocks = [pool.alloc(64, tag=f"t{i}") for i in range(100)]
    tags = by_tag(pool)
    assert len(tags) == 64  # 63 tags of their own, the rest together
    assert tags["(other tags)"] == (37, 37 * 64, 37 * 64)
    pool.free_many(blocks)


# Blocks above the largest slab class (4 KiB): their peak is exact for one thread.
BIG = st.integers(min_value=4097, max_value=3 * MIB)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), BIG, st.sampled_from([None, "a", "b"])),
        st.tuples(st.just("free"), st.integers(min_value=0, max_value=1 << 16), st.none()),
        st.tuples(st.just("reset"), st.just(0), st.none()),
    ),
    max_size=60,
)


@given(OPS)
def test_untagged_figures_follow_a_reference_model(ops: list[tuple[str, int, str | None]]) -> None:
    """The untagged row is the pool's blocks less the tagged ones, never counted one by one:
    checked against a model that counts them, its peak included (exact for one thread and
    blocks above the slab classes), after every step; and the rows add up to the pool."""
    pool = npumem.Pool(64 * MIB, cores=2)
    live: list[tuple[npumem.Block, int, str | None]] = []
    peak = 0

    def untagged() -> tuple[int, int]:
        mine = [n for _, n, tag in live if tag is None]
        return len(mine), sum(mine)

    for op, n, tag in ops:
        if op == "alloc":
            with contextlib.suppress(npumem.OutOfMemoryError):
                live.append((pool.alloc(n, tag=tag), n, tag))
        elif op == "free" and live:
            block, _, _ = live.pop(n % len(live))
            block.free()
        elif op == "reset":
            pool.reset_peak()
            peak = untagged()[1]
        peak = max(peak, untagged()[1])
        stats = pool.stats()
        rows = {t.tag: t for t in stats.by_tag}
        blocks, nbytes = untagged()
        if None in rows:
            row = rows[None]
            assert (row.blocks_in_use, row.requested_bytes_in_use) == (blocks, nbytes)
            assert row.peak_requested_bytes_in_use == peak
        else:
            assert (blocks, peak) == (0, 0)
        assert sum(t.blocks_in_use for t in stats.by_tag) == stats.blocks_in_use == len(live)
        assert sum(t.requested_bytes_in_use for t in stats.by_tag) == stats.requested_bytes_in_use
    pool.free_many([b for b, _, _ in live])


def test_the_untagged_peak_is_kept_between_snapshots() -> None:
    """The untagged peak of large blocks is raised as they are allocated, not only when a
    snapshot is taken; a tagged block is never part of it."""
    pool = npumem.Pool(64 * MIB, cores=2)
    blocks = [pool.alloc(3 * MIB + 5) for _ in range(3)]
    pool.free_many(blocks)
    pool.alloc(20 * MIB, tag="w").free()
    assert by_tag(pool)[None] == (0, 0, 3 * (3 * MIB + 5))
    # Small blocks: the peak is sampled (when a slab is made and at every snapshot), so it
    # lies between what a snapshot saw and the true peak.
    pool.reset_peak()
    small = [pool.alloc(300) for _ in range(1000)]
    pool.free_many(small)
    assert 0 < by_tag(pool)[None][2] <= 300 * 1000


def test_reset_peak() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    keep = pool.alloc(MIB, tag="w")
    pool.alloc(4 * MIB, tag="w").free()
    assert pool.stats().peak_bytes_in_use >= 5 * MIB
    pool.reset_peak()
    s = pool.stats()
    assert s.peak_bytes_in_use == s.bytes_in_use == keep.block_bytes
    assert by_tag(pool)["w"] == (1, MIB, MIB)
    keep.free()


def test_measure_gives_the_peak_and_counts_of_a_scope_and_nests() -> None:
    pool = npumem.Pool(32 * MIB, cores=1, run_tails=False)  # whole-chunk runs
    pool.alloc(8 * MIB).free()  # an earlier, higher peak
    base = pool.alloc(MIB)
    with pool.measure() as outer:
        assert outer.peak_bytes_in_use is None  # read when the scope ends
        with pool.measure() as inner:
            pool.alloc(2 * MIB).free()
        pool.alloc(3 * MIB).free()  # a run of two 2 MiB chunks: 4 MiB in use
        with pytest.raises(npumem.OutOfMemoryError):
            pool.alloc(31 * MIB)
    assert inner.peak_bytes_in_use == 3 * MIB and inner.allocs == 1 and inner.frees == 1
    assert outer.peak_bytes_in_use == 5 * MIB
    assert (outer.allocs, outer.frees, outer.failed_allocs) == (2, 2, 1)
    assert outer.bytes_in_use_at_start == outer.bytes_in_use_at_end == MIB
    assert outer.seconds is not None and outer.seconds >= inner.seconds  # type: ignore[operator]
    assert pool.stats().peak_bytes_in_use >= 8 * MIB  # the pool's own peak is kept
    assert "peak_bytes_in_use=5242880" in repr(outer)
    with pytest.raises(npumem.InvalidArgumentError, match="used once"), outer:
        pass
    base.free()


def test_request_too_large_counts_as_failed_and_is_traced() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, name="big")
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(pool))
    with TraceRecorder(pool) as rec:
        with pytest.raises(npumem.RequestTooLargeError):
            pool.alloc(9 * MIB, tag="huge")
        with pytest.raises(npumem.RequestTooLargeError):
            pool.alloc(10**30)
        with pytest.raises(npumem.RequestTooLargeError):
            pool.alloc_many([100, 9 * MIB])
        with pytest.raises(npumem.InvalidArgumentError):
            pool.alloc(0)  # a bad value, not an allocation that failed
    assert pool.stats().failed_allocs == 3
    failed = [e for e in rec.trace.events if e.kind == "failed"]
    assert (failed[0].size, failed[0].tag) == (9 * MIB, "huge") and len(failed) == 3
    assert 'npumem_failed_allocs_total{pool="big"} 3.0' in generate_latest(registry).decode()


def test_counts_of_threads_that_exit_add_up_exactly() -> None:
    """Each thread counts in a block of its own, reused by later threads once it exits: after
    rounds of short-lived threads (each allocating, freeing some of its blocks and leaving the
    rest to be freed by the main thread), the totals are exact and the peak covers what was
    held at once."""
    import threading

    pool = npumem.Pool(64 * MIB, cores=2)
    sizes = [100, 3000, 5000, 70_000, 300_000, 3 * MIB]
    allocs = frees = 0
    for round_ in range(3):
        kept: list[list[npumem.Block]] = [[] for _ in range(6)]

        def work(i: int, kept: list[list[npumem.Block]] = kept) -> None:
            blocks = [pool.alloc(sizes[(i + k) % len(sizes)] + k) for k in range(12)]
            for blk in blocks[::2]:
                blk.free()
            kept[i] = blocks[1::2]

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        allocs += 6 * 12
        frees += 6 * 6
        live = [blk for blocks in kept for blk in blocks]
        s = pool.stats()
        assert (s.alloc_count, s.free_count, s.blocks_in_use) == (allocs, frees, len(live)), round_
        assert s.requested_bytes_in_use == sum(blk.nbytes for blk in live)
        assert s.bytes_in_use == sum(blk.block_bytes for blk in live)
        assert s.peak_bytes_in_use >= s.bytes_in_use
        for blk in live:
            blk.free()
        frees += len(live)
        s = pool.stats()
        assert (s.alloc_count, s.free_count, s.blocks_in_use) == (allocs, frees, 0)
        assert (s.bytes_in_use, s.requested_bytes_in_use) == (0, 0)
    assert pool.check() == 0


def test_the_peak_of_many_threads_misses_less_than_a_slack_per_core() -> None:
    """Threads publish their running byte counts past a slack (1 MiB here, shared out once more
    threads than cores use the pool): 32 threads holding 1 MiB each at once leave less than
    2 MiB (a slack per core) out of the peak."""
    import threading

    pool = npumem.Pool(1 << 30, cores=2, backing="none")
    threads = 32
    together = threading.Barrier(threads)
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            blk = pool.alloc(MIB)
            together.wait()
            together.wait()
            blk.free()
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)
            together.abort()

    pool.reset_peak()
    workers = [threading.Thread(target=hold) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    peak = pool.stats().peak_bytes_in_use
    assert threads * MIB - 2 * MIB <= peak <= threads * MIB, peak
