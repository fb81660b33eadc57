"""The public API of npumem.Pool and npumem.Block."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import npumem
from helpers import assert_block_rules

MIB = 1 << 20


def test_facade_exports_the_design_names() -> None:
    for name in [
        "Pool",
        "Block",
        "PoolStats",
        "NpumemError",
        "OutOfMemoryError",
        "InvalidHandleError",
        "DoubleFreeError",
        "ConfigError",
        "CorruptionError",
    ]:
        assert name in npumem.__all__
        assert hasattr(npumem, name)
    assert issubclass(npumem.OutOfMemoryError, MemoryError)
    assert issubclass(npumem.OutOfMemoryError, npumem.NpumemError)
    assert issubclass(npumem.InvalidHandleError, ValueError)
    assert issubclass(npumem.DoubleFreeError, npumem.InvalidHandleError)
    assert issubclass(npumem.ConfigError, ValueError)


def test_pool_attributes_and_defaults() -> None:
    pool = npumem.Pool(64 * MIB, cores=3, name="gpu0")
    assert (pool.capacity, pool.cores, pool.bank_size, pool.chunk_size) == (
        64 * MIB,
        3,
        4096,
        2 * MIB,
    )
    assert (pool.min_block, pool.alignment, pool.backing, pool.name) == (256, 64, "host", "gpu0")
    assert len(pool.slab_sizes) == 80
    assert pool.slab_sizes[:17] == (*range(1, 17), 18) and pool.slab_sizes[-2:] == (3840, 4096)
    assert "gpu0" in repr(pool)
    import os

    assert npumem.Pool(MIB).cores == (os.cpu_count() or 1)


def test_pool_attribute_docstrings_describe_their_attribute() -> None:
    assert npumem.Pool.name.__doc__ == "The pool's name (labels its metrics)."
    base = npumem.Pool.base_address.__doc__ or ""
    assert base.startswith("The address of offset 0") and "name" not in base


def test_alloc_free_and_block_fields() -> None:
    pool = npumem.Pool(16 * MIB, cores=2)
    blk = pool.alloc(1000, tag="act")
    assert blk.alive and blk.nbytes == 1000 and blk.tag == "act" and blk.pool is pool
    assert blk.block_bytes >= 1000 and blk.align == 64 and blk.pins == 0
    assert_block_rules(pool, blk)
    assert "offset=" in repr(blk) and "act" in repr(blk)
    stats = pool.stats()
    assert stats.bytes_in_use == blk.block_bytes
    assert stats.requested_bytes_in_use == 1000
    assert stats.alloc_count == 1 and stats.blocks_in_use == 1
    held = blk.block_bytes
    pool.free(blk)
    assert not blk.alive and "freed" in repr(blk)
    stats = pool.stats()
    assert (stats.bytes_in_use, stats.free_count, stats.blocks_in_use) == (0, 1, 0)
    assert stats.peak_bytes_in_use == held
    with pytest.raises(npumem.InvalidHandleError):
        _ = blk.block_bytes


def test_context_manager_frees_on_exit_even_after_an_error() -> None:
    pool = npumem.Pool(4 * MIB, cores=1)
    with pytest.raises(RuntimeError), pool.alloc(100) as blk:
        raise RuntimeError("boom")
    assert not blk.alive
    with pool.alloc(100) as blk2:
        blk2.free()  # freeing inside the with block is fine
    assert pool.stats().bytes_in_use == 0


def test_buffer_protocol_without_copying() -> None:
    pool = npumem.Pool(4 * MIB, cores=1)
    blk = pool.alloc(4096)
    view = memoryview(blk)
    assert (view.nbytes, view.readonly, view.format) == (4096, False, "B")
    arr = np.frombuffer(blk, dtype=np.float32)
    assert arr.shape == (1024,)
    arr[:] = np.arange(1024, dtype=np.float32)
    assert bytes(view[4:8]) == np.float32(1).tobytes()  # same memory: no copy
    assert blk.pins == 2
    with pytest.raises(npumem.PinnedBlockError, match="pinned"):
        blk.free()
    assert blk.alive
    view.release()
    del arr
    gc.collect()
    assert blk.pins == 0
    blk.free()


def test_blocks_lists_live_blocks_with_tags() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, run_tails=False)  # whole-chunk runs
    a = pool.alloc(100, tag="a")
    b = pool.alloc(3 * MIB)
    listed = pool.blocks()
    assert [d.offset for d in listed] == sorted([a.offset, b.offset])
    by_offset = {d.offset: d for d in listed}
    assert by_offset[a.offset].tag == "a" and by_offset[b.offset].tag is None
    assert by_offset[b.offset].block_bytes == 4 * MIB


def test_alignment_and_banks_for_every_size() -> None:
    pool = npumem.Pool(256 * MIB, cores=2, bank_size=8192)
    held = []
    for size in [
        1,
        63,
        64,
        65,
        255,
        256,
        300,
        4095,
        4096,
        5000,
        8192,
        8193,
        65536,
        400_000,
        MIB,
        3 * MIB,
    ]:
        for align in [None, 1, 64, 512, 4096, 65536, 4 * MIB]:
            blk = pool.alloc(size, align=align)
            assert_block_rules(pool, blk, align)
            held.append(blk)
    pool.check()
    for blk in held:
        blk.free()
    assert pool.stats().bytes_in_use == 0


def test_seed_timeline_last_allocation_succeeds() -> None:
    """The seed articles' timeline that ends in a failed 250 MB allocation elsewhere."""
    pool = npumem.Pool(800 * MIB, cores=2)
    weights_a = pool.alloc(200 * MIB, tag="model A weights")
    act_a = pool.alloc(100 * MIB, tag="model A activations")
    act_a.free()
    weights_b = pool.alloc(300 * MIB, tag="model B weights")
    act_b = pool.alloc(150 * MIB, tag="model B activations")
    weights_b.free()
    last = pool.alloc(250 * MIB, tag="the 250 MiB request")
    assert last.alive
    assert pool.stats().bytes_in_use == 600 * MIB
    pool.check()
    for blk in (weights_a, act_b, last):
        blk.free()


def test_out_of_memory_says_what_is_free() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, run_tails=False)  # whole-chunk runs
    a = pool.alloc(3 * MIB)
    _b = pool.alloc(3 * MIB)  # held: a dropped block is freed
    a.free()
    _c = pool.alloc(MIB)  # held
    with pytest.raises(npumem.OutOfMemoryError) as err:
        pool.alloc(6 * MIB)
    e = err.value
    assert (e.requested, e.bytes_free, e.largest_free_block) == (6 * MIB, 3 * MIB, 2 * MIB)
    assert "6291456" in str(e) and "3145728" in str(e) and "2097152" in str(e)
    assert isinstance(e, MemoryError)
    assert pool.stats().failed_allocs == 1


@pytest.mark.parametrize("size", [4100, 5000, 9000, 70_000])
def test_out_of_memory_finds_the_free_nodes_that_no_bank_boundary_starts(size: int) -> None:
    # Blocks just over a bank each leave the rest of their last bank free: no free stretch
    # starts on a bank boundary, but those rests hold smaller blocks, and the error says so.
    pool = npumem.Pool(16 * MIB, backing="none", cores=1)
    held = []
    with pytest.raises(npumem.OutOfMemoryError) as err:
        while True:
            held.append(pool.alloc(size))
    found = err.value.largest_free_block
    assert err.value.bytes_free > 0
    assert 0 < found <= pool.stats().largest_free_block
    blk = pool.alloc(found)  # a request of the size it names succeeds
    blk.free()
    pool.check()


def test_fragmentation_is_computed_exactly() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, core_reserve=0)
    blocks = [pool.alloc(MIB) for _ in range(8)]
    for blk in blocks[::2]:
        blk.free()
    s = pool.stats()
    assert s.bytes_free == 4 * MIB and s.largest_free_block == MIB
    assert s.external_fragmentation == pytest.approx(1 - 1 / 4)
    for blk in blocks[1::2]:
        blk.free()
    s = pool.stats()
    assert s.external_fragmentation == 0.0 and s.largest_free_block == 8 * MIB


def test_none_backing_hands_out_offsets_only() -> None:
    pool = npumem.Pool(16 * MIB, cores=1, backing="none")
    blk = pool.alloc(1000)
    assert blk.offset >= 0
    with pytest.raises(npumem.NoBackingError):
        memoryview(blk)
    with pytest.raises(BufferError):
        memoryview(blk)
    blk.free()
    with pytest.raises(npumem.InvalidHandleError, match="the block was freed"):
        memoryview(blk)


def test_pools_are_independent_and_usable_from_many_threads() -> None:
    pool = npumem.Pool(32 * MIB, cores=2)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            for _ in range(300):
                blk = pool.alloc(int(rng.integers(1, 200_000)))
                memoryview(blk)[:1] = b"x"
                blk.free()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool.check() == 0
    assert pool.stats().alloc_count == 1200


def test_ctrl_c_stops_a_long_check_and_leaves_the_pool_running() -> None:
    import os
    import signal
    import threading
    import time

    if threading.current_thread() is not threading.main_thread():
        raise AssertionError("signals reach the main thread only")
    # 32 million chunks of 8 KiB: a check walks them for a good fraction of a second.
    p = npumem.Pool(1 << 38, backing="none", cores=2, chunk_size=8192)
    kept = p.alloc(1000)
    started = time.perf_counter()
    assert p.check() == 1
    whole = time.perf_counter() - started
    sent: list[float] = []

    def interrupt() -> None:
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(whole / 10, interrupt)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        p.check()
        time.sleep(whole)  # without the fix, the interrupt lands here, after the whole check
    stopped = time.perf_counter()
    timer.join()
    assert stopped - sent[0] < whole / 2, (stopped - sent[0], whole)
    p.alloc(1000).free()  # not left paused
    kept.free()
    assert p.check() == 0


def test_ctrl_c_stops_a_long_snapshot_and_leaves_the_pool_as_it_was() -> None:
    import os
    import signal
    import threading
    import time

    if threading.current_thread() is not threading.main_thread():
        raise AssertionError("signals reach the main thread only")
    # 32 million chunks of 8 KiB: a snapshot walks their free space for a good fraction of a
    # second.
    p = npumem.Pool(1 << 38, backing="none", cores=2, chunk_size=8192)
    kept = p.alloc(1000, tag="kept")
    whole = 0.0
    for _ in range(2):  # the longer of two, on a busy machine
        started = time.perf_counter()
        first = p.snapshot()
        whole = max(whole, time.perf_counter() - started)
    sent: list[float] = []

    def interrupt() -> None:
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    for take in (p.snapshot, p.raw_snapshot):
        sent.clear()
        timer = threading.Timer(whole / 10, interrupt)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            take()
            time.sleep(whole)  # without the fix, the interrupt lands here, after the whole walk
        stopped = time.perf_counter()
        timer.join()
        assert stopped - sent[0] < whole / 2, (take.__name__, stopped - sent[0], whole)
    again = p.snapshot()
    assert (again.blocks, again.free_runs, again.stats) == (
        first.blocks,
        first.free_runs,
        first.stats,
    )
    p.alloc(1000).free()  # not left paused
    kept.free()
    assert p.check() == 0
