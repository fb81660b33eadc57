"""The tiered pool's batched accesses (`touch_many`), the policy set after construction, and
the main demo served through a `TieredPool` (`run_demo(tiers=True)`)."""

from __future__ import annotations

import pytest

import npumem
from npumem.errors import ArgumentTypeError, InvalidHandleError
from npumem.tiers import FrequencyPolicy, SizeOnlyPolicy, TieredBlock, TieredPool

MIB = 1 << 20


def make(cores: int = 2, fast: int = 4 * MIB, **kwargs: object) -> TieredPool:
    return TieredPool(
        fast=[npumem.Pool(fast, cores=1, name=f"sram{c}") for c in range(cores)],
        slow=npumem.Pool(64 * MIB, cores=2, name="hbm"),
        **kwargs,  # type: ignore[arg-type]
    )


def test_touch_many_gives_the_figures_of_touch_one_by_one() -> None:
    one, many = make(), make()
    figures = []
    for mem in (one, many):
        blocks = [
            mem.alloc(1000 * (i + 1), core=i % 2, hot=i % 3 == 0, tag=str(i)) for i in range(9)
        ]
        order = [blocks[i % 9] for i in (0, 4, 4, 8, 1, 0, 7, 3, 3, 3, 2, 5, 6)]
        mem.record()
        if mem is one:
            for tb in order:
                mem.touch(tb)
        else:
            mem.touch_many(order)
            mem.touch_many(iter(order[:2]))  # any iterable
        if mem is one:
            mem.touch(order[0])
            mem.touch(order[1])
        events = mem.stop_recording()
        figures.append(
            (
                mem.stats(),
                [(tb.heat.value, tb.heat.last, tb.heat.count) for tb in blocks],
                [(e.kind, e.serial, e.count) for e in events],
            )
        )
    assert figures[0] == figures[1]
    assert figures[0][0].accesses == 15


def test_touch_many_refuses_a_freed_or_foreign_block_before_recording() -> None:
    mem, other = make(), make()
    a, b = mem.alloc(100, core=0), mem.alloc(100, core=0)
    b.free()
    with pytest.raises(InvalidHandleError):
        mem.touch_many([a, b])
    with pytest.raises(InvalidHandleError):
        mem.touch_many([a, other.alloc(100, core=0)])
    with pytest.raises(ArgumentTypeError):
        mem.touch_many([a, "x"])  # type: ignore[list-item]
    assert mem.stats().accesses == 0 and a.heat.count == 0


def test_a_policy_set_later_places_the_next_blocks() -> None:
    mem = make()
    assert mem.alloc(100, core=0).tier == "slow"
    mem.policy = SizeOnlyPolicy(4096)
    assert mem.alloc(100, core=0).tier == "fast" and mem.stats().policy == "size-only"
    with pytest.raises(ArgumentTypeError):
        mem.policy = "lru"  # type: ignore[assignment]
    assert isinstance(mem.policy, SizeOnlyPolicy)
    mem.policy = FrequencyPolicy()
    assert mem.alloc(100, core=0).tier == "slow"


def test_the_main_demo_serves_its_weights_through_a_tiered_pool() -> None:
    from npumem.tiers import replay
    from npumem.workloads.demo import run_demo
    from npumem.workloads.models import build_models
    from npumem.workloads.tiered import make_policy

    result = run_demo(requests=24, workers=2, seed=3, interval=0.05, tiers=True)
    assert result.ok and result.tiers is not None
    tiers = result.tiers
    assert tiers.cores == 2 and tiers.live.accesses > 0
    assert tiers.live.promotions > 0, "the rebalances move hot weights into SRAM"
    assert tiers.live.hit_rate > 0
    # Frequency against size-only placement on the same accesses: the live run is the
    # frequency row (its recording replays to the same figures), size-only is replayed.
    assert set(tiers.compared) == {"frequency", "size-only"}
    assert tiers.compared["frequency"] == tiers.live
    assert tiers.compared["size-only"].promotions == 0
    assert tiers.compared["size-only"].accesses == tiers.live.accesses
    fresh = TieredPool(
        [npumem.Pool(tiers.sram_per_core, cores=1) for _ in range(tiers.cores)],
        npumem.Pool(tiers.hbm, cores=tiers.cores),
        fast_max_block=tiers.fast_max_block,
        policy=make_policy("frequency", tiers.fast_max_block),
    )
    replayed = replay(tiers.events, fresh)
    assert (replayed.hit_rate, replayed.promotions, replayed.demotions) == (
        tiers.live.hit_rate,
        tiers.live.promotions,
        tiers.live.demotions,
    )
    # One block per weight tensor: the demo pool (HBM) holds many weight blocks, and the
    # weights of each model take its parameter bytes in all, across the tiers.
    assert tiers.snapshot is not None
    weights = {m.name: m.weight_bytes for m in build_models(batches=(1,))}
    held: dict[str, int] = {}
    for snap in tiers.snapshot.snapshots.values():
        for blk in snap.blocks:
            if blk.tag and blk.tag.endswith(".weights"):
                name = blk.tag.removesuffix(".weights")
                held[name] = held.get(name, 0) + blk.nbytes
    assert held == weights
    end_weights = [b for b in result.end_snapshot.blocks if b.tag == "resnet50.weights"]
    assert len(end_weights) > 1
    assert result.final is not None and result.final.bytes_in_use == 0


def test_blocks_placed_without_the_lock_join_the_books() -> None:
    mem = make(cores=2, fast=64 * 1024)
    hot = [mem.alloc(16 * 1024, core=1, hot=True) for _ in range(6)]  # 4 fit, 2 spill
    cold = [mem.alloc(1000, core=0) for _ in range(3)]
    hot[0].free()  # freed before any call that takes the lock lists it
    cold[0].free()
    stats = mem.stats()
    assert [t.allocs for t in stats.fast] == [0, 4] and stats.slow.allocs == 5
    assert [t.spills for t in stats.fast] == [0, 2]
    assert [t.blocks for t in stats.fast] == [0, 3] and stats.slow.blocks == 4
    assert mem.check() == 7 and len(mem.blocks()) == 7
    # Freeing takes the lock and enters what was placed meanwhile.
    extra = mem.alloc(100, core=0, tier="fast")
    cold[1].free()
    assert extra in mem.blocks() and mem.stats().fast[0].allocs == 1


@pytest.mark.parametrize(("candidate_accesses", "swapped"), [(80, False), (120, True)])
def test_rebalance_demotes_only_for_more_accesses_in_all(
    candidate_accesses: int, swapped: bool
) -> None:
    # The candidate is denser (accesses per byte) than the resident either way; it takes the
    # resident's place only when it also serves more accesses in all.
    mem = make(cores=1, fast=64 * 1024, policy=FrequencyPolicy(half_life=1e9))
    resident = mem.alloc(48 * 1024, core=0, tier="fast")
    candidate = mem.alloc(32 * 1024, core=0)
    mem.touch(resident, 100)
    mem.touch(candidate, candidate_accesses)
    report = mem.rebalance()
    assert (candidate.tier, resident.tier) == (("fast", "slow") if swapped else ("slow", "fast"))
    assert len(report.moves) == (2 if swapped else 0)


def test_prometheus_pool_metrics_carry_the_tier_label() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from npumem.monitor.prometheus import COUNTERS, GAUGES
    from npumem.tiers.prometheus import TierCollector

    mem = make(cores=2)
    mem.alloc(4096, core=1, hot=True)
    mem.alloc(8192, core=0)
    registry = CollectorRegistry()
    registry.register(TierCollector(mem, pools=True))
    text = generate_latest(registry).decode()
    assert 'npumem_in_use_bytes{core="1",pool="sram1",tier="fast"} 4096.0' in text
    assert 'npumem_in_use_bytes{core="0",pool="sram0",tier="fast"} 0.0' in text
    assert 'npumem_allocs_total{core="",pool="hbm",tier="slow"} 1.0' in text
    for metric, _, _ in (*GAUGES, *COUNTERS):
        name = metric if metric in text else metric.removesuffix("_total")
        lines = [line for line in text.splitlines() if line.startswith(name + "{")]
        assert len(lines) == 3 and all('tier="' in line for line in lines), metric
    # Without pools=True only the tier metrics: it registers next to a PrometheusCollector.
    from npumem.monitor import PrometheusCollector

    plain = CollectorRegistry()
    plain.register(TierCollector(mem))
    plain.register(PrometheusCollector(*mem.fast, mem.slow))
    assert "npumem_tier_hits_total" in generate_latest(plain).decode()
    with pytest.raises(ArgumentTypeError):
        TierCollector(mem, pools=1)  # type: ignore[arg-type]


def test_frequency_policy_admits_small_cold_blocks_while_there_is_room() -> None:
    from npumem.errors import InvalidArgumentError

    mem = make(cores=1, fast=64 * 1024, policy=FrequencyPolicy(admit_cold=16 * 1024))
    small = [mem.alloc(16 * 1024, core=0) for _ in range(5)]  # 4 fit, the fifth spills
    assert [tb.tier for tb in small] == ["fast"] * 4 + ["slow"]
    assert mem.alloc(16 * 1024 + 1, core=0).tier == "slow"
    assert mem.stats().fast[0].spills == 1
    # A small cold block never touched is the first to make room for a hot one.
    small[-1].free()
    mem.policy = FrequencyPolicy(admit_cold=0)
    hot = mem.alloc(16 * 1024, core=0)
    assert hot.tier == "slow"
    mem.touch(hot, 5)
    report = mem.rebalance()
    assert hot.tier == "fast" and report.promotions == 1 and report.demotions == 1
    assert "admit_cold=16384" in repr(FrequencyPolicy(admit_cold=16384))
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidArgumentError):
            FrequencyPolicy(admit_cold=bad)  # type: ignore[arg-type]


def test_synthetic_events_are_reproducible_and_replay() -> None:
    from npumem.tiers import replay
    from npumem.workloads.tiered import make_policy, synthetic_events

    a = synthetic_events(5, cores=2, blocks=40, accesses=3000)
    assert a == synthetic_events(5, cores=2, blocks=40, accesses=3000)
    assert a != synthetic_events(6, cores=2, blocks=40, accesses=3000)
    kinds = {e.kind for e in a}
    assert {"alloc", "touch", "free", "rebalance"} <= kinds
    mem = TieredPool(
        [npumem.Pool(MIB, cores=1) for _ in range(2)],
        npumem.Pool(1 << 30, cores=2),
        policy=make_policy("frequency", MIB),
    )
    stats = replay(a, mem)
    assert stats.accesses == sum(e.count for e in a if e.kind == "touch") > 3000
    assert 0 < stats.hit_rate < 1


def test_threads_allocate_without_the_lock_while_others_rebalance() -> None:
    import threading

    mem = make(cores=4, fast=256 * 1024, policy=FrequencyPolicy(admit_cold=4096))
    allocated = [0] * 4
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(core: int) -> None:
        try:
            kept = []
            for i in range(600):
                tb = mem.alloc(512 + 97 * (i % 50), core=core, hot=i % 3 == 0)
                allocated[core] += 1
                mem.touch_many([tb, tb])
                if i % 4 == 0:
                    kept.append(tb)
                else:
                    tb.free()
            for tb in kept[::2]:
                tb.free()
        except BaseException as exc:
            errors.append(exc)

    def mover() -> None:
        try:
            while not stop.is_set():
                mem.rebalance(64 * 1024)
                mem.stats()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(4)]
    background = threading.Thread(target=mover)
    background.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    background.join()
    assert not errors, errors
    stats = mem.stats()
    assert sum(t.allocs for t in stats.fast) + stats.slow.allocs == sum(allocated) == 2400
    assert mem.check() == 4 * 75 and stats.accesses == 4800


def test_rebalance_starts_at_the_next_core_each_time() -> None:
    # A budget of one block per rebalance: core 0 always has a candidate, yet core 1's block
    # is promoted by the second rebalance.
    mem = make(cores=2, policy=FrequencyPolicy())
    zero = [mem.alloc(4096, core=0) for _ in range(3)]
    one = mem.alloc(4096, core=1)
    mem.touch_many([*zero, one])
    first = mem.rebalance(4096)
    second = mem.rebalance(4096)
    assert first.promotions == second.promotions == 1
    assert one.tier == "fast" and sum(tb.tier == "fast" for tb in zero) == 1


def test_touch_many_with_counts_gives_the_figures_of_touch_with_a_count() -> None:
    one, many = (
        make(policy=FrequencyPolicy(half_life=50)),
        make(policy=FrequencyPolicy(half_life=50)),
    )
    figures = []
    for mem in (one, many):
        blocks = [mem.alloc(1000 * (i + 1), core=i % 2, hot=i % 2 == 0) for i in range(6)]
        counts = [3, 0, 1, 7, 2, 5]
        mem.touch(blocks[0])
        mem.record()
        if mem is one:
            for tb, n in zip(blocks, counts, strict=True):
                mem.touch(tb, n)
        else:
            mem.touch_many(blocks, counts)
        events = mem.stop_recording()
        figures.append(
            (
                mem.stats(),
                [(round(tb.heat.value, 9), tb.heat.last, tb.heat.count) for tb in blocks],
            )
        )
        if mem is many:
            assert [(e.kind, e.counts) for e in events] == [("touch_many", tuple(counts))]
            assert events[0].serials == tuple(tb.serial for tb in blocks)
    assert figures[0] == figures[1]
    assert figures[0][0].accesses == 1 + 18


def test_touch_many_with_counts_refuses_bad_counts_before_recording() -> None:
    from npumem.errors import InvalidArgumentError

    mem = make()
    a, b = mem.alloc(100, core=0), mem.alloc(100, core=1)
    for bad in ([1], [1, -1], [1, 1.5], [1, True], [1, 2, 3]):
        with pytest.raises(InvalidArgumentError):
            mem.touch_many([a, b], bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        mem.touch(a, -2)
    b.free()
    with pytest.raises(InvalidHandleError):
        mem.touch_many([a, b], [1, 1])
    assert mem.stats().accesses == 0 and a.heat.count == 0


def test_a_policy_without_touch_n_gets_one_touch_per_access() -> None:
    from npumem.tiers.policy import Heat, LRUPolicy

    class Plain:
        name = "plain"
        moves = True
        per_byte = False

        def __init__(self) -> None:
            self.calls: list[int] = []

        def admit(self, nbytes: int, hot: bool) -> bool:
            return hot

        def touch(self, heat: Heat, now: int) -> None:
            self.calls.append(now)
            LRUPolicy().touch(heat, now)

        def score(self, heat: Heat, now: int) -> float:
            return float(heat.last + 1)

    policy = Plain()
    mem = make(policy=policy)
    a, b = mem.alloc(100, core=0), mem.alloc(100, core=1)
    mem.touch_many([a, b], [2, 3])
    mem.touch(a, 2)
    assert policy.calls == [0, 1, 2, 3, 4, 5, 6]
    assert (a.heat.last, b.heat.last, a.heat.count) == (6, 4, 4)


def test_a_policy_whose_score_frees_and_allocates_blocks_does_not_break_a_rebalance() -> None:
    from npumem.tiers.policy import Heat, LRUPolicy

    class Meddling(LRUPolicy):
        def __init__(self) -> None:
            super().__init__()
            self.victims: list[TieredBlock] = []
            self.made: list[TieredBlock] = []

        def score(self, heat: Heat, now: int) -> float:
            if self.victims:
                self.victims.pop().free()
                self.made.append(mem.alloc(100, core=0, tag="new"))
            return super().score(heat, now)

    policy = Meddling()
    mem = make(policy=policy)
    blocks = [mem.alloc(100, core=c % 2, tier="slow", tag=f"b{c}") for c in range(6)]
    mem.touch_many(blocks, [1] * 6)
    policy.victims = blocks[3:]
    report = mem.rebalance()
    assert policy.victims == [] and len(policy.made) == 3
    assert report.moves and all(m.promotion for m in report.moves)
    assert {m.tag for m in report.moves} <= {"b0", "b1", "b2", "new"}, "no freed block moved"
    mem.check()


def test_a_block_that_found_no_room_after_demotions_waits_for_a_block_to_leave() -> None:
    # 64 KiB of SRAM: a (hot) at 16 KiB, d (cold) at 48 KiB, the rest free. Demoting d for t
    # frees 48 KiB that still do not hold t (a splits them), and a is hotter than t: t waits,
    # instead of demoting d again at every rebalance once d is back.
    k = 1024
    mem = TieredPool(
        [npumem.Pool(64 * k, cores=1, name="sram0")],
        npumem.Pool(8 * MIB, cores=1, name="hbm"),
        policy=FrequencyPolicy(half_life=1e9),
    )
    b, a, c, d = (mem.alloc(16 * k, core=0, tier="fast", tag=tag) for tag in "bacd")
    assert [x.offset for x in (b, a, c, d)] == [0, 16 * k, 32 * k, 48 * k]
    b.free()
    c.free()
    t = mem.alloc(48 * k, core=0, tag="t")
    mem.touch(a, 100)
    mem.touch(d, 1)
    mem.touch(t, 10)

    def moves() -> list[tuple[str | None, str]]:
        return [(m.tag, str(m.dst)) for m in mem.rebalance().moves]

    assert moves() == [("d", "slow")] and t.tier == "slow"  # in vain: t still has no room
    assert moves() == [("d", "fast[0]")]  # d comes back; t waits
    assert moves() == [] and moves() == []  # and nothing moves again
    a.free()  # a block leaves the SRAM: t tries again, and 0-48 KiB now holds it
    assert moves() == [("t", "fast[0]")] and t.tier == "fast" and d.tier == "fast"
    assert mem.check() == 2  # d and t
