"""Pool growth from Python: `Pool(capacity, max_capacity=, grow_by=, on_grow=, on_trim=)`.

Regions added on demand, `on_grow` that fails (OutOfMemoryError with the hook's exception as
its cause, nothing changed, a later growth works), trim, stats and snapshots across regions,
bad arguments, and growth racing with allocations on other threads.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import npumem
from npumem.errors import ArgumentTypeError, ConfigError, OutOfMemoryError

MIB = 1 << 20


def _inside_one_region(pool: npumem.Pool) -> None:
    regions = pool.regions()
    for b in pool.blocks():
        assert any(o <= b.offset and b.offset + b.block_bytes <= o + n for o, n in regions), (
            b,
            regions,
        )


def test_a_growth_that_would_leave_less_than_a_step_takes_the_rest() -> None:
    # 4 MiB present, up to 14 MiB, by 4 MiB: the first growth leaves 6 MiB (more than a step),
    # the second would leave 2 MiB, so it takes all 6; then the pool cannot grow.
    pool = npumem.Pool(4 * MIB, max_capacity=14 * MIB, grow_by=4 * MIB, cores=1)
    blocks = [pool.alloc(2 * MIB) for _ in range(4)]
    assert [n for _, n in pool.regions()] == [4 * MIB, 4 * MIB]
    blocks.append(pool.alloc(2 * MIB))
    assert [n for _, n in pool.regions()] == [4 * MIB, 4 * MIB, 6 * MIB]
    blocks += [pool.alloc(2 * MIB) for _ in range(2)]
    with pytest.raises(OutOfMemoryError):
        pool.alloc(2 * MIB)
    assert pool.stats().grow_events == 2 and pool.capacity == 14 * MIB
    _inside_one_region(pool)
    for b in blocks:
        b.free()


def test_a_pool_grows_by_regions_within_its_limit() -> None:
    pool = npumem.Pool(4 * MIB, max_capacity=16 * MIB, grow_by=4 * MIB, cores=1)
    assert (pool.capacity, pool.max_capacity, pool.regions()) == (4 * MIB, 16 * MIB, [(0, 4 * MIB)])
    blocks = [pool.alloc(MIB) for _ in range(12)]
    stats = pool.stats()
    assert (stats.capacity, stats.regions, stats.grow_events) == (12 * MIB, 3, 2)
    assert pool.regions()[1] == (6 * MIB, 4 * MIB), "regions are one absent chunk apart"
    _inside_one_region(pool)
    big = pool.alloc(4 * MIB)  # larger than the first region alone
    with pytest.raises(OutOfMemoryError):
        pool.alloc(MIB)
    assert pool.check() == 13
    for b in [*blocks, big]:
        pool.free(b)


def test_growth_on_a_device_calls_on_grow_and_its_failure_changes_nothing() -> None:
    calls: list[tuple[int, int]] = []
    failing = [True]

    def on_grow(offset: int, nbytes: int) -> None:
        calls.append((offset, nbytes))
        if failing[0]:
            raise RuntimeError("the driver has no memory left")

    pool = npumem.Pool(
        2 * MIB, max_capacity=8 * MIB, grow_by=2 * MIB, backing="none", on_grow=on_grow, cores=1
    )
    first = pool.alloc(2 * MIB)
    before = pool.stats()
    with pytest.raises(OutOfMemoryError) as raised:
        pool.alloc(MIB)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "no memory left" in str(raised.value.__cause__)
    after = pool.stats()
    assert (after.capacity, after.regions, after.grow_events) == (
        before.capacity,
        before.regions,
        before.grow_events,
    )
    assert pool.regions() == [(0, 2 * MIB)]
    pool.check()
    failing[0] = False
    second = pool.alloc(MIB)
    assert calls == [(4 * MIB, 2 * MIB), (4 * MIB, 2 * MIB)]
    assert second.offset == 4 * MIB
    assert pool.stats().grow_events == 1
    pool.free(first)
    pool.free(second)


def test_trim_gives_back_free_regions_except_the_first() -> None:
    trimmed: list[tuple[int, int]] = []
    pool = npumem.Pool(
        2 * MIB,
        max_capacity=32 * MIB,
        grow_by=2 * MIB,
        on_trim=lambda o, n: trimmed.append((o, n)),
        cores=1,
    )
    blocks = [pool.alloc(3 * MIB // 2) for _ in range(4)]
    assert pool.stats().regions == 4
    for b in blocks[1:]:
        pool.free(b)
    pool.trim()
    assert pool.stats().regions == 1 and pool.capacity == 2 * MIB
    assert len(trimmed) == 3
    pool.check()
    # Host memory of a trimmed region reads as zeros when the region comes back.
    again = pool.alloc(MIB)
    assert not np.frombuffer(again, dtype=np.uint8).any()
    pool.free(again)
    pool.free(blocks[0])


def test_region_hooks_that_call_the_pool_back_neither_grow_nor_trim_nor_hang() -> None:
    """`on_grow` and `on_trim` run while their thread changes the regions: an allocation from
    inside one finds room without a growth or fails, a trim from inside one gives back no
    region, and neither waits for the change it is part of."""
    seen: list[str] = []
    pool: npumem.Pool | None = None

    def on_grow(_offset: int, _nbytes: int) -> None:
        assert pool is not None
        pool.trim()
        try:
            pool.alloc(3 * MIB // 2)  # needs another region: only a growth could place it
        except OutOfMemoryError:
            seen.append("grow: no growth inside the hook")

    def on_trim(_offset: int, _nbytes: int) -> None:
        assert pool is not None
        regions = pool.regions()
        pool.trim()
        if pool.regions() == regions:
            seen.append("trim: no region given back inside the hook")
        pool.alloc(64).free()

    pool = npumem.Pool(
        2 * MIB, max_capacity=16 * MIB, grow_by=2 * MIB, on_grow=on_grow, on_trim=on_trim, cores=1
    )

    def work() -> None:
        assert pool is not None
        blocks = [pool.alloc(3 * MIB // 2) for _ in range(3)]
        for b in blocks[1:]:
            pool.free(b)
        pool.trim()
        pool.free(blocks[0])

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "a region hook that called the pool back hung"
    assert "grow: no growth inside the hook" in seen
    assert "trim: no region given back inside the hook" in seen
    assert pool.stats().regions <= 3
    pool.check()


def test_a_pause_from_inside_a_region_hook_is_refused_at_once() -> None:
    """A hook runs inside the allocation that grows the pool: a pause (or a snapshot, a check)
    from inside it would wait for that allocation, so it is refused at once."""
    seen: list[tuple[str, float]] = []
    pool: npumem.Pool | None = None

    def on_grow(_offset: int, _nbytes: int) -> None:
        assert pool is not None
        for name, call in (("pause", lambda: pool.pause(5.0)), ("snapshot", pool.snapshot)):
            started = time.monotonic()
            with pytest.raises(npumem.PoolBusyError, match="inside one of the pool's calls"):
                call()
            seen.append((name, time.monotonic() - started))

    pool = npumem.Pool(2 * MIB, max_capacity=8 * MIB, grow_by=2 * MIB, on_grow=on_grow, cores=1)
    blocks = [pool.alloc(3 * MIB // 2) for _ in range(2)]
    assert [name for name, _ in seen] == ["pause", "snapshot"]
    assert all(waited < 1.0 for _, waited in seen), seen
    for b in blocks:
        pool.free(b)
    with pool.pause(1.0):
        pass
    pool.check()


def test_snapshots_list_regions_and_absent_space_is_not_free() -> None:
    pool = npumem.Pool(4 * MIB, max_capacity=16 * MIB, grow_by=4 * MIB, cores=1)
    blocks = [pool.alloc(MIB) for _ in range(5)]
    snap = pool.snapshot()
    assert [(r.offset, r.length) for r in snap.regions] == [(0, 4 * MIB), (6 * MIB, 4 * MIB)]
    assert snap.untracked == ()
    assert snap.bytes_free == snap.stats.bytes_free == 3 * MIB
    for b in blocks:
        pool.free(b)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"max_capacity": 2 * MIB}, ConfigError, "max_capacity"),
        ({"max_capacity": 16 * MIB, "grow_by": 0}, ConfigError, "grow_by"),
        ({"max_capacity": 16 * MIB, "grow_by": -1}, ConfigError, "grow_by"),
        ({"grow_by": MIB}, ConfigError, "grow_by"),
        ({"max_capacity": "big"}, ConfigError, "max_capacity"),
        ({"max_capacity": 16 * MIB, "on_grow": 5}, ArgumentTypeError, "on_grow"),
        ({"max_capacity": 16 * MIB, "on_trim": "x"}, ArgumentTypeError, "on_trim"),
        # Hooks of a pool that never adds or gives back a region would never be called.
        ({"on_grow": print}, ConfigError, "on_grow is called only when the pool adds"),
        ({"on_trim": print}, ConfigError, "on_trim is called only when"),
        ({"max_capacity": 4 * MIB, "on_grow": print}, ConfigError, "give a max_capacity above"),
    ],
)
def test_bad_growth_arguments_are_typed_errors(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        npumem.Pool(4 * MIB, **kwargs)  # type: ignore[arg-type]


def test_a_capacity_that_is_not_whole_chunks_cannot_grow() -> None:
    with pytest.raises(ConfigError, match="multiple of chunk_size"):
        npumem.Pool(3 * MIB, max_capacity=16 * MIB)


def churn_with_marks(
    pool: npumem.Pool,
    seed: int,
    *,
    steps: int,
    sizes: list[int],
    keep: int,
    errors: list[BaseException],
) -> None:
    """Allocate `steps` blocks of random `sizes`, each filled with its own mark, freeing a
    random one (its mark checked) whenever more than `keep` are held; check and free the rest
    at the end. A failure goes to `errors` (for the main thread to report)."""
    rng = np.random.default_rng(seed)
    held: list[tuple[npumem.Block, int]] = []
    try:
        for i in range(steps):
            b = pool.alloc(int(rng.choice(sizes)))
            mark = (seed * 1000 + i) % 251
            np.frombuffer(b, dtype=np.uint8)[:] = mark
            held.append((b, mark))
            if len(held) > keep:
                b, mark = held.pop(int(rng.integers(len(held))))
                assert (np.frombuffer(b, dtype=np.uint8) == mark).all()
                pool.free(b)
        for b, mark in held:
            assert (np.frombuffer(b, dtype=np.uint8) == mark).all()
            pool.free(b)
    except BaseException as e:  # reported by the main thread
        errors.append(e)


def test_growth_races_with_allocations_on_other_threads() -> None:
    pool = npumem.Pool(4 * MIB, max_capacity=512 * MIB, grow_by=8 * MIB, cores=4)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        sizes = [200, 5000, 70_000, 900_000, 3 * MIB]
        churn_with_marks(pool, seed, steps=150, sizes=sizes, keep=16, errors=errors)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    stats = pool.stats()
    assert stats.grow_events >= 1 and stats.regions == 1 + stats.grow_events
    assert stats.blocks_in_use == 0
    pool.check()
    pool.trim()
    assert pool.stats().regions == 1
    pool.check()


def test_a_pool_that_cannot_grow_reports_one_region() -> None:
    pool = npumem.Pool(3 * MIB, cores=1)
    assert pool.regions() == [(0, 3 * MIB)]
    assert pool.max_capacity == pool.capacity == 3 * MIB
    stats = pool.stats()
    assert (stats.regions, stats.grow_events) == (1, 0)


def test_snapshot_and_trace_files_of_a_grown_pool_read_back(tmp_path: Path) -> None:
    from npumem.monitor import TraceRecorder, load_snapshot, load_trace

    pool = npumem.Pool(4 * MIB, max_capacity=16 * MIB, grow_by=4 * MIB, cores=1)
    recorder = TraceRecorder(pool)
    recorder.start()
    blocks = [pool.alloc(MIB) for _ in range(10)]
    snap = pool.snapshot()
    assert load_snapshot(snap.save(tmp_path / "s.json")) == snap
    assert snap.config["max_capacity"] == 16 * MIB
    for b in blocks:
        pool.free(b)
    trace = recorder.stop()
    back = load_trace(trace.save(tmp_path / "t.json"))
    assert max(e.offset for e in back.events) >= 6 * MIB, "events in the grown regions"


def test_the_address_map_of_a_grown_pool_shows_every_region() -> None:
    pytest.importorskip("matplotlib")
    from npumem.monitor import plots

    pool = npumem.Pool(4 * MIB, max_capacity=16 * MIB, grow_by=4 * MIB, cores=1)
    blocks = [pool.alloc(MIB) for _ in range(10)]
    snap = pool.snapshot()
    assert plots._extent(snap) == 16 * MIB, "up to the end of the last region"
    assert plots._absent(snap) == [(4 * MIB, 2 * MIB), (10 * MIB, 2 * MIB)]
    for b in blocks:
        pool.free(b)


def test_the_address_map_of_a_grown_pool_draws(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from npumem.monitor import plot_address_map

    pool = npumem.Pool(4 * MIB, max_capacity=16 * MIB, grow_by=4 * MIB, cores=1)
    blocks = [pool.alloc(MIB) for _ in range(10)]
    for color_by in ("tag", "core"):
        path = plot_address_map(pool.snapshot(), tmp_path / f"{color_by}.png", color_by=color_by)
        assert path.stat().st_size > 0
    for b in blocks:
        pool.free(b)


def test_the_out_of_memory_handler_runs_before_the_pool_grows() -> None:
    pool = npumem.Pool(4 * MIB, max_capacity=16 * MIB, grow_by=4 * MIB, cores=1)
    held = [pool.alloc(MIB) for _ in range(4)]
    asked: list[int] = []

    def free_one(nbytes: int) -> bool:
        asked.append(nbytes)
        held.pop().free()
        return True

    pool.set_oom_handler(free_one)
    extra = pool.alloc(MIB)  # the handler's remedy makes room: no region is added
    assert asked == [MIB]
    s = pool.stats()
    assert (s.grow_events, s.regions, s.failed_allocs) == (0, 1, 0)

    def cannot_help(nbytes: int) -> bool:
        asked.append(nbytes)
        return False

    pool.set_oom_handler(cannot_help)
    grown = pool.alloc(MIB)  # the handler cannot help: then the pool grows
    assert asked == [MIB, MIB]
    s = pool.stats()
    assert (s.grow_events, s.regions, s.failed_allocs) == (1, 2, 0)
    for b in [*held, extra, grown]:
        b.free()


@pytest.mark.parametrize(
    "sizes",
    [
        [MIB, 3 * MIB, 5 * MIB],  # a run in a new region, then a request beyond the limit
        [MIB, MIB, MIB, 6 * MIB],  # a buddy block in a new region's chunk
        [1500, 300, MIB, MIB, 64, 6 * MIB],  # slab objects and buddy blocks, then too much
        [3 * MIB, 3 * MIB, 4 * MIB],  # two regions added, then too much
    ],
)
@pytest.mark.parametrize("handler", [False, True])
def test_a_failed_alloc_many_gives_back_the_regions_it_added(
    sizes: list[int], handler: bool
) -> None:
    trimmed: list[tuple[int, int]] = []
    pool = npumem.Pool(
        2 * MIB,
        max_capacity=8 * MIB,
        grow_by=2 * MIB,
        cores=1,
        on_trim=lambda o, n: trimmed.append((o, n)),
    )
    if handler:  # the first try holds growth, the retry after the handler grows
        pool.set_oom_handler(lambda nbytes: False)
    before = pool.stats()
    with pytest.raises(OutOfMemoryError, match="item"):
        pool.alloc_many(sizes)
    after = pool.stats()
    assert pool.regions() == [(0, 2 * MIB)]
    assert (after.capacity, after.regions, after.bytes_in_use, after.blocks_in_use) == (
        before.capacity,
        before.regions,
        0,
        0,
    )
    assert after.grow_events >= 1  # growths stay counted
    assert len(trimmed) == after.grow_events
    pool.check()
    # The pool still grows for a batch that fits.
    fits = pool.alloc_many([MIB, 3 * MIB])
    assert pool.stats().regions == 2
    pool.free_many(fits)


def test_a_failed_alloc_many_keeps_regions_it_did_not_add_and_ones_in_use() -> None:
    pool = npumem.Pool(2 * MIB, max_capacity=16 * MIB, grow_by=2 * MIB, cores=1)
    first = pool.alloc(2 * MIB)
    grown = pool.alloc(2 * MIB)  # a region of an earlier call: kept, although emptied below
    empty_region = pool.alloc(2 * MIB)
    empty_region.free()
    regions = pool.regions()
    assert len(regions) == 3
    with pytest.raises(OutOfMemoryError):
        pool.alloc_many([2 * MIB, 2 * MIB, 16 * MIB])
    assert pool.regions() == regions
    pool.free_many([first, grown])
    pool.check()


def test_failed_alloc_many_racing_with_growth_on_other_threads() -> None:
    """A failed batch gives back only empty regions: blocks that other threads place in the
    regions meanwhile (also in ones the batch added) keep their room and their bytes."""
    pool = npumem.Pool(4 * MIB, max_capacity=256 * MIB, grow_by=4 * MIB, cores=4)
    errors: list[BaseException] = []
    failures = [0]
    stop = threading.Event()

    def failing() -> None:
        try:
            while not stop.is_set():
                # Grows for the first three, then asks for more than the limit leaves.
                with pytest.raises(OutOfMemoryError):
                    pool.alloc_many([MIB, 3 * MIB, 2 * MIB, 254 * MIB])
                failures[0] += 1
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    def work(seed: int) -> None:
        sizes = [300, 70_000, MIB, 3 * MIB]
        churn_with_marks(pool, seed, steps=300, sizes=sizes, keep=6, errors=errors)

    failer = threading.Thread(target=failing)
    workers = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    failer.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    failer.join()
    assert not errors, errors
    assert failures[0] > 0
    stats = pool.stats()
    assert stats.blocks_in_use == 0
    _inside_one_region(pool)
    pool.check()
    pool.trim()
    assert pool.regions() == [(0, 4 * MIB)]


def test_ctrl_c_in_on_grow_goes_through_and_an_on_trim_failure_is_reported() -> None:
    # A KeyboardInterrupt in on_grow came back as an OutOfMemoryError (its __cause__); an
    # on_trim that raised was dropped without a word, its exception left for a later error.
    def interrupted(offset: int, nbytes: int) -> None:
        raise KeyboardInterrupt

    pool = npumem.Pool(
        2 * MIB, max_capacity=8 * MIB, grow_by=2 * MIB, backing="none", on_grow=interrupted
    )
    held = pool.alloc(2 * MIB)
    with pytest.raises(KeyboardInterrupt):
        pool.alloc(MIB)
    assert pool.regions() == [(0, 2 * MIB)] and pool.stats().grow_events == 0
    pool.check()
    pool.free(held)

    def unmap_fails(offset: int, nbytes: int) -> None:
        raise RuntimeError("unmap failed")

    reported: list[BaseException | None] = []
    pool = npumem.Pool(
        2 * MIB, max_capacity=8 * MIB, grow_by=2 * MIB, backing="none", on_trim=unmap_fails
    )
    blocks = [pool.alloc(2 * MIB), pool.alloc(2 * MIB)]
    for b in blocks:
        b.free()
    hook = sys.unraisablehook
    sys.unraisablehook = lambda info: reported.append(info.exc_value)
    try:
        pool.trim()
    finally:
        sys.unraisablehook = hook
    assert len(reported) == 1 and "unmap failed" in str(reported[0])
    assert pool.regions() == [(0, 2 * MIB)]
    full = [pool.alloc(2 * MIB) for _ in range(4)]  # grows back to the maximum
    with pytest.raises(OutOfMemoryError) as raised:
        pool.alloc(MIB)  # fails on this thread: with no stale cause from the trim
    assert raised.value.__cause__ is None
    for b in full:
        b.free()
    pool.check()


def _pool_with_two_free_regions(on_trim: object) -> npumem.Pool:
    """A pool of 2 MiB that grew by two regions of 2 MiB, all free now."""
    pool = npumem.Pool(
        2 * MIB, max_capacity=8 * MIB, grow_by=2 * MIB, backing="none", on_trim=on_trim
    )
    blocks = [pool.alloc(2 * MIB) for _ in range(3)]
    assert pool.stats().grow_events == 2
    for b in blocks:
        b.free()
    return pool


def _spin() -> None:
    """Python code in a loop: where the interpreter runs the signal handlers that are due."""
    for _ in range(1000):
        pass


def test_ctrl_c_in_on_trim_on_the_main_thread_comes_again_once_the_trim_returns() -> None:
    # A KeyboardInterrupt raised in on_trim (a Ctrl-C while the runtime unmapped) went to
    # sys.unraisablehook: the program went on as if no Ctrl-C had come.
    if threading.current_thread() is not threading.main_thread():
        raise AssertionError("signal handlers run on the main thread only")
    seen: list[tuple[int, int]] = []

    def interrupted(offset: int, nbytes: int) -> None:
        seen.append((offset, nbytes))
        raise KeyboardInterrupt

    pool = _pool_with_two_free_regions(interrupted)
    reported: list[BaseException | None] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda info: reported.append(info.exc_value)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.trim()  # the interrupt comes as the call returns
            _spin()
    finally:
        sys.unraisablehook = hook
    assert len(seen) == 2, "the trim goes on: every region given back is told"
    assert reported == [], "the Ctrl-C is not reported as unraisable"
    assert pool.regions() == [(0, 2 * MIB)]
    pool.check()
    _spin()  # delivered once, not again


def test_a_kept_ctrl_c_waits_for_the_outermost_call_not_a_call_inside_a_later_on_trim() -> None:
    # The next on_trim called the binding (here the planner), and the Ctrl-C the first one kept
    # came as that call returned: the second region was never unmapped.
    from npumem.plan import Buffer, Problem
    from npumem.plan.greedy import linear_scan

    calls: list[tuple[str, int]] = []

    def on_trim(offset: int, nbytes: int) -> None:
        calls.append(("start", offset))
        if len(calls) == 1:
            raise KeyboardInterrupt
        linear_scan(Problem([Buffer("x", 0, 1, 8)]))
        _spin()
        calls.append(("unmapped", offset))

    pool = _pool_with_two_free_regions(on_trim)
    with pytest.raises(KeyboardInterrupt):
        pool.trim()
        _spin()
    assert [what for what, _ in calls] == ["start", "start", "unmapped"], calls
    assert pool.regions() == [(0, 2 * MIB)]


def test_a_ctrl_c_in_on_trim_under_a_c_callers_allocation_is_reported_not_kept() -> None:
    # A growth at the limit that a C caller's allocation made (no binding call around it) kept
    # the Ctrl-C with nothing to deliver it, and a later, unrelated call raised it.
    import ctypes

    from npumem import clib
    from npumem.plan import Buffer, Problem
    from npumem.plan.greedy import linear_scan

    def interrupted(offset: int, nbytes: int) -> None:
        raise KeyboardInterrupt

    pool = npumem.Pool(
        2 * MIB, max_capacity=6 * MIB, grow_by=2 * MIB, backing="none", on_trim=interrupted
    )
    blocks = [pool.alloc(2 * MIB) for _ in range(3)]
    for b in blocks[1:]:
        b.free()
    lib = ctypes.CDLL(clib.get_library())
    lib.npumem_alloc_raw.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_uint64),
    ]
    reported: list[BaseException | None] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda info: reported.append(info.exc_value)
    offset = ctypes.c_size_t()
    capsule = pool.c_pool()  # keeps the C handle alive while its pointer is used
    try:
        status = lib.npumem_alloc_raw(
            clib.capsule_pointer(capsule), 4 * MIB, 0, ctypes.byref(offset), None
        )
        _spin()
        linear_scan(Problem([Buffer("x", 0, 1, 8)]))  # an unrelated binding call
        _spin()
    finally:
        sys.unraisablehook = hook
    assert status == 0, "the growth at the limit gave back the free regions and grew"
    assert len(reported) >= 1 and all(isinstance(e, KeyboardInterrupt) for e in reported)
    lib.npumem_free_raw.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    assert lib.npumem_free_raw(clib.capsule_pointer(capsule), offset.value, 4 * MIB) == 0
    blocks[0].free()
    pool.check()


def test_an_interrupt_in_on_trim_that_no_signal_can_deliver_is_reported() -> None:
    # Off the main thread (no signal handler runs there), or with SIGINT ignored, a
    # KeyboardInterrupt in on_trim cannot come again as a signal: it is reported as before.
    import signal

    def interrupted(offset: int, nbytes: int) -> None:
        raise KeyboardInterrupt

    reported: list[BaseException | None] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda info: reported.append(info.exc_value)
    try:
        pool = _pool_with_two_free_regions(interrupted)
        worker = threading.Thread(target=pool.trim)
        worker.start()
        worker.join()
        assert len(reported) == 2 and all(isinstance(e, KeyboardInterrupt) for e in reported)
        assert pool.regions() == [(0, 2 * MIB)]

        reported.clear()
        pool = _pool_with_two_free_regions(interrupted)
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            pool.trim()
            _spin()
        finally:
            signal.signal(signal.SIGINT, before)
        assert len(reported) == 2 and pool.regions() == [(0, 2 * MIB)]
    finally:
        sys.unraisablehook = hook


def test_a_request_larger_than_every_region_is_not_blamed_on_fragmentation() -> None:
    """Free bytes that lie in regions each smaller than the request: no compaction joins them
    (no block spans two regions), and the error says what does make room."""
    from npumem.compaction import Compactor

    pool = npumem.Pool(4 * MIB, max_capacity=16 * MIB, grow_by=2 * MIB, cores=1)
    blocks = [pool.alloc(MIB) for _ in range(12)]
    assert len(pool.regions()) == 5
    for i, blk in enumerate(blocks):
        if i not in (0, 4, 6, 8, 10):  # one block stays in every region
            blk.free()
    with pytest.raises(npumem.OutOfMemoryError) as info:
        pool.alloc(5 * MIB)
    message = str(info.value)
    assert "the largest holds 4.0 MiB" in message and "No compaction makes room" in message
    assert "fragmented" not in message and "compaction may join" not in message
    assert (info.value.bytes_free, info.value.requested) == (7 * MIB, 5 * MIB)
    # What it says holds: a compaction does not make room.
    Compactor(pool).compact()
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(5 * MIB)
    pool.check()


def test_a_growth_that_the_offset_space_cannot_place_is_not_blamed_on_the_limit() -> None:
    """Regions that live blocks keep split the offset space so that no place holds a region
    the limit still allows: the error says so (not "make the pool larger"), and freeing a kept
    region's blocks makes the room."""
    pool = npumem.Pool(2 * MIB, max_capacity=16 * MIB, grow_by=2 * MIB, cores=1, backing="none")
    blocks = []
    while pool.capacity < pool.max_capacity:
        blocks.append(pool.alloc(2 * MIB))
    kept = [b for b in blocks if b.offset in (8 * MIB, 16 * MIB, 24 * MIB)]
    assert len(kept) == 3, [b.offset for b in blocks]
    for b in blocks:
        if b not in kept:
            b.free()
    pool.trim()
    regions = pool.regions()
    with pytest.raises(OutOfMemoryError) as info:
        pool.alloc(8 * MIB)
    message = str(info.value)
    assert "may still grow by 8.0 MiB" in message, message
    assert "offset space has no place" in message, message
    assert "make the pool larger" not in message and "compaction" not in message, message
    assert pool.regions() == regions
    # A handler that tried a remedy in vain: the last try holds growth, and the error still
    # names the cause that the try which could grow found.
    asked = []
    pool.set_oom_handler(lambda n: asked.append(n) or True)
    with pytest.raises(OutOfMemoryError) as info:
        pool.alloc(8 * MIB)
    assert len(asked) == 2 and "may still grow by 8.0 MiB" in str(info.value), (asked, info.value)
    pool.set_oom_handler(None)
    kept[1].free()
    large = pool.alloc(8 * MIB)
    pool.check()
    large.free()
    for b in (kept[0], kept[2]):
        b.free()
    pool.check()


def test_the_offset_space_holds_every_region_and_a_mirror_of_it_every_block() -> None:
    """Offsets of a pool that grows pass `max_capacity` (regions lie a chunk apart); the
    offset space holds them all, and a `HostMirror` of that size keeps a compaction's bytes."""
    from npumem.compaction import HostMirror

    assert npumem.Pool(4 * MIB, cores=1).offset_space == 4 * MIB
    pool = npumem.Pool(16 * MIB, max_capacity=64 * MIB, grow_by=8 * MIB, cores=1, backing="none")
    assert pool.offset_space == 128 * MIB
    blocks = []
    while pool.capacity < pool.max_capacity:
        blocks.append(pool.alloc(3 * MIB))
    assert max(b.offset + b.block_bytes for b in blocks) > pool.max_capacity
    assert all(o + n <= pool.offset_space for o, n in pool.regions())
    mirror = HostMirror(pool.offset_space)
    for i, b in enumerate(blocks):
        mirror.memory[b.offset : b.offset + b.nbytes] = bytes([i % 251 + 1]) * b.nbytes
    for b in blocks[::2]:
        b.free()
    kept = blocks[1::2]
    with pool.pause() as pause:
        report = pool.compact_step(pause, "full", mover=mirror)
    assert report.blocks > 0
    for b in kept:
        i = blocks.index(b)
        assert mirror.memory[b.offset : b.offset + b.nbytes] == bytes([i % 251 + 1]) * b.nbytes
    pool.check()
