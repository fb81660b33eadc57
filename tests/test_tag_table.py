"""The tag table stays bounded by the tags live blocks carry (plus a bounded cache of idle ones),
however many distinct tags a program uses, while the counters by tag stay exact; and blocks
allocated through the C ABI on a pool shared with Python count under their tags too."""

from __future__ import annotations

import contextlib
import ctypes
import threading

import npumem
from npumem import clib
from npumem.kv import KVCache

MIB = 1 << 20
NAMED = 63  # tags with counters of their own
BOUND = NAMED + 1024 + 64  # named tags, idle tags kept, some slack for blocks held


class Handle(ctypes.Structure):
    _fields_ = [
        ("pool_id", ctypes.c_uint32),
        ("slot", ctypes.c_uint32),
        ("generation", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


class CBlock(ctypes.Structure):
    _fields_ = [
        ("handle", Handle),
        ("offset", ctypes.c_size_t),
        ("size", ctypes.c_size_t),
        ("address", ctypes.c_uint64),
    ]


def by_tag(pool: npumem.Pool) -> dict[str | None, tuple[int, int, int]]:
    return {
        t.tag: (t.blocks_in_use, t.requested_bytes_in_use, t.peak_requested_bytes_in_use)
        for t in pool.stats().by_tag
    }


def interned(pool: npumem.Pool) -> int:
    return int(pool._tags_interned())  # type: ignore[attr-defined]


def test_a_million_distinct_tags_keep_the_table_bounded_and_the_counts_right() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    named = [pool.alloc(100, tag=f"named-{i}") for i in range(NAMED)]
    kept = pool.alloc(64, tag="kept")
    for i in range(1_000_000):
        pool.alloc(64, tag=f"request-{i}").free()
        if i % 100_000 == 0:
            assert interned(pool) <= BOUND
    for i in range(200):
        pool.free_many(pool.alloc_many([64] * 10, tag=f"batch-{i}"))
    assert interned(pool) <= BOUND
    tags = by_tag(pool)
    assert tags["named-0"] == (1, 100, 100)
    assert tags["(other tags)"] == (1, 64, 64 + 640)
    assert kept.tag == "kept"
    assert {b.tag for b in pool.blocks()} == {"kept"} | {f"named-{i}" for i in range(NAMED)}
    # A dropped tag comes back under a fresh id, with the right name everywhere.
    again = pool.alloc(64, tag="request-7")
    assert {b.tag for b in pool.blocks()} >= {"kept", "request-7"}
    again.free()
    kept.free()
    pool.free_many(named)
    assert by_tag(pool)["(other tags)"][:2] == (0, 0)
    assert pool.stats().blocks_in_use == 0


def test_a_failed_allocation_holds_no_tag() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    for i in range(NAMED):
        pool.alloc(64, tag=f"named-{i}").free()
    big = pool.alloc(12 * MIB)
    for i in range(5000):
        with contextlib.suppress(npumem.OutOfMemoryError):
            pool.alloc(8 * MIB + i, tag=f"never-{i}")
        with contextlib.suppress(npumem.RequestTooLargeError):
            pool.alloc(32 * MIB, tag=f"too-large-{i}")
    assert interned(pool) <= BOUND
    assert by_tag(pool).get("(other tags)", (0, 0, 0))[:2] == (0, 0)
    big.free()


def test_threads_with_distinct_tags_keep_the_table_bounded() -> None:
    pool = npumem.Pool(32 * MIB, cores=4)
    shared = pool.alloc(64, tag="shared")
    errors: list[BaseException] = []

    def work(w: int) -> None:
        try:
            for i in range(20_000):
                blk = pool.alloc(64 + i % 512, tag=f"w{w}-{i}")
                held = pool.alloc(32, tag="shared")
                blk.free()
                held.free()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert interned(pool) <= BOUND
    tags = by_tag(pool)
    assert tags["shared"][:2] == (1, 64)
    assert sum(blocks for blocks, _, _ in tags.values()) == 1
    shared.free()


def test_tags_stay_readable_in_a_trace_until_drained() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    for i in range(NAMED):
        pool.alloc(64, tag=f"named-{i}").free()
    pool.trace_start(1 << 16)
    for i in range(3000):
        pool.alloc(64, tag=f"t{i}").free()
    pool.trace_stop()
    events = pool.trace_drain()
    allocs = [e[5] for e in events if e[1] == "alloc"]
    assert allocs[:2] == ["t0", "t1"]
    assert allocs[-1] == "t2999"
    pool.alloc(64, tag="after").free()
    for i in range(2000):
        pool.alloc(64, tag=f"u{i}").free()
    assert interned(pool) <= BOUND


def test_an_undrained_trace_keeps_the_tag_table_bounded() -> None:
    """A trace left running as a flight recorder (never drained) overwrites its oldest events:
    the tags only those named are let go, while a quiet thread's ring keeps its events' tags."""
    pool = npumem.Pool(16 * MIB, cores=2)
    for i in range(NAMED):
        pool.alloc(64, tag=f"named-{i}").free()
    pool.trace_start(4096)
    capacity = pool.trace_status().capacity
    bound = NAMED + 1024 + 2 * max(4096, capacity) + 64
    pool.alloc(64).free()  # this thread takes a ring of its own first
    quiet = threading.Thread(target=lambda: pool.alloc(64, tag="quiet").free())
    quiet.start()
    quiet.join()
    n = 200_000
    for i in range(n):
        pool.alloc(128, tag=f"req-{i}").free()
        if i % 20_000 == 0:
            assert interned(pool) <= bound
    assert interned(pool) <= bound
    status = pool.trace_status()
    assert status.recorded == 2 * n + 4
    assert status.dropped >= status.recorded - capacity, "overwritten events count as dropped"
    events = pool.trace_drain()
    assert [e[5] for e in events].count("quiet") == 2
    by_handle: dict[int, set[str]] = {}
    for e in events:
        if e[5] not in (None, "quiet"):
            assert int(e[5].removeprefix("req-")) >= n - capacity, e
            by_handle.setdefault(e[6], set()).add(e[5])
    assert all(len(tags) == 1 for tags in by_handle.values())


def _c_library() -> ctypes.CDLL:
    lib = ctypes.CDLL(clib.get_library())
    lib.npumem_tag_id.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint32)]
    lib.npumem_alloc.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_uint32,
        ctypes.POINTER(CBlock),
    ]
    lib.npumem_free.argtypes = [ctypes.c_void_p, Handle]
    lib.npumem_free_many.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(Handle),
        ctypes.c_size_t,
        ctypes.c_void_p,
    ]
    return lib


def test_c_and_python_allocations_on_one_pool_count_under_their_tags() -> None:
    pool = npumem.Pool(16 * MIB, cores=2)
    capsule = pool.c_pool()
    pointer = clib.capsule_pointer(capsule)
    lib = _c_library()
    weights = ctypes.c_uint32()
    assert lib.npumem_tag_id(pointer, b"weights", ctypes.byref(weights)) == 0
    kv = ctypes.c_uint32()
    assert lib.npumem_tag_id(pointer, b"kv", ctypes.byref(kv)) == 0
    reserved = ctypes.c_uint32()  # the pooled tags' row is no tag's name
    assert lib.npumem_tag_id(pointer, b"(other tags)", ctypes.byref(reserved)) != 0

    from_python = [pool.alloc(1000, tag="weights"), pool.alloc(3000, tag="kv")]
    from_c = []
    for size, tag in ((500, weights), (700, weights), (2000, kv)):
        block = CBlock()
        assert lib.npumem_alloc(pointer, size, 0, tag.value, ctypes.byref(block)) == 0
        from_c.append(block)
    untagged = CBlock()
    assert lib.npumem_alloc(pointer, 100, 0, 0, ctypes.byref(untagged)) == 0

    # The C block without a tag counts with the untagged blocks: the rows add up to the pool.
    assert by_tag(pool) == {"weights": (3, 2200, 2200), "kv": (2, 5000, 5000), None: (1, 100, 100)}
    stats = pool.stats()
    assert sum(t.blocks_in_use for t in stats.by_tag) == stats.blocks_in_use
    assert sum(t.requested_bytes_in_use for t in stats.by_tag) == stats.requested_bytes_in_use
    assert sorted(b.tag or "" for b in pool.blocks()) == [
        "",
        "kv",
        "kv",
        "weights",
        "weights",
        "weights",
    ]

    assert lib.npumem_free(pointer, from_c[0].handle) == 0
    assert lib.npumem_free(pointer, from_c[0].handle) != 0  # a double free counts nothing
    handles = (Handle * 2)(from_c[1].handle, from_c[2].handle)
    assert lib.npumem_free_many(pointer, handles, 2, None) == 0
    assert lib.npumem_free(pointer, untagged.handle) == 0
    assert by_tag(pool) == {"weights": (1, 1000, 2200), "kv": (1, 3000, 5000), None: (0, 0, 100)}
    pool.free_many(from_python)
    assert by_tag(pool) == {"weights": (0, 0, 2200), "kv": (0, 0, 5000), None: (0, 0, 100)}
    del capsule


def test_c_threads_and_python_count_one_shared_tag_exactly() -> None:
    pool = npumem.Pool(32 * MIB, cores=4)
    capsule = pool.c_pool()
    pointer = clib.capsule_pointer(capsule)
    lib = _c_library()
    tag = ctypes.c_uint32()
    assert lib.npumem_tag_id(pointer, b"mixed", ctypes.byref(tag)) == 0
    errors: list[str] = []

    def in_c() -> None:
        block = CBlock()
        for i in range(5000):
            if lib.npumem_alloc(pointer, 64 + i % 4000, 0, tag.value, ctypes.byref(block)) != 0:
                errors.append("C alloc")
                return
            if lib.npumem_free(pointer, block.handle) != 0:
                errors.append("C free")
                return

    def in_python() -> None:
        for i in range(5000):
            pool.alloc(64 + i % 4000, tag="mixed").free()

    threads = [threading.Thread(target=f) for f in (in_c, in_c, in_python, in_python)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    blocks, nbytes, peak = by_tag(pool)["mixed"]
    assert (blocks, nbytes) == (0, 0)
    assert peak >= 64
    del capsule


def test_a_failed_tagged_allocation_leaves_the_counters_by_tag_as_they_were() -> None:
    pool = npumem.Pool(4 << 20, cores=1)
    keep = pool.alloc(100, tag="kept")
    before = pool.stats().as_dict()["by_tag"]
    for attempt in (
        lambda: pool.alloc(4 << 20, tag="weights"),
        lambda: pool.alloc(4 << 20, tag="kept"),
        lambda: pool.alloc_many([100, 4 << 20], tag="weights"),
        lambda: pool.alloc_many([100, 4 << 20], tag="kept"),
    ):
        try:
            attempt()
        except npumem.OutOfMemoryError:
            pass
        else:
            raise AssertionError("the allocation was to fail")
        assert pool.stats().as_dict()["by_tag"] == before
    pool.check()
    keep.free()


def test_under_a_pause_the_rows_by_tag_add_up_to_the_blocks() -> None:
    """An allocation or a free that waits for another thread's pause has not happened yet:
    its tag's row does not count it, so a pause (and a snapshot) sees every row add up."""
    import time

    pool = npumem.Pool(64 * MIB, cores=1)
    kept = pool.alloc(MIB, tag="x")
    going = pool.alloc(MIB, tag="y")
    made: list[npumem.Block] = []
    waiting = [
        threading.Thread(target=lambda: made.append(pool.alloc(100_000, tag="x"))),
        threading.Thread(target=going.free),
    ]

    def rows(stats: npumem.PoolStats) -> dict[str | None, tuple[int, int]]:
        # The untagged row, listed once it has had a block: none here.
        found = {r.tag: (r.blocks_in_use, r.requested_bytes_in_use) for r in stats.by_tag}
        assert found.pop(None, (0, 0)) == (0, 0)
        return found

    with pool.pause(10.0):
        for t in waiting:
            t.start()
        time.sleep(0.3)  # both threads wait for the pause now
        stats = pool.stats()
        assert rows(stats) == {"x": (1, MIB), "y": (1, MIB)}
        assert sum(r.blocks_in_use for r in stats.by_tag) == stats.blocks_in_use == 2
        snap = pool.snapshot()
        assert rows(snap.stats) == rows(stats)
    for t in waiting:
        t.join(10)
    assert rows(pool.stats()) == {"x": (2, MIB + 100_000), "y": (0, 0)}
    for b in [kept, *made]:
        b.free()
    assert rows(pool.stats()) == {"x": (0, 0), "y": (0, 0)}
    pool.check()


def test_a_snapshots_rows_by_tag_add_up_to_its_blocks_while_threads_allocate() -> None:
    """The rows by tag are read under the snapshot's pause with the rest of it, not after."""
    pool = npumem.Pool(64 * MIB, cores=2)
    stop = threading.Event()

    def churn(tag: str) -> None:
        held: list[npumem.Block] = []
        while not stop.is_set():
            held.append(pool.alloc(4096, tag=tag))
            if len(held) > 50:
                for b in held[:25]:
                    b.free()
                del held[:25]
        for b in held:
            b.free()

    threads = [threading.Thread(target=churn, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    try:
        for _ in range(300):
            snap = pool.raw_snapshot()
            rows = snap.stats.by_tag
            in_rows = sum(r.blocks_in_use for r in rows)
            assert in_rows == snap.stats.blocks_in_use == len(snap.blocks)
            for tag in ("a", "b"):
                counted = sum(r.blocks_in_use for r in rows if r.tag == tag)
                assert counted == sum(1 for b in snap.blocks if b.tag == tag), tag
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    pool.check()


def test_the_pooled_tags_row_is_no_tag_name() -> None:
    """A tag named as the pooled tags' row would list that row twice."""
    pool = npumem.Pool(4 * MIB, cores=1)
    for call in (
        lambda: pool.alloc(100, tag="(other tags)"),
        lambda: pool.alloc_many([100, 200], tag="(other tags)"),
    ):
        try:
            call()
        except npumem.InvalidArgumentError as err:
            assert "(other tags)" in str(err)
        else:
            raise AssertionError("a block tagged as the pooled tags' row was made")
    stats = pool.stats()
    assert stats.blocks_in_use == 0 and stats.by_tag == []
    assert stats.failed_allocs == 0
    pool.check()


def test_an_empty_tag_is_refused_as_it_reads_as_no_tag() -> None:
    """Untagged blocks are reported with an empty tag (Prometheus labels, JSON rows)."""
    pool = npumem.Pool(4 * MIB, cores=1)
    for call in (
        lambda: pool.alloc(100, tag=""),
        lambda: pool.alloc_many([100, 200], tag=""),
    ):
        try:
            call()
        except npumem.InvalidArgumentError as err:
            assert "must not be empty" in str(err)
        else:
            raise AssertionError("a block with an empty tag was made")
    stats = pool.stats()
    assert stats.blocks_in_use == 0 and stats.by_tag == []
    assert stats.failed_allocs == 0
    for tag_name in ("", "(other tags)"):
        try:
            KVCache(pool, page_tokens=4, tag=tag_name, num_layers=1, num_kv_heads=1, head_dim=8)
        except npumem.InvalidArgumentError:
            pass
        else:
            raise AssertionError(f"a KV cache tagged {tag_name!r} was made")
    assert pool.stats().blocks_in_use == 0
    tag = ctypes.c_uint32(7)
    lib = _c_library()
    capsule = pool.c_pool()  # the pointer is valid while the capsule lives
    pointer = clib.capsule_pointer(capsule)
    npumem_err_config = 3
    assert lib.npumem_tag_id(pointer, b"", ctypes.byref(tag)) == npumem_err_config
    assert tag.value == 7
    assert lib.npumem_tag_id(pointer, b"ok", ctypes.byref(tag)) == 0 and tag.value != 7
    pool.check()


def test_a_tag_longer_than_the_limit_is_refused_everywhere_and_changes_nothing() -> None:
    """A tag is written with every trace event that names it: its length is bounded, in bytes
    of UTF-8 (a two-byte character counts twice)."""
    pool = npumem.Pool(4 * MIB, cores=1)
    longest = "\u00e9" * (npumem.MAX_TAG_BYTES // 2)
    too_long = longest + "x"
    for call in (
        lambda: pool.alloc(100, tag=too_long),
        lambda: pool.alloc_many([100, 200], tag=too_long),
        lambda: KVCache(
            pool, page_tokens=4, tag=too_long, num_layers=1, num_kv_heads=1, head_dim=8
        ),
    ):
        try:
            call()
        except npumem.InvalidArgumentError as err:
            assert f"{npumem.MAX_TAG_BYTES + 1} bytes long" in str(err), str(err)
        else:
            raise AssertionError("a block with a tag over the limit was made")
    stats = pool.stats()
    assert (stats.blocks_in_use, stats.by_tag, stats.failed_allocs) == (0, [], 0)
    assert interned(pool) == 0
    tag = ctypes.c_uint32(7)
    lib = _c_library()
    capsule = pool.c_pool()  # the pointer is valid while the capsule lives
    pointer = clib.capsule_pointer(capsule)
    npumem_err_config = 3
    assert lib.npumem_tag_id(pointer, too_long.encode(), ctypes.byref(tag)) == npumem_err_config
    assert tag.value == 7 and interned(pool) == 0
    with pool.alloc(100, tag=longest) as blk:
        assert blk.tag == longest
        assert [t.tag for t in pool.stats().by_tag] == [longest]
    pool.check()
