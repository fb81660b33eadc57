"""The tiered pool: placement rules, spills, promotion and demotion with the bytes checked,
movers that fail, pins and views, threads."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import npumem
from helpers import assert_block_rules
from npumem.errors import (
    ArgumentTypeError,
    ConfigError,
    CorruptionError,
    DoubleFreeError,
    InvalidArgumentError,
    InvalidHandleError,
    MoveError,
    OutOfMemoryError,
    PinnedBlockError,
)
from npumem.tiers import (
    FrequencyPolicy,
    LRUPolicy,
    SizeOnlyPolicy,
    Tier,
    TieredBlock,
    TieredPool,
)

MIB = 1 << 20
_PATTERN = bytes(range(251))


def make(cores: int = 2, fast: int = 4 * MIB, slow: int = 64 * MIB, **kwargs: object) -> TieredPool:
    return TieredPool(
        fast=[npumem.Pool(fast, cores=1, name=f"sram{c}") for c in range(cores)],
        slow=npumem.Pool(slow, cores=2, name="hbm"),
        **kwargs,  # type: ignore[arg-type]
    )


def fill(tb: TieredBlock, seed: int) -> bytes:
    n = tb.nbytes
    shift = seed % 251
    data = os.urandom(n) if seed < 0 else (_PATTERN * (n // 251 + 2))[shift : shift + n]
    with tb.view() as view:
        view[:] = data
    return data


def content(tb: TieredBlock) -> bytes:
    with tb.view() as view:
        return bytes(view)


# ----- placement -------------------------------------------------------------------------------


def test_explicit_tier_wins() -> None:
    mem = make(fast_max_block=1024)
    a = mem.alloc(8192, tier="fast", core=1)  # above fast_max_block, but named
    assert (a.tier, a.core) == ("fast", 1)
    b = mem.alloc(64, tier="slow", hot=True)
    assert (b.tier, b.core) == ("slow", None)
    assert_block_rules(mem.fast[1], a.block)
    assert_block_rules(mem.slow, b.block)


def test_hot_block_goes_to_its_core_and_cold_to_slow() -> None:
    mem = make()
    hot = mem.alloc(10_000, core=1, hot=True)
    cold = mem.alloc(10_000, core=1)
    assert (hot.tier, hot.core, hot.home) == ("fast", 1, 1)
    assert (cold.tier, cold.core, cold.home) == ("slow", None, 1)
    assert hot.block.pool is mem.fast[1] and cold.block.pool is mem.slow


def test_calling_core_is_used_without_core() -> None:
    mem = make(cores=2, core_of=lambda: 1)
    assert mem.alloc(100, hot=True).core == 1
    mem = make(cores=3)
    seen: list[int | None] = []
    threads = [
        threading.Thread(target=lambda: seen.append(mem.alloc(64, hot=True).core)) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(c for c in seen if c is not None) == [0, 1, 2]


def test_blocks_above_fast_max_block_go_to_slow() -> None:
    mem = make(fast_max_block=4096)
    assert mem.alloc(4096, hot=True, core=0).tier == "fast"
    big = mem.alloc(4097, hot=True, core=0)
    assert big.tier == "slow"
    assert mem.stats().spills == 0  # too large is not a spill


def test_full_sram_spills_to_hbm_and_counts() -> None:
    mem = make(cores=1, fast=2 * MIB)
    blocks = [mem.alloc(256 * 1024, hot=True) for _ in range(12)]
    tiers = [b.tier for b in blocks]
    assert tiers.count("fast") == 8 and tiers.count("slow") == 4
    stats = mem.stats()
    assert stats.spills == 4 and stats.fast[0].spills == 4
    assert stats.fast[0].blocks == 8 and stats.slow.blocks == 4
    assert stats.fast[0].bytes_in_use == 2 * MIB


def test_explicit_fast_tier_without_room_raises() -> None:
    mem = make(cores=1, fast=2 * MIB)
    mem.alloc(2 * MIB, tier="fast")
    with pytest.raises(OutOfMemoryError):
        mem.alloc(4096, tier="fast")
    assert mem.stats().slow.blocks == 0


def test_each_tier_keeps_its_bank_rule_and_alignment() -> None:
    fast = [
        npumem.Pool(4 * MIB, cores=1, bank_size=1024, alignment=256, slab_sizes=(256, 512, 1024))
    ]
    mem = TieredPool(fast=fast, slow=npumem.Pool(16 * MIB, cores=1, bank_size=8192, alignment=64))
    for n in (100, 700, 1000, 3000, 5000):
        f = mem.alloc(n, tier="fast")
        s = mem.alloc(n, tier="slow")
        assert_block_rules(mem.fast[0], f.block)
        assert_block_rules(mem.slow, s.block)
        mem.promote(s)  # the move follows the destination's rules
        assert_block_rules(mem.fast[0], s.block)


def test_size_only_policy_places_by_size() -> None:
    mem = make(policy=SizeOnlyPolicy(8192))
    assert mem.alloc(8192).tier == "fast"  # hot not needed
    assert mem.alloc(8193, hot=True).tier == "slow"
    tb = mem.alloc(100, tier="slow")
    mem.touch(tb, 10)
    report = mem.rebalance()
    assert not report.moves and tb.tier == "slow"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigError):
        TieredPool(fast=[], slow=npumem.Pool(MIB, cores=1))
    pool = npumem.Pool(MIB, cores=1)
    with pytest.raises(ConfigError):
        TieredPool(fast=[pool], slow=pool)
    with pytest.raises(ArgumentTypeError):
        TieredPool(fast=["sram"], slow=npumem.Pool(MIB, cores=1))  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="movers"):
        TieredPool(fast=[npumem.Pool(MIB, cores=1, backing="none")], slow=npumem.Pool(MIB, cores=1))
    with pytest.raises(InvalidArgumentError):
        make(fast_max_block=0)
    with pytest.raises(InvalidArgumentError):
        FrequencyPolicy(half_life=0)
    mem = make()
    with pytest.raises(InvalidArgumentError):
        mem.alloc(10, core=5)
    with pytest.raises(InvalidArgumentError):
        mem.alloc(10, tier="sram")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        mem.rebalance(max_bytes=-1)
    other = make()
    tb = other.alloc(10)
    with pytest.raises(InvalidHandleError):
        mem.promote(tb)
    assert mem.stats().slow.blocks == 0 and mem.stats().fast[0].blocks == 0


# ----- moves -----------------------------------------------------------------------------------


def test_promote_and_demote_keep_the_bytes_and_the_handle() -> None:
    mem = make()
    tbs = [mem.alloc(n, core=n % 2, tag=f"t{n}") for n in (1, 63, 64, 1000, 4096, 65_537, MIB)]
    data = [fill(tb, i) for i, tb in enumerate(tbs)]
    for tb, d in zip(tbs, data, strict=True):
        old_offset = tb.offset
        mem.promote(tb)
        assert (tb.tier, tb.core) == ("fast", tb.home)
        assert content(tb) == d and tb.tag is not None
        mem.demote(tb)
        assert tb.tier == "slow" and content(tb) == d
        del old_offset
    s = mem.stats()
    assert s.promotions == len(tbs) and s.demotions == len(tbs)
    for tb in tbs:
        tb.free()
    for pool in (*mem.fast, mem.slow):
        assert pool.stats().bytes_in_use == 0
        pool.check()


def test_promote_to_another_core_and_back() -> None:
    mem = make(cores=3)
    tb = mem.alloc(5000, core=0, hot=True)
    d = fill(tb, 7)
    mem.promote(tb, core=2)
    assert tb.core == 2 and content(tb) == d
    mem.promote(tb)
    assert tb.core == 0 and content(tb) == d


def test_pinned_blocks_and_live_views_do_not_move() -> None:
    mem = make()
    tb = mem.alloc(4096, core=0)
    fill(tb, 3)
    before = (tb.tier, tb.offset)
    with tb.block.pinned(), pytest.raises(PinnedBlockError):
        mem.promote(tb)
    view = memoryview(tb.block)
    with pytest.raises(PinnedBlockError):
        mem.promote(tb)
    mem.touch(tb, 5)
    report = mem.rebalance()
    assert report.skipped_pinned == 1 and not report.moves
    view.release()
    assert (tb.tier, tb.offset) == before
    assert mem.fast[0].stats().bytes_in_use == 0
    mem.promote(tb)
    assert tb.tier == "fast"


def test_promote_without_room_changes_nothing() -> None:
    mem = make(cores=1, fast=2 * MIB)
    mem.alloc(2 * MIB, tier="fast")
    tb = mem.alloc(4096)
    d = fill(tb, 1)
    with pytest.raises(OutOfMemoryError):
        mem.promote(tb)
    assert tb.tier == "slow" and content(tb) == d
    assert mem.stats().promotions == 0


class Device:
    """Two device memories simulated in host memory, one per tier kind and core."""

    def __init__(self, mem_sizes: dict[Tier, int], fail_after: int | None = None) -> None:
        self.memory = {tier: bytearray(n) for tier, n in mem_sizes.items()}
        self.calls: list[tuple[str, int, str, int, int]] = []
        self.fail_after = fail_after

    def __call__(self, src: Tier, src_off: int, dst: Tier, dst_off: int, n: int) -> None:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            self.memory[dst][dst_off : dst_off + n // 2] = b"\xee" * (n // 2)  # a torn copy
            raise RuntimeError("DMA engine error")
        self.calls.append((str(src), src_off, str(dst), dst_off, n))
        self.memory[dst][dst_off : dst_off + n] = self.memory[src][src_off : src_off + n]


def device_pool(fail_after: int | None = None) -> tuple[TieredPool, Device]:
    fast = [npumem.Pool(2 * MIB, cores=1, backing="none") for _ in range(2)]
    slow = npumem.Pool(16 * MIB, cores=1, backing="none")
    dev = Device(
        {Tier("fast", 0): 2 * MIB, Tier("fast", 1): 2 * MIB, Tier("slow"): 16 * MIB}, fail_after
    )
    return TieredPool(fast=fast, slow=slow, movers=dev), dev


def test_device_mover_gets_tiers_and_offsets() -> None:
    mem, dev = device_pool()
    tb = mem.alloc(3000, core=1)
    data = os.urandom(3000)
    dev.memory[Tier("slow")][tb.offset : tb.offset + 3000] = data
    src_off = tb.offset
    mem.promote(tb)
    assert dev.calls == [("slow", src_off, "fast[1]", tb.offset, 3000)]
    assert bytes(dev.memory[Tier("fast", 1)][tb.offset : tb.offset + 3000]) == data
    mem.demote(tb)
    assert bytes(dev.memory[Tier("slow")][tb.offset : tb.offset + 3000]) == data


def test_failing_mover_changes_nothing() -> None:
    mem, _dev = device_pool(fail_after=0)
    tb = mem.alloc(3000, core=0)
    before = (tb.tier, tb.core, tb.offset, tb.block.handle)
    usage = [p.stats().bytes_in_use for p in (*mem.fast, mem.slow)]
    with pytest.raises(MoveError, match="DMA engine error"):
        mem.promote(tb)
    assert (tb.tier, tb.core, tb.offset, tb.block.handle) == before
    assert [p.stats().bytes_in_use for p in (*mem.fast, mem.slow)] == usage
    mem.touch(tb)
    report = mem.rebalance()
    assert report.failed == 1 and not report.moves and tb.tier == "slow"
    assert mem.stats().promotions == 0
    for p in (*mem.fast, mem.slow):
        p.check()


def test_freed_handle_is_refused() -> None:
    mem = make()
    tb = mem.alloc(100)
    tb.free()
    assert not tb.alive
    with pytest.raises(InvalidHandleError):
        mem.touch(tb)
    with pytest.raises(InvalidHandleError):
        mem.promote(tb)
    with pytest.raises(InvalidHandleError):
        tb.free()
    with mem.alloc(10) as other:
        assert other.alive
    assert not other.alive


# ----- policies and rebalance ------------------------------------------------------------------


def test_rebalance_promotes_hot_and_demotes_cold_with_decay() -> None:
    mem = make(cores=1, fast=MIB, policy=FrequencyPolicy(half_life=50))
    a = [mem.alloc(256 * 1024, tag=f"a{i}") for i in range(4)]
    b = [mem.alloc(256 * 1024, tag=f"b{i}") for i in range(4)]
    data = {id(tb): fill(tb, i) for i, tb in enumerate(a + b)}
    for _ in range(20):
        for tb in a:
            mem.touch(tb)
    report = mem.rebalance()
    assert report.promotions == 4 and all(tb.tier == "fast" for tb in a)
    # a goes cold, b gets hot: b displaces a.
    for _ in range(100):
        for tb in b:
            mem.touch(tb)
    report = mem.rebalance()
    assert all(tb.tier == "fast" for tb in b) and all(tb.tier == "slow" for tb in a)
    assert report.demotions == 4 and report.promotions == 4
    assert all(content(tb) == data[id(tb)] for tb in a + b)
    stats = mem.stats()
    assert stats.promotions == 8 and stats.demotions == 4


def test_rebalance_respects_the_byte_budget() -> None:
    mem = make(cores=1, fast=4 * MIB)
    tbs = [mem.alloc(100_000) for _ in range(10)]
    for i, tb in enumerate(tbs):
        mem.touch(tb, i + 1)
    report = mem.rebalance(max_bytes=350_000)
    assert report.promotions == 3 and report.bytes_moved <= 350_000
    assert [tb.tier for tb in tbs[-3:]] == ["fast"] * 3  # the hottest
    assert mem.rebalance(max_bytes=0).moves == []


def test_lru_prefers_recent_blocks() -> None:
    mem = make(cores=1, fast=MIB, policy=LRUPolicy())
    tbs = [mem.alloc(256 * 1024) for _ in range(8)]
    for tb in tbs:
        mem.touch(tb)
    mem.rebalance()
    assert [tb.tier for tb in tbs] == ["slow"] * 4 + ["fast"] * 4
    for tb in tbs[:2]:
        mem.touch(tb)
    report = mem.rebalance()
    assert report.promotions == 2 and report.demotions == 2
    assert tbs[0].tier == tbs[1].tier == "fast"


def test_hit_rate_counts_touches_by_tier() -> None:
    mem = make(cores=2)
    f = mem.alloc(100, core=1, hot=True)
    s = mem.alloc(100, core=1)
    mem.touch(f, 3)
    mem.touch(s, 1)
    stats = mem.stats()
    assert stats.accesses == 4 and stats.fast[1].hits == 3 and stats.slow.hits == 1
    assert stats.hit_rate == pytest.approx(0.75)
    assert stats.as_dict()["hit_rate"] == pytest.approx(0.75)
    assert "hit rate 75.0%" in str(stats)


# ----- threads ---------------------------------------------------------------------------------


def test_threads_allocate_touch_move_and_free() -> None:
    mem = make(cores=4, fast=MIB, slow=128 * MIB, fast_max_block=64 * 1024)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            mine: list[tuple[TieredBlock, bytes]] = []
            for i in range(500):
                n = 64 + (seed * 7919 + i * 104_729) % 40_000
                tb = mem.alloc(n, hot=i % 3 == 0, tag=f"w{seed}")
                mine.append((tb, fill(tb, seed + i)))
                mem.touch(mine[(i * 31) % len(mine)][0], 1 + i % 4)
                if i % 17 == 0:
                    mem.rebalance(max_bytes=256 * 1024)
                if i % 5 == 4:
                    tb, d = mine.pop(0)
                    assert content(tb) == d
                    tb.free()
            for tb, d in mine:
                assert content(tb) == d
                tb.free()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for pool in (*mem.fast, mem.slow):
        assert pool.stats().bytes_in_use == 0
        pool.check()
    assert mem.blocks() == []


# ----- recording and replay --------------------------------------------------------------------


def test_record_and_replay_under_another_policy() -> None:
    from npumem.tiers import replay

    mem = make(cores=1, fast=MIB)
    mem.record()
    tbs = [mem.alloc(256 * 1024, tag=f"b{i}") for i in range(6)]
    for i, tb in enumerate(tbs):
        mem.touch(tb, i + 1)
    mem.rebalance(max_bytes=MIB)
    mem.demote(tbs[-1])
    mem.promote(tbs[-1])
    tbs[0].free()
    events = mem.stop_recording()
    assert [e.kind for e in events[:7]] == ["alloc"] * 6 + ["touch"]
    assert {e.kind for e in events} == {"alloc", "touch", "rebalance", "demote", "promote", "free"}
    assert mem.stop_recording() == []
    again = replay(events, make(cores=1, fast=MIB))
    original = mem.stats()
    assert again.accesses == original.accesses == 21
    assert again.hit_rate == original.hit_rate
    assert again.promotions == original.promotions
    sized = replay(events, make(cores=1, fast=MIB, policy=SizeOnlyPolicy(MIB)))
    assert sized.accesses == 21 and sized.spills == 2  # four blocks fill the SRAM at once
    assert sized.promotions == 0  # the explicit promote finds no room; rebalance moves nothing


def test_tiered_demo_refuses_an_unknown_mix_with_a_typed_error() -> None:
    from npumem.workloads.tiered import run_tiered_demo

    with pytest.raises(npumem.InvalidArgumentError, match="unknown mix 'bursty'"):
        run_tiered_demo(cores=1, requests=1, mix="bursty")


def test_tiered_demo_compares_policies(tmp_path: Path) -> None:
    from npumem.workloads.tiered import run_tiered_demo, write_tier_outputs

    result = run_tiered_demo(cores=2, requests=12, hbm=256 * MIB, rebalance_every=2)
    assert set(result.compared) == {"frequency", "lru", "size-only"}
    assert result.live.accesses == result.compared["frequency"].accesses > 0
    assert result.compared["size-only"].promotions == 0
    assert 0 < result.compared["frequency"].hit_rate <= 1
    assert "hit rate" in result.summary()
    assert result.snapshot is not None and result.snapshot.stats == result.live
    from io import StringIO

    from rich.console import Console

    from npumem.workloads.tiered import report_tiered_demo

    text = StringIO()
    report_tiered_demo(Console(file=text, width=120, color_system=None), result)
    assert "size-only" in text.getvalue() and "fast[1]" in text.getvalue()
    files = write_tier_outputs(result, tmp_path)
    assert {p.name for p in files.values()} == {"tiers.json", "tiers.png"}


def test_writes_through_views_survive_concurrent_moves() -> None:
    mem = make(cores=2, fast=MIB)
    tbs = [mem.alloc(4096, core=i % 2, tag=f"v{i}") for i in range(8)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def mover() -> None:
        try:
            k = 0
            while not stop.is_set():
                tb = tbs[k % len(tbs)]
                try:
                    if tb.tier == "fast":
                        mem.demote(tb)
                    else:
                        mem.promote(tb)
                except PinnedBlockError:
                    pass  # a writer holds a view: the block stays
                k += 1
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=mover)
    thread.start()
    try:
        for round_ in range(300):
            for i, tb in enumerate(tbs):
                with tb.view() as view:
                    view[:8] = (round_ * 100 + i).to_bytes(8, "little")
        for i, tb in enumerate(tbs):
            with tb.view() as view:
                assert int.from_bytes(view[:8], "little") == 299 * 100 + i
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert mem.stats().promotions > 0


def test_random_operations_keep_the_books_straight() -> None:
    import random

    rng = random.Random(11)
    mem = make(cores=3, fast=MIB, slow=32 * MIB, fast_max_block=256 * 1024)
    live: dict[int, tuple[TieredBlock, bytes]] = {}
    for step in range(1500):
        op = rng.random()
        try:
            if op < 0.35 or not live:
                tb = mem.alloc(
                    rng.choice((64, 700, 4096, 50_000, 200_000, 600_000)),
                    core=rng.randrange(3),
                    hot=rng.random() < 0.5,
                    tier=rng.choice((None, None, None, "fast", "slow")),
                )
                live[step] = (tb, fill(tb, step))
            elif op < 0.55:
                key = rng.choice(list(live))
                tb, data = live.pop(key)
                assert content(tb) == data
                tb.free()
            elif op < 0.8:
                tb, _ = live[rng.choice(list(live))]
                mem.touch(tb, rng.randrange(1, 5))
            elif op < 0.9:
                tb, _ = live[rng.choice(list(live))]
                (mem.promote if rng.random() < 0.5 else mem.demote)(tb)
            else:
                mem.rebalance(max_bytes=rng.choice((None, 100_000, 1_000_000)))
        except OutOfMemoryError:
            pass
        if step % 100 == 0:
            stats = mem.stats()
            fast_blocks = [tb for tb, _ in live.values() if tb.tier == "fast"]
            assert sum(t.blocks for t in stats.fast) == len(fast_blocks)
            assert stats.slow.blocks == len(live) - len(fast_blocks)
            for tb in fast_blocks:
                assert tb.block.pool is mem.fast[tb.core or 0]
    assert mem.check() == len(live)
    for tb, data in live.values():
        assert content(tb) == data
        tb.free()
    for pool in (*mem.fast, mem.slow):
        assert pool.stats().bytes_in_use == 0
        pool.check()


def test_a_block_freed_behind_the_tiered_pools_back_is_reported_then_forgotten() -> None:
    # Freeing `tb.block` itself made every later check() and rebalance() raise
    # InvalidHandleError, and no call could take the block out of the books.
    m = TieredPool(fast=[npumem.Pool(1 << 20, cores=1)], slow=npumem.Pool(4 << 20, cores=1))
    good = m.alloc(4096, tier="slow")
    m.touch(good)
    gone = m.alloc(4096, tier="slow")
    m.touch(gone)
    gone.block.free()
    assert not gone.alive and "freed directly" in repr(gone)
    with pytest.raises(CorruptionError, match=r"freed directly through \.block"):
        m.check()
    report = m.rebalance()  # forgets it, and goes on with the others
    assert [move.nbytes for move in report.moves] == [4096] and good.tier == "fast"
    assert m.check() == 1
    with pytest.raises(InvalidHandleError):
        gone.free()
    also = m.alloc(4096, tier="slow")
    also.block.free()
    with pytest.raises(DoubleFreeError, match="freed directly"):
        also.free()  # forgotten here too
    assert m.check() == 1
    good.free()
    assert m.check() == 0


def test_a_block_detached_behind_the_tiered_pools_back_is_said_so_and_forgotten() -> None:
    # Detaching `tb.block` was reported as "bytes were freed directly" (a DoubleFreeError),
    # although the bytes stay allocated for whoever holds the handle.
    slow = npumem.Pool(16 << 20, cores=1)
    m = TieredPool(fast=[npumem.Pool(2 << 20, cores=1)], slow=slow)
    good = m.alloc(3000, tier="slow")
    moved = m.alloc(3000, tier="slow")
    kept = m.alloc(3000, tier="slow")
    handles = []
    for tb in (moved, kept):
        handles.append(tb.block.detach())
    assert "detached directly through .block" in repr(moved)
    with pytest.raises(CorruptionError, match=r"detached directly through \.block"):
        m.check()
    with pytest.raises(InvalidHandleError, match="detached directly") as info:
        m.promote(moved, core=0)
    assert not isinstance(info.value, DoubleFreeError)
    assert "still allocated" in str(info.value)
    with pytest.raises(InvalidHandleError, match="detached directly") as info:
        kept.free()
    assert not isinstance(info.value, DoubleFreeError)
    assert m.check() == 1, "the tiered pool lists its own block only"
    assert [tb.serial for tb in m.blocks()] == [good.serial]
    assert slow.stats().blocks_in_use == 3, "the detached bytes are still allocated"
    # Later uses say why the tiered pool no longer has the block.
    for use in (lambda: m.demote(moved), kept.free, lambda: m.touch(moved), lambda: moved.offset):
        with pytest.raises(InvalidHandleError, match="detached directly") as info:
            use()
        assert not isinstance(info.value, DoubleFreeError)
    assert repr(moved) == repr(kept) == "<TieredBlock detached>" and not moved.alive
    # The holder of a handle owns the bytes: adopting it gives them back to use and free.
    for handle in handles:
        slow.adopt(handle).free()
    m.promote(good, core=0)
    assert good.tier == "fast" and m.check() == 1
    good.free()
    assert m.check() == 0 and slow.stats().blocks_in_use == 0
    slow.check()


@pytest.mark.parametrize("half_life", [1.0, 4096.0, 1e16, 1e17, 1e300])
def test_many_touches_at_once_weigh_as_many_single_touches(half_life: float) -> None:
    # From a half-life of about 1e16 ticks, the decay of one tick rounded to 1 and
    # touch(tb, n) divided by zero.
    from npumem.tiers.policy import Heat

    policy = FrequencyPolicy(half_life)
    at_once, one_by_one = Heat(), Heat()
    policy.touch_n(at_once, 0, 7)
    for tick in range(7):
        policy.touch_n(one_by_one, tick, 1)
    assert at_once.value == pytest.approx(one_by_one.value, rel=1e-12)
    m = make(policy=policy)
    tb = m.alloc(4096, tier="slow")
    m.touch(tb, 2)
    m.touch_many([tb], [3])
    tb.free()


def test_arguments_of_the_wrong_kind_are_typed_errors() -> None:
    with pytest.raises(ArgumentTypeError, match="fast must be iterable, got NoneType"):
        TieredPool(fast=None, slow=npumem.Pool(MIB))  # type: ignore[arg-type]
    m = make(fast_max_block=4096)
    with pytest.raises(ArgumentTypeError, match="nbytes must be an int, got str"):
        m.alloc("x")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="blocks must be iterable, got int"):
        m.touch_many(5)  # type: ignore[arg-type]
    odd = TieredPool(
        fast=[npumem.Pool(MIB, cores=1)], slow=npumem.Pool(4 * MIB), core_of=lambda: None
    )
    with pytest.raises(ArgumentTypeError, match=r"core_of\(\) must return an int"):
        odd.alloc(64)
    m.check()


def test_a_mover_interrupted_by_ctrl_c_lets_it_through_and_moves_nothing() -> None:
    # KeyboardInterrupt was turned into MoveError; the KV cache and the pool let it through.
    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    m = TieredPool(
        fast=[npumem.Pool(MIB, cores=1)], slow=npumem.Pool(4 * MIB, cores=1), movers=interrupted
    )
    tb = m.alloc(4096, tier="slow")
    usage = [p.stats().bytes_in_use for p in (*m.fast, m.slow)]
    with pytest.raises(KeyboardInterrupt):
        m.promote(tb)
    assert tb.tier == "slow"
    assert [p.stats().bytes_in_use for p in (*m.fast, m.slow)] == usage
    assert m.check() == 1


def test_tiered_blocks_and_pools_refuse_to_be_copied_or_pickled() -> None:
    import copy
    import pickle

    tp = make()
    tb = tp.alloc(1000)
    for obj in (tb, tp):
        for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot copy or pickle"):
                duplicate(obj)
    assert tb.alive
    tb.free()
    assert tp.check() == 0


def test_counts_past_64_bits_are_refused_and_snapshots_read_back(tmp_path: Path) -> None:
    from npumem.sizes import MAX_BYTES
    from npumem.tiers.observe import load_tier_snapshot

    m = make()
    one = m.alloc(1, core=0, hot=True)
    big = m.alloc(1000, tier="slow")
    before = m.stats()
    for call in (
        lambda: m.touch(one, 2**64),
        lambda: m.touch(big, MAX_BYTES // 1000 + 1),  # the accesses fit, their bytes do not
        lambda: m.touch_many([one, big], [2**63, 2**63]),
        lambda: m.touch_many([big, big], [MAX_BYTES // 2000 + 1, MAX_BYTES // 2000 + 1]),
    ):
        with pytest.raises(InvalidArgumentError, match="past 2\\*\\*64 - 1"):
            call()
    assert m.stats() == before and m.accesses == 0
    # Up to the limit exactly: every figure fits, and the snapshot reads back.
    m.touch(one, MAX_BYTES - 2)
    m.touch_many([one, one], [1, 0])
    m.touch_many([one])
    assert m.accesses == MAX_BYTES and m.stats().bytes_accessed == MAX_BYTES
    path = m.snapshot("full").save(tmp_path / "tiers.json")
    assert load_tier_snapshot(path).stats == m.stats()
    with pytest.raises(InvalidArgumentError, match=r"the accesses recorded \(18,446,744"):
        m.touch(one)
    with pytest.raises(InvalidArgumentError, match="1 accesses would take the accesses"):
        m.touch_many([one])
    assert m.accesses == MAX_BYTES
    m.touch(one, 0)  # no access: nothing to refuse
    m.check()


def test_values_of_the_wrong_type_are_argument_type_errors() -> None:
    m = make()
    tb = m.alloc(100)
    before = (m.stats(), m.accesses)
    for call, text in (
        (lambda: m.touch(tb, True), "count must be an int, got bool"),
        (lambda: m.touch(tb, 1.0), "count must be an int, got float"),
        (lambda: m.touch_many([tb, tb], [1, 2.0]), r"counts\[1\] must be an int, got float"),
        (lambda: m.rebalance("1"), "max_bytes must be an int or None, got str"),
        (lambda: m.rebalance(1.5), "max_bytes must be an int or None, got float"),
        (lambda: m.rebalance(True), "max_bytes must be an int or None, got bool"),
        (lambda: m.alloc(10, hot="no"), "hot must be a bool, got str"),
        (lambda: m.alloc(10, hot=1), "hot must be a bool, got int"),
        (lambda: m.alloc(10, tier="slow", hot=None), "hot must be a bool, got NoneType"),
    ):
        with pytest.raises(ArgumentTypeError, match=text):
            call()  # type: ignore[no-untyped-call]
    with pytest.raises(InvalidArgumentError, match="count must be an int >= 0, got -1"):
        m.touch(tb, -1)
    with pytest.raises(InvalidArgumentError, match=r"counts\[0\] must be an int >= 0, got -2"):
        m.touch_many([tb], [-2])
    assert (m.stats(), m.accesses) == before
    assert m.check() == 1
