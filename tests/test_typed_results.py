"""The classes the extension returns (no dicts cross the boundary) and the exception classes it
defines."""

from __future__ import annotations

import pickle

import pytest

import npumem
import npumem._core as core
import npumem.compaction
import npumem.errors
from npumem.compaction import Compactor, HostMirror
from npumem.monitor import Snapshot

MIB = 1 << 20


def test_the_exception_classes_are_the_extensions() -> None:
    for name in npumem.errors.__all__:
        if hasattr(core, name):
            assert getattr(npumem.errors, name) is getattr(core, name)
            assert getattr(npumem, name) is getattr(core, name)
    assert issubclass(npumem.RequestTooLargeError, npumem.InvalidArgumentError)
    assert issubclass(npumem.RequestTooLargeError, MemoryError)
    err = npumem.OutOfMemoryError("no room", 10, 5, 4)
    assert (str(err), err.requested, err.bytes_free, err.largest_free_block) == (
        "no room",
        10,
        5,
        4,
    )
    assert npumem.OutOfMemoryError("plain").requested is None
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is npumem.OutOfMemoryError and again.largest_free_block == 4


def test_a_pool_error_carries_its_figures() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    _held = pool.alloc(3000)  # held: a dropped block is freed
    with pytest.raises(MemoryError) as info:
        pool.alloc(8 * MIB)
    assert isinstance(info.value, npumem.OutOfMemoryError)
    assert info.value.requested == 8 * MIB and info.value.bytes_free is not None


def test_block_listing_and_trace_status_are_typed() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    blk = pool.alloc(1000, tag="t")
    (info,) = pool.blocks()
    assert isinstance(info, npumem.BlockInfo)
    assert (info.offset, info.nbytes, info.tag, info.handle) == (blk.offset, 1000, "t", blk.handle)
    assert info.as_dict()["block_bytes"] == info.block_bytes
    assert pool.blocks() == [info] and "tag='t'" in repr(info)
    status = pool.trace_status()
    assert isinstance(status, npumem.TraceStatus) and not status.enabled
    assert status.as_dict()["dropped"] == 0 and status == pool.trace_status()


def test_snapshot_is_the_monitor_snapshot() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, name="snap")
    _held = pool.alloc(3000, tag="x")  # held: a dropped block is freed
    snap = pool.snapshot()
    assert isinstance(snap, Snapshot) and snap.pool == "snap"
    raw = pool.raw_snapshot()
    assert [b.nbytes for b in raw.blocks] == [3000] and raw.stats.blocks_in_use == 1


def test_compaction_results_are_the_extensions_classes() -> None:
    assert npumem.compaction.StepReport is core.StepReport
    assert npumem.compaction.CompactionPlan is core.CompactionPlan
    assert npumem.compaction.PlannedMove is core.PlannedMove
    pool = npumem.Pool(40 * MIB, cores=1, backing="none")
    mirror = HostMirror(pool.capacity)
    blocks = [pool.alloc(300_000) for _ in range(40)]
    for b in blocks[::2]:
        b.free()
    plan = Compactor(pool, mover=mirror).plan()
    assert plan.mode == "full" and plan.as_dict()["moves"][0] == plan.moves[0].as_dict()
    with pool.pause() as pause:
        step = pool.compact_step(pause, "full", mover=mirror)
    assert isinstance(step, core.StepReport) and step.blocks == plan.blocks
    assert step.as_dict()["transfers"] == step.transfers > 0
    timed = step.with_pause(1.5, over_budget=True)
    assert (timed.pause_seconds, timed.over_budget, timed.blocks) == (1.5, True, step.blocks)
    assert timed != step and timed.with_pause(step.pause_seconds) == step


def test_stats_and_snapshots_pickle_and_copy_as_values() -> None:
    import copy

    pool = npumem.Pool(16 * MIB, cores=2)
    kept = [pool.alloc(100, tag="a"), pool.alloc(300_000), pool.alloc(3 * MIB, tag="b")]
    stats = pool.stats()
    snap = pool.snapshot()
    assert stats.by_tag and stats.per_core and stats.size_classes
    for value in (stats, stats.per_core[0], stats.size_classes[0], stats.by_tag[0], snap):
        for again in (
            pickle.loads(pickle.dumps(value)),
            pickle.loads(pickle.dumps(value, protocol=2)),
            copy.copy(value),
            copy.deepcopy(value),
        ):
            assert type(again) is type(value)
            assert again == value
    assert pickle.loads(pickle.dumps(snap)).stats.by_tag == stats.by_tag
    for block in kept:
        block.free()


def test_what_cannot_be_pickled_names_its_own_class() -> None:
    import npumem.kv
    from npumem.compaction import Compactor
    from npumem.monitor import TraceRecorder

    pool = npumem.Pool(16 * MIB, cores=1)
    block = pool.alloc(100)
    cache = npumem.kv.KVCache(pool, num_layers=1, num_kv_heads=1, head_dim=64)
    with pool.measure() as measurement:
        pass
    pause = pool.pause()
    step = pool.compact_step(pause)
    pause.resume()
    objects = [
        pool,
        block,
        block.pinned(),
        pause,
        measurement,
        step,
        cache,
        pool.raw_snapshot(),
        pool.blocks()[0],
        pool.trace_status(),
        pool.plan_compaction(),
        Compactor(pool),
        TraceRecorder(pool),
    ]
    for obj in objects:
        with pytest.raises(TypeError) as raised:
            pickle.dumps(obj)
        assert f"'{type(obj).__name__}'" in str(raised.value) or (
            f"'{type(obj).__module__}.{type(obj).__name__}'" in str(raised.value)
        ), (type(obj), str(raised.value))
    cache.close()
    block.free()


def test_what_owns_live_state_refuses_every_copy_naming_its_class() -> None:
    """Objects that own threads, locks or a pool's live state cannot be copied or pickled:
    `copy.copy`, `copy.deepcopy` and `pickle` raise a `TypeError` that names the class (no
    half-shared copy, no message about some object inside)."""
    import copy

    import npumem.kv
    from npumem.compaction import Compactor
    from npumem.monitor import Monitor, PrometheusCollector, TraceRecorder
    from npumem.tiers import TieredPool
    from npumem.tiers.prometheus import TierCollector
    from npumem.workloads.demo_tiers import DemoTiers
    from npumem.workloads.service import Service

    pool = npumem.Pool(64 * MIB, cores=1)
    block = pool.alloc(100)
    cache = npumem.kv.KVCache(pool, num_layers=1, num_kv_heads=1, head_dim=64)
    tiered = TieredPool([npumem.Pool(MIB, cores=1)], npumem.Pool(4 * MIB, cores=1))
    tiered_block = tiered.alloc(100)
    demo_tiers = DemoTiers(npumem.Pool(64 * MIB, cores=1), 1)
    service = Service(pool, [], [], workers=1)
    monitor = Monitor(pool, interval=0.01)
    objects: list[object] = [
        pool,
        block,
        block.pinned(),
        pool.deferred(),
        pool.measure(),
        cache,
        tiered,
        tiered_block,
        Compactor(pool),
        TraceRecorder(pool),
        monitor,
        PrometheusCollector(pool),
        TierCollector(tiered),
        demo_tiers,
        service,
    ]
    monitor.start()
    try:
        for obj in objects:
            for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
                with pytest.raises(TypeError) as raised:
                    duplicate(obj)
                name = type(obj).__name__
                assert f"'{name}'" in str(raised.value) or f".{name}'" in str(raised.value), (
                    name,
                    duplicate,
                    str(raised.value),
                )
        assert monitor.running
    finally:
        monitor.stop()
    service.kv.close()
    cache.close()
    tiered_block.free()
    block.free()
    assert pool.check() == 0
