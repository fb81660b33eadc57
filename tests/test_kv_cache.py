"""npumem.kv.KVCache: the interface, sizes, block tables, copy-on-write byte for byte, failures
that change nothing, eviction, misuse and compaction."""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest

import npumem
from kv_helpers import SHAPE, make_cache
from npumem.kv import KVCache, KVShape, kv_cache_bytes


@pytest.fixture(params=[256, None], ids=["reserved", "on-demand"])
def cache(request: pytest.FixtureRequest) -> KVCache:
    return make_cache(capacity_tokens=request.param)


def test_sizes_follow_the_formula() -> None:
    c = make_cache()
    assert c.bytes_per_token == 2 * 1 * 8 * 2 * 2
    assert c.page_bytes == c.bytes_per_token * 4
    assert c.capacity_tokens == 256
    assert c.shape == KVShape(**SHAPE)
    s = c.stats()
    assert (s.pages_total, s.pages_free, s.pages_in_use, s.preallocated) == (64, 64, 0, True)


def test_model_config_helper() -> None:
    llama = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}
    assert kv_cache_bytes(llama, max_seq_len=2048, batch=8) == 2048 * 8 * 32 * 4096 * 2 * 2
    gqa = KVShape.from_config(
        {
            "num_hidden_layers": 4,
            "hidden_size": 512,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "torch_dtype": "float32",
        }
    )
    assert gqa == KVShape(num_layers=4, num_kv_heads=2, head_dim=64, dtype_bytes=4)
    assert gqa.bytes_per_token == 4 * 2 * 64 * 2 * 4
    pool = npumem.Pool(8 << 20, cores=1)
    c = KVCache.from_model(pool, gqa, max_seq_len=64, batch=4)
    assert c.capacity_tokens == 256
    assert kv_cache_bytes(gqa, max_seq_len=64, batch=4) == c.capacity_tokens * c.bytes_per_token
    with pytest.raises(npumem.InvalidArgumentError, match="head_dim"):
        KVShape.from_config({"num_hidden_layers": 2})


def test_pages_only_when_the_last_is_full(cache: KVCache) -> None:
    cache.add_sequence(1, num_tokens=5)
    assert (cache.num_tokens(1), cache.num_pages(1)) == (5, 2)
    cache.append(1, 3)
    assert cache.num_pages(1) == 2
    cache.append(1)
    assert cache.num_pages(1) == 3
    table = cache.block_table(1)
    assert table.dtype == np.int64 and table.shape == (3,)
    assert len(set(table.tolist())) == 3
    s = cache.stats()
    assert s.waste_bytes == 3 * cache.bytes_per_token
    assert s.tokens == 9 and s.pages_in_use == 3
    cache.free_sequence(1)
    assert cache.stats().pages_in_use == 0
    assert 1 not in cache and len(cache) == 0


def test_fork_shares_and_frees_by_reference_count(cache: KVCache) -> None:
    cache.add_sequence(0, num_tokens=8)  # two full pages
    for beam in range(1, 4):
        cache.fork(0, beam)
    s = cache.stats()
    assert (s.pages_in_use, s.pages_shared, s.pages_logical) == (2, 2, 8)
    assert s.shared_saved_bytes == 6 * cache.page_bytes
    cache.append_many([0, 1, 2, 3])  # full last pages: a fresh page each, no copy
    s = cache.stats()
    assert (s.pages_in_use, s.copies) == (6, 0)
    cache.free_sequence(0)
    assert cache.stats().pages_in_use == 5
    for beam in range(1, 4):
        cache.free_sequence(beam)
    assert cache.stats().pages_in_use == 0


def forked_with_pages(capacity: int | None) -> tuple[KVCache, bytes, bytes]:
    """A cache whose sequence 0 holds a full page 0 and a half-full page 1, each filled with a
    distinct pattern (returned), forked into sequence 1."""
    c = make_cache(capacity_tokens=capacity)
    c.add_sequence(0, num_tokens=6)  # page 0 full, page 1 half full
    page0, page1 = bytes(range(c.page_bytes)), bytes(reversed(range(c.page_bytes)))
    c.write_page(0, 0, page0)
    c.write_page(0, 1, page1)
    c.fork(0, 1)
    return c, page0, page1


@pytest.mark.parametrize("capacity", [64, None])
def test_copy_on_write_byte_for_byte(capacity: int | None) -> None:
    c, page0, page1 = forked_with_pages(capacity)
    c.append(1)  # copies the shared half-full page first
    assert c.stats().copies == 1
    t0, t1 = c.block_table(0), c.block_table(1)
    assert t0[0] == t1[0] and t0[1] != t1[1]
    assert c.read_page(1, 1) == page1, "the copy holds the parent's bytes"
    c.write_page(1, 1, b"\xff" * 16, at=2 * c.bytes_per_token)  # the child's new token
    assert c.read_page(0, 1) == page1, "the parent never sees its fork's tokens"
    assert c.read_page(1, 0) == page0
    c.append(0)  # the parent's page is its own again: no copy
    assert c.stats().copies == 1


@pytest.mark.parametrize("capacity", [64, None])
def test_a_page_other_sequences_hold_is_not_written(capacity: int | None) -> None:
    c, page0, page1 = forked_with_pages(capacity)
    c.fork(0, 2)
    before = (c.pages(), c.stats())
    for seq, index in ((1, 0), (0, 0), (2, 1), (0, 1)):
        with pytest.raises(npumem.InvalidArgumentError, match="shared with 2 other sequence"):
            c.write_page(seq, index, b"\xee" * 4, at=4)
    assert (c.pages(), c.stats()) == before
    assert all(c.read_page(s, 0) == page0 and c.read_page(s, 1) == page1 for s in (0, 1, 2))
    c.append(1)  # the shared last page is copied first: the copy is sequence 1's alone
    c.write_page(1, 1, b"\xff" * 16, at=2 * c.bytes_per_token)
    assert c.read_page(0, 1) == page1 == c.read_page(2, 1)
    with pytest.raises(npumem.InvalidArgumentError, match="shared with 1 other sequence"):
        c.write_page(2, 1, b"\xee")  # still held by sequences 0 and 2
    c.free_sequence(0)
    c.free_sequence(2)
    c.write_page(1, 0, page1)  # sequence 1 is the last holder of page 0: its own now
    assert c.read_page(1, 0) == page1


def test_device_pool_copies_through_the_mover() -> None:
    pool = npumem.Pool(4 << 20, cores=1, backing="none")
    copies: list[list[tuple[int, int, int]]] = []
    c = KVCache(pool, page_tokens=4, capacity_tokens=64, mover=copies.append, **SHAPE)
    c.add_sequence(0, num_tokens=2)
    c.fork(0, 1)
    c.append(1)
    ((src, dst, n),) = copies[0]
    assert (src, dst, n) == (c.block_table(0)[0], c.block_table(1)[0], c.page_bytes)


def test_failing_mover_changes_nothing() -> None:
    pool = npumem.Pool(4 << 20, cores=1, backing="none")

    def broken(_: object) -> None:
        raise RuntimeError("device copy failed")

    c = KVCache(pool, page_tokens=4, capacity_tokens=64, mover=broken, **SHAPE)
    c.add_sequence(0, num_tokens=2)
    c.fork(0, 1)
    before = c.stats()
    with pytest.raises(RuntimeError, match="device copy failed"):
        c.append(1)
    assert c.stats() == before and c.num_tokens(1) == 2


def test_out_of_memory_changes_nothing(cache: KVCache) -> None:
    if cache.capacity_tokens is None:
        cache = make_cache(capacity_tokens=None, pool_bytes=1 << 20)
    cache.add_sequence(0, num_tokens=1)
    cache.add_sequence(1, num_tokens=4)
    cache.fork(0, 2)
    tables = {s: cache.block_table(s).tolist() for s in (0, 1, 2)}
    before = cache.stats()
    free_pages = before.pages_free
    huge = (free_pages + 1) * cache.page_tokens
    assert not cache.can_add(huge)
    assert not cache.can_append(1, huge)
    with pytest.raises(npumem.OutOfMemoryError):
        cache.add_sequence(3, num_tokens=huge)
    with pytest.raises(npumem.OutOfMemoryError):
        cache.append(1, huge)
    with pytest.raises(MemoryError):
        cache.append_many([0, 1, 2], huge // 3 + cache.page_tokens)
    assert 3 not in cache
    assert {s: cache.block_table(s).tolist() for s in (0, 1, 2)} == tables
    after = cache.stats()
    assert (after.pages_in_use, after.tokens, after.copies) == (
        before.pages_in_use,
        before.tokens,
        0,
    )
    assert cache.can_append(1, 4) and cache.can_add(4)


def test_on_demand_pages_free_are_the_pages_the_pool_can_still_hand_out() -> None:
    # Pages on demand are slab objects here: the free count covers the free objects of the
    # slabs in use as well as what the free bytes would carve, so exactly that many fit.
    for pool_bytes in (1 << 20, 4 << 20):
        cache = make_cache(capacity_tokens=None, pool_bytes=pool_bytes)
        cache.add_sequence(0, num_tokens=1)
        cache.add_sequence(1, num_tokens=5 * cache.page_tokens)
        cache.fork(0, 2)
        free = cache.stats().pages_free
        assert free > 0 and cache.can_add(free * cache.page_tokens)
        assert not cache.can_add((free + 1) * cache.page_tokens)
        cache.add_sequence(3, num_tokens=free * cache.page_tokens)
        assert cache.stats().pages_free == 0
        with pytest.raises(npumem.OutOfMemoryError):
            cache.add_sequence(4, num_tokens=cache.page_tokens)


@pytest.mark.parametrize("page_bytes", [2, 48, 5000, 70_000])
def test_on_demand_pages_free_count_what_a_page_takes_of_the_pool(page_bytes: int) -> None:
    # A page of 2 or 48 bytes is a slab object of the pool's default alignment (64 bytes); one
    # of 5,000 takes 5,120 bytes and the rest of its last bank; one of 70,000 takes 72 KiB.
    pool = npumem.Pool(4 << 20, cores=1, backing="none")
    cache = KVCache(
        pool,
        page_tokens=1,
        capacity_tokens=None,
        num_layers=1,
        num_kv_heads=1,
        head_dim=page_bytes // 2,
        dtype_bytes=1,
    )
    assert cache.page_bytes == page_bytes
    estimate = cache.stats().pages_free
    assert cache.can_add(estimate) and not cache.can_add(estimate + 1)
    cache.add_sequence(0, num_tokens=1)
    fits = 1
    while True:
        try:
            cache.append(0, 1)
        except MemoryError:
            break
        fits += 1
    # An estimate: never fewer than fit, at most 1/16 more (the holes at chunk ends).
    assert fits <= estimate <= fits + fits // 16, (estimate, fits)


def test_on_evict_preempts_and_retries() -> None:
    c = make_cache(capacity_tokens=16)  # 4 pages
    c.add_sequence(0, num_tokens=8)
    c.add_sequence(1, num_tokens=8)
    asked: list[int] = []

    def evict(pages_needed: int) -> bool:
        asked.append(pages_needed)
        victims = c.sequences()
        if not victims:
            return False
        c.free_sequence(victims[0])
        return True

    c.on_evict = evict
    c.add_sequence(2, num_tokens=8)
    assert asked == [2] and c.sequences() == [1, 2]
    assert c.stats().evictions == 1
    c.on_evict = lambda _: False
    with pytest.raises(npumem.OutOfMemoryError):
        c.append(2, 16)
    assert c.on_evict is not None


@pytest.mark.parametrize("capacity_tokens", [16, None])
def test_an_on_evict_that_raises_is_the_cause_of_the_out_of_memory_error(
    capacity_tokens: int | None,
) -> None:
    c = make_cache(capacity_tokens=capacity_tokens, pool_bytes=1 << 20)
    with pytest.raises(npumem.OutOfMemoryError):  # fill the cache (or the pool)
        for seq in range(1 << 20):
            c.add_sequence(seq, num_tokens=8)
    before = (c.sequences(), c.stats().pages_in_use)
    new_id = 1 << 21  # an id no sequence has

    def broken(pages_needed: int) -> bool:
        raise ZeroDivisionError(pages_needed)

    c.on_evict = broken
    for call in (lambda: c.add_sequence(new_id, num_tokens=8), lambda: c.append_many({0: 64})):
        with pytest.raises(npumem.OutOfMemoryError) as caught:
            call()
        assert isinstance(caught.value.__cause__, ZeroDivisionError)
        assert (c.sequences(), c.stats().pages_in_use) == before

    def interrupted(pages_needed: int) -> bool:
        raise KeyboardInterrupt

    c.on_evict = interrupted
    with pytest.raises(KeyboardInterrupt):
        c.add_sequence(new_id, num_tokens=8)
    assert (c.sequences(), c.stats().pages_in_use) == before


def test_misuse_gets_typed_errors(cache: KVCache) -> None:
    cache.add_sequence(1)
    with pytest.raises(npumem.InvalidArgumentError, match="is in the KV cache already"):
        cache.add_sequence(1)
    with pytest.raises(npumem.InvalidArgumentError, match="no sequence 9"):
        cache.append(9)
    with pytest.raises(npumem.InvalidArgumentError, match="no sequence 9"):
        cache.free_sequence(9)
    with pytest.raises(npumem.InvalidArgumentError):
        cache.fork(9, 10)
    with pytest.raises(npumem.InvalidArgumentError):
        cache.fork(1, 1)
    with pytest.raises(npumem.ArgumentTypeError):
        cache.append("1")  # type: ignore[arg-type]
    with pytest.raises(npumem.ArgumentTypeError):
        cache.append(1.0)  # type: ignore[arg-type]
    with pytest.raises(npumem.ArgumentTypeError):
        cache.append(True)
    with pytest.raises(npumem.InvalidArgumentError):
        cache.append(1, -1)
    with pytest.raises(npumem.InvalidArgumentError, match="twice"):
        cache.append_many([1, 1])
    with pytest.raises(npumem.InvalidArgumentError, match="counts for"):
        cache.append_many([1], [1, 2])
    with pytest.raises(npumem.ArgumentTypeError):
        cache.append_many(5)  # type: ignore[arg-type]
    with pytest.raises(npumem.InvalidArgumentError, match="no page"):
        cache.read_page(1, 0)
    assert cache.num_tokens(1) == 0
    pool = npumem.Pool(1 << 20, cores=1)
    with pytest.raises(npumem.ArgumentTypeError):
        KVCache("pool", **SHAPE)  # type: ignore[arg-type]
    with pytest.raises(npumem.InvalidArgumentError):
        KVCache(pool, num_layers=0, num_kv_heads=1, head_dim=8)
    with pytest.raises(npumem.RequestTooLargeError):
        KVCache(pool, capacity_tokens=1 << 40, **SHAPE)
    with pytest.raises(npumem.ArgumentTypeError):
        KVCache(pool, on_evict=3, **SHAPE)  # type: ignore[arg-type]


def test_a_cache_too_large_for_the_pool_says_how_many_bytes_it_asked_for() -> None:
    """Its `RequestTooLargeError` carries the bytes asked for (exact, also beyond 64 bits) and
    the pool's free figures, as any `OutOfMemoryError` does."""
    pool = npumem.Pool(1 << 20, cores=1)
    held = pool.alloc(4096)
    free = pool.stats()
    big = 1 << 40
    cases = [
        (dict(num_layers=big, num_kv_heads=big, head_dim=8), big * big * 8 * 2 * 2),
        (dict(num_layers=64, num_kv_heads=64, head_dim=64, page_tokens=16), 64**3 * 2 * 2 * 16),
        (dict(capacity_tokens=1 << 40, **SHAPE), None),
    ]
    for shape, requested in cases:
        with pytest.raises(npumem.RequestTooLargeError) as raised:
            KVCache(pool, **shape)  # type: ignore[arg-type]
        err = raised.value
        assert isinstance(err, npumem.OutOfMemoryError)
        assert err.requested is not None and err.requested > pool.capacity
        if requested is not None:
            assert err.requested == requested
        assert err.bytes_free == free.bytes_free
        assert err.largest_free_block == free.largest_free_block
    held.free()
    pool.check()


@pytest.mark.parametrize(
    "field",
    ["num_layers", "num_kv_heads", "head_dim", "dtype_bytes", "page_tokens", "capacity_tokens"],
)
@pytest.mark.parametrize("value", [0, -1, -(1 << 70), 1 << 64])
def test_shape_arguments_state_the_rule_they_break(field: str, value: int) -> None:
    pool = npumem.Pool(8 << 20, cores=1)
    shape = dict(num_layers=2, num_kv_heads=2, head_dim=16)
    shape[field] = value
    rule = f"{field} must be an int > 0 that fits in 64 bits, got {value}"
    with pytest.raises(npumem.InvalidArgumentError, match=re.escape(rule)):
        KVCache(pool, **shape)
    assert pool.stats().blocks_in_use == 0


def test_append_many_accepts_numpy_and_counts(cache: KVCache) -> None:
    for s in range(4):
        cache.add_sequence(s)
    cache.append_many(np.arange(4, dtype=np.int64), np.array([1, 2, 3, 4], dtype=np.int64))
    assert [cache.num_tokens(s) for s in range(4)] == [1, 2, 3, 4]
    cache.append_many((0, 1), 5)
    assert cache.num_tokens(0) == 6


def test_close_gives_every_page_back(cache: KVCache) -> None:
    pool = cache.pool
    cache.add_sequence(0, num_tokens=30)
    cache.fork(0, 1)
    cache.close()
    assert pool.stats().bytes_in_use == 0
    assert cache.closed
    with pytest.raises(npumem.InvalidHandleError):
        cache.append(0)
    cache.close()
    c = make_cache(capacity_tokens=None)
    p = c.pool
    c.add_sequence(0, num_tokens=30)
    del c
    gc.collect()
    assert p.stats().bytes_in_use == 0


def test_truth_is_holding_a_sequence_and_a_closed_cache_is_false(cache: KVCache) -> None:
    assert not cache
    cache.add_sequence(0, num_tokens=5)
    assert cache
    cache.close()
    # A truth test does not refuse a closed cache; len() and `in` do, as every other call.
    assert not cache
    assert bool(cache) is False
    with pytest.raises(npumem.InvalidHandleError, match="closed"):
        len(cache)
    with pytest.raises(npumem.InvalidHandleError, match="closed"):
        _ = 0 in cache


@pytest.mark.parametrize("capacity", [64, None])
def test_block_tables_follow_compaction(capacity: int | None) -> None:
    c = make_cache(capacity_tokens=capacity, page_tokens=2)
    pool = c.pool
    fillers = [pool.alloc(4096) for _ in range(64)]
    c.add_sequence(0, num_tokens=20)
    for i in range(c.num_pages(0)):
        c.write_page(0, i, bytes([i]) * c.page_bytes)
    for f in fillers:
        f.free()
    with pool.pause() as p:
        pool.compact_step(p, "full")
    assert pool.check() > 0
    table = c.block_table(0)
    assert len(set(table.tolist())) == len(table)
    for i in range(c.num_pages(0)):
        assert c.read_page(0, i) == bytes([i]) * c.page_bytes
    assert {b.offset for b in pool.blocks() if b.tag == "kv"} >= (
        set(table.tolist()) if capacity is None else {int(table.min())}
    )


def test_pages_by_state() -> None:
    c = make_cache(capacity_tokens=16)
    c.add_sequence(0, num_tokens=6)
    c.fork(0, 1)
    c.add_sequence(2, num_tokens=1)
    refs = sorted(r for _, r in c.pages())
    assert refs == [0, 1, 2, 2]
    assert "KVCache" in repr(c)


def test_sequences_evicted_during_a_batch_drop_out_of_it() -> None:
    c = make_cache(capacity_tokens=16)  # 4 pages
    for s in range(4):
        c.add_sequence(s, num_tokens=4)  # every page full

    def evict(_: int) -> bool:
        c.free_sequence(c.sequences()[-1])
        return True

    c.on_evict = evict
    c.append_many([0, 1, 2, 3])  # 4 pages needed: two evictions leave 0 and 1 with a page each
    assert c.sequences() == [0, 1]
    assert [c.num_tokens(s) for s in (0, 1)] == [5, 5]
    assert c.stats().evictions == 2


def beams_sharing_a_half_full_page(capacity: int) -> KVCache:
    """Beams 0, 1 and 2 share a full page and a half-full one; sequence 9 holds two full
    pages; one page of the reservation is free."""
    c = make_cache(capacity_tokens=capacity)  # capacity / 4 pages
    c.add_sequence(0, num_tokens=6)
    c.fork(0, 1)
    c.fork(0, 2)
    c.add_sequence(9, num_tokens=8)
    c.add_sequence(10, num_tokens=4 * (capacity // 4 - 5))
    assert c.stats().pages_free == 1
    return c


def test_on_evict_is_told_the_pages_a_batch_takes() -> None:
    c = beams_sharing_a_half_full_page(capacity=24)
    asked: list[int] = []
    c.on_evict = lambda pages_needed: asked.append(pages_needed) or False
    before = (c.pages(), c.stats())
    with pytest.raises(npumem.OutOfMemoryError, match="needs 2 page"):
        c.append_many([0, 1, 2])  # two copies: the last beam appends in place
    assert asked == [2]
    assert (c.pages(), c.stats()) == before


def test_a_preempted_beam_that_frees_no_page_still_shrinks_the_batch() -> None:
    """Beam 2 holds only pages that beams 0 and 1 hold too: freeing it frees no page, but the
    batch then needs one copy instead of two, which the free page covers."""
    c = beams_sharing_a_half_full_page(capacity=24)

    def preempt(_: int) -> bool:
        c.free_sequence(2)
        return True

    c.on_evict = preempt
    c.append_many([0, 1, 2])
    assert c.sequences() == [0, 1, 9, 10]
    assert [c.num_tokens(s) for s in (0, 1)] == [7, 7]
    assert c.stats().copies == 1 and c.stats().evictions == 1


@pytest.mark.parametrize("capacity", [64, None], ids=["reserved", "on-demand"])
def test_a_mover_that_raises_memory_error_calls_no_on_evict(capacity: int | None) -> None:
    """Only a shortage of pages calls `on_evict`: a device copy that fails with a MemoryError
    fails the call as it is, and nothing changes."""
    pool = npumem.Pool(4 << 20, cores=1, chunk_size=1 << 20, backing="none")
    moves: list[object] = []
    evicted: list[int] = []

    def mover(transfers: object) -> None:
        moves.append(transfers)
        raise MemoryError("the device copy failed")

    c = KVCache(pool, page_tokens=4, capacity_tokens=capacity, mover=mover, **SHAPE)
    c.add_sequence(0, num_tokens=6)
    c.fork(0, 1)
    c.add_sequence(5, num_tokens=4)
    c.on_evict = lambda n: evicted.append(n) or (c.free_sequence(5) if 5 in c else None) or True
    before = (c.pages(), c.stats())
    with pytest.raises(MemoryError, match="the device copy failed") as raised:
        c.append(1)
    assert not isinstance(raised.value, npumem.OutOfMemoryError)
    assert len(moves) == 1 and evicted == []
    assert (c.pages(), c.stats()) == before and c.sequences() == [0, 1, 5]


@pytest.mark.parametrize("capacity", [256, None], ids=["reserved", "on-demand"])
def test_pages_count_under_the_cache_tag(capacity: int | None) -> None:
    """The cache's blocks count under its tag in `by_tag`, from the first page to the close, and
    the rows add up to the pool's figures."""
    cache = make_cache(capacity_tokens=capacity, tag="kv-test")
    pool = cache.pool
    loose = pool.alloc(5000)

    def rows() -> dict[str | None, tuple[int, int]]:
        stats = pool.stats()
        assert sum(t.blocks_in_use for t in stats.by_tag) == stats.blocks_in_use
        assert sum(t.requested_bytes_in_use for t in stats.by_tag) == stats.requested_bytes_in_use
        return {t.tag: (t.blocks_in_use, t.requested_bytes_in_use) for t in stats.by_tag}

    page = cache.stats().page_bytes
    reserved = (1, 256 // 4 * page) if capacity else (0, 0)
    # A tag shows once a block has carried it.
    assert rows() == ({"kv-test": reserved, None: (1, 5000)} if capacity else {None: (1, 5000)})
    cache.add_sequence(1, num_tokens=9)
    assert rows()["kv-test"] == (reserved if capacity else (3, 3 * page))
    cache.free_sequence(1)
    assert rows()["kv-test"] == reserved
    cache.add_sequence(2, num_tokens=5)
    cache.close()
    assert rows() == {"kv-test": (0, 0), None: (1, 5000)}
    loose.free()


def test_the_closed_flag_and_repr_answer_from_the_caches_own_callbacks() -> None:
    # Reading `closed` from the pool's out-of-memory handler, which an allocation of the cache
    # runs while it holds the cache, waited for that allocation: forever, and Ctrl-C did not
    # stop it. It is a flag now; repr says the cache is busy.
    import threading

    pool = npumem.Pool(1 << 20, cores=1)
    cache = KVCache(pool, page_tokens=4, **SHAPE)  # pages on demand
    seen: list[tuple[bool, str]] = []
    pool.set_oom_handler(lambda n: seen.append((cache.closed, repr(cache))))
    raised: list[BaseException] = []

    def fill() -> None:
        try:
            for i in range(10**6):
                cache.add_sequence(i, 8)
        except npumem.OutOfMemoryError as e:
            raised.append(e)

    worker = threading.Thread(target=fill, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the handler's read of the cache hung"
    assert raised and seen
    assert seen[0][0] is False and seen[0][1].startswith("<npumem.kv.KVCache busy")
    pool.set_oom_handler(None)
    cache.close()
    assert cache.closed and "closed" in repr(cache)
    pool.check()


def test_closed_caches_give_their_tag_back() -> None:
    # Each cache held its tag for good: 2,000 short-lived caches kept 2,000 names interned.
    pool = npumem.Pool(4 << 20, cores=1)
    for i in range(1500):
        KVCache(pool, page_tokens=4, tag=f"request-{i}", **SHAPE).close()
    for i in range(1500, 2000):
        KVCache(pool, page_tokens=4, tag=f"request-{i}", **SHAPE)  # dropped, not closed
    for i in range(2000, 3500):  # more reserved pages than the pool holds: never made
        with pytest.raises(npumem.OutOfMemoryError):
            KVCache(pool, page_tokens=4, capacity_tokens=1 << 20, tag=f"request-{i}", **SHAPE)
    gc.collect()
    assert pool._tags_interned() <= 63 + 1024 + 1
    assert pool.stats().blocks_in_use == 0
    pool.check()


def test_write_page_takes_any_contiguous_buffer_and_typed_offsets() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    cache = KVCache(pool, page_tokens=4, capacity_tokens=16, **SHAPE)
    cache.add_sequence(0, 4)
    for data in (bytearray(b"cd"), memoryview(b"ef"), np.frombuffer(b"gh", dtype=np.uint8)):
        cache.write_page(0, 0, data, at=2)  # a bytearray used to be a plain TypeError
        assert bytes(cache.read_page(0, 0)[2:4]) == bytes(data)
    for at, error in ((-1, npumem.InvalidArgumentError), (2**64, npumem.InvalidArgumentError)):
        with pytest.raises(error, match="at must be an int >= 0"):  # was OverflowError
            cache.write_page(0, 0, b"x", at=at)
    with pytest.raises(npumem.ArgumentTypeError, match="at must be an int, got float"):
        cache.write_page(0, 0, b"x", at=1.0)
    with pytest.raises(npumem.ArgumentTypeError, match="contiguous buffer"):
        cache.write_page(0, 0, np.arange(4, dtype=np.uint8)[::2])
    cache.close()


def test_append_many_takes_a_numpy_count_and_refuses_bytes_as_ids() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    cache = KVCache(pool, page_tokens=4, capacity_tokens=64, **SHAPE)
    cache.add_sequence(0, 2)
    cache.add_sequence(1, 2)
    cache.append_many([0, 1], np.int64(3))  # as append() takes it
    assert (cache.num_tokens(0), cache.num_tokens(1)) == (5, 5)
    with pytest.raises(npumem.ArgumentTypeError, match="seq_ids must be a sequence of ints"):
        cache.append_many(b"\x00\x01")  # was read as the ids 0 and 1
    assert (cache.num_tokens(0), cache.num_tokens(1)) == (5, 5)
    cache.close()


def test_int_arguments_take_index_objects_and_pass_their_exceptions_on() -> None:
    class Seven:
        def __index__(self) -> int:
            return 7

    class Interrupting:
        def __index__(self) -> int:
            raise KeyboardInterrupt

    class Huge:
        def __index__(self) -> int:
            return 1 << 70

    c = make_cache()
    c.add_sequence(Seven(), Seven())  # type: ignore[arg-type]
    c.append(7, Seven())  # type: ignore[arg-type]
    assert c.num_tokens(7) == 14
    for args in [(Interrupting(), 3), (1, Interrupting())]:
        with pytest.raises(KeyboardInterrupt):
            c.add_sequence(*args)  # type: ignore[arg-type]
    with pytest.raises(npumem.InvalidArgumentError, match="outside the signed 64-bit range"):
        c.add_sequence(Huge(), 3)  # type: ignore[arg-type]
    with pytest.raises(npumem.InvalidArgumentError, match="fits in 64 bits"):
        c.append(7, Huge())  # type: ignore[arg-type]
    assert c.num_tokens(7) == 14
    assert len(c) == 1
    c.pool.check()


def test_a_subclass_passes_the_shape_through_super_init() -> None:
    class Traced(KVCache):
        def __init__(self, pool: npumem.Pool, **shape: int) -> None:
            super().__init__(pool, **shape)
            self.made = True

    pool = npumem.Pool(1 << 20, cores=1)
    c = Traced(pool, num_layers=1, num_kv_heads=1, head_dim=8)
    assert c.made and c.bytes_per_token == 2 * 1 * 8 * 2
    c.add_sequence(1, 5)
    assert c.num_tokens(1) == 5


def test_a_sequence_longer_than_the_table_can_hold_is_too_large_with_figures(
    cache: KVCache,
) -> None:
    """Past 2^32 - 1 pages a sequence is refused with the figures of an out-of-memory error:
    the bytes its tokens ask for (exact beyond 64 bits) and what is free for the cache."""
    pool = cache.pool
    limit = (2**32 - 1) * cache.page_tokens
    cache.add_sequence(0, num_tokens=5)
    before = (cache.stats(), pool.stats().bytes_in_use)
    reserved = cache.capacity_tokens is not None
    free_bytes = before[0].pages_free * cache.page_bytes if reserved else pool.stats().bytes_free
    cases = [
        (lambda: cache.append(0, 2**62), 5 + 2**62),
        (lambda: cache.append(0, 2**64 - 1), 5 + 2**64 - 1),  # the sum passes 64 bits
        (lambda: cache.append_many([0], [limit]), 5 + limit),
        (lambda: cache.add_sequence(1, limit + 1), limit + 1),
        (lambda: cache.can_append(0, limit), 5 + limit),
    ]
    for call, tokens in cases:
        with pytest.raises(
            npumem.RequestTooLargeError, match=f"would hold {tokens} tokens"
        ) as raised:
            call()
        err = raised.value
        assert f"at most {limit}" in str(err)
        assert err.requested == tokens * cache.bytes_per_token
        assert err.bytes_free == free_bytes
        assert err.largest_free_block is not None
        assert (cache.stats(), pool.stats().bytes_in_use) == before


def test_append_many_refuses_counts_without_an_order_or_shape() -> None:
    cache = make_cache(capacity_tokens=None)
    cache.add_sequence(0)
    cache.add_sequence(1)
    before = cache.stats()
    with pytest.raises(npumem.ArgumentTypeError, match="an int or a sequence of ints, got float"):
        cache.append_many([0, 1], 2.0)  # type: ignore[arg-type]
    with pytest.raises(npumem.ArgumentTypeError, match="unordered set"):
        cache.append_many([0, 1], {1, 2})  # type: ignore[arg-type]
    with pytest.raises(npumem.ArgumentTypeError, match="unordered frozenset"):
        cache.append_many(frozenset([0, 1]))  # type: ignore[arg-type]
    with pytest.raises(npumem.InvalidArgumentError, match="one-dimensional, got an array of 2"):
        cache.append_many(np.array([[0], [1]], dtype=np.int64))
    with pytest.raises(npumem.InvalidArgumentError, match="one-dimensional"):
        cache.append_many([0, 1], np.ones((2, 1), dtype=np.int64))
    assert cache.stats() == before
