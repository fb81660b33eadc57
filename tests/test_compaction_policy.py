"""The compactor's policies and hooks: the fragmentation threshold, the interval, the pause
budget, pause and resume hooks around every stop, and the report."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import NoReturn

import pytest

import npumem
from compaction_helpers import MIB, fragmented, intact
from npumem.compaction import Compactor, Policy


def fragmented_pool() -> tuple[npumem.Pool, list[tuple[npumem.Block, int]]]:
    # Seven rounds: the pool's fragmentation (0.36) passes the default threshold; six leave
    # 0.26, as blocks of one size pack back to back.
    pool = npumem.Pool(40 * MIB, cores=2)
    return pool, fragmented(pool, 7)


def test_the_threshold_and_the_interval_decide() -> None:
    pool, kept = fragmented_pool()
    frag = pool.stats().external_fragmentation
    assert frag > 0.3
    assert Compactor(pool, policy=Policy(fragmentation_threshold=0.9)).maybe_compact() is None
    assert Compactor(pool, policy=Policy(fragmentation_threshold=None)).maybe_compact() is None
    compactor = Compactor(pool, policy=Policy(min_interval=3600))
    report = compactor.maybe_compact()
    assert report is not None and report.reason.startswith("fragmentation")
    assert report.fragmentation_after < report.fragmentation_before
    # Fragmented again at once: the interval holds the next automatic compaction back.
    more = fragmented(pool, 1)
    if pool.stats().external_fragmentation > 0.3:
        assert compactor.maybe_compact() is None
    assert compactor.compactions == 1
    for blk, ident in kept + more:
        assert intact(blk, ident)


@dataclass
class FakeSample:
    external_fragmentation: float


def test_a_monitor_sample_triggers_the_policy() -> None:
    pool, _ = fragmented_pool()
    compactor = Compactor(pool)
    compactor.on_sample(FakeSample(0.1))
    assert compactor.compactions == 0
    compactor.on_sample(FakeSample(pool.stats().external_fragmentation))
    assert compactor.compactions == 1


def test_hooks_run_around_every_stop_and_a_failing_hook_stops_nothing() -> None:
    pool, kept = fragmented_pool()
    events: list[str] = []
    compactor = Compactor(
        pool, on_pause=lambda: events.append("pause"), on_resume=lambda: events.append("resume")
    )
    report = compactor.compact("incremental", max_bytes=2 * MIB)
    assert len(report.steps) >= 2
    assert events == ["pause", "resume"] * len(report.steps)

    def refuse() -> None:
        raise RuntimeError("streams would not stop")

    before = pool.blocks()
    with pytest.raises(RuntimeError, match="would not stop"):
        Compactor(pool, on_pause=refuse).compact("full")
    assert pool.blocks() == before, "a refused pause moved blocks"
    with pool.pause(0.5) as pause:
        assert pause.held, "the pool was left paused"
    for blk, ident in kept:
        assert intact(blk, ident)


class _InterruptedAsTheRunReturns:
    """The pool, except that Ctrl-C comes during `run_staged`: its handler raises as the call
    returns, the step made."""

    def __init__(self, pool: npumem.Pool) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> object:
        return getattr(self._pool, name)

    def run_staged(self, *args: object, **kwargs: object) -> NoReturn:
        self._pool.run_staged(*args, **kwargs)  # type: ignore[arg-type]
        raise KeyboardInterrupt


def test_an_interrupt_as_a_step_returns_leaves_the_step_counted_and_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool, kept = fragmented_pool()
    compactor = Compactor(pool)
    monkeypatch.setattr(compactor, "pool", _InterruptedAsTheRunReturns(pool))
    before = pool.stats().external_fragmentation
    with pytest.raises(KeyboardInterrupt):
        compactor.compact("full")
    assert pool.stats().external_fragmentation < before, "the step was made"
    assert compactor.compactions == 1
    (report,) = compactor.reports
    assert len(report.steps) == 1 and report.steps[0].blocks > 0
    assert any("stopped after 1 step(s): KeyboardInterrupt" in note for note in report.notes)
    for blk, ident in kept:
        assert intact(blk, ident)


def test_a_pause_budget_splits_a_full_compaction_into_steps() -> None:
    pool, kept = fragmented_pool()
    compactor = Compactor(pool, pause_budget=1e-4)  # 0.1 ms: no full compaction fits
    report = compactor.compact("full")
    assert report.mode == "incremental" and report.notes and "pause budget" in report.notes[0]
    assert len(report.steps) >= 1
    # Each step moves what the budget allows at the measured throughput (at least 64 KiB).
    assert all(s.bytes <= max(1 << 16, int(1e-4 * 5e9)) + 3 * MIB for s in report.steps)
    for blk, ident in kept:
        assert intact(blk, ident)


def test_the_report_says_what_happened() -> None:
    pool, _ = fragmented_pool()
    compactor = Compactor(pool)
    report = compactor.compact("full")
    assert compactor.reports[-1] is report and compactor.compactions == 1
    assert report.blocks_moved == sum(s.blocks for s in report.steps) > 0
    assert report.bytes_moved > 0 and report.longest_pause == max(report.pause_times) > 0
    assert report.gain == report.largest_free_after - report.largest_free_before > 0
    d = report.as_dict()
    assert json.loads(json.dumps(d))["blocks_moved"] == report.blocks_moved
    text = str(report)
    assert "compaction (full, manual)" in text and "fragmentation" in text
    assert "Compactor" in repr(compactor)


def test_the_plan_predicts_the_free_bytes_and_fragmentation_after_packing_slabs() -> None:
    # Slab objects, nine in ten freed, and 1 MiB blocks, every other freed, one pinned: a full
    # compaction packs the objects and gives the emptied slabs back, so more bytes are free
    # afterwards than before; the plan's fragmentation afterwards counts them.
    pool = npumem.Pool(16 * MIB, cores=1)
    small = [pool.alloc((64, 256, 1024, 2048)[i % 4]) for i in range(10_000)]
    big = [pool.alloc(MIB) for _ in range(6)]
    for blk in small[1::10] + small[2::10] + small[3::10] + small[4::10] + small[5::10]:
        blk.free()
    for blk in small[6::10] + small[7::10] + small[8::10] + small[9::10]:
        blk.free()
    for blk in big[::2]:
        blk.free()
    big[3].pin()
    compactor = Compactor(pool)
    before = pool.stats()
    plan = compactor.plan("full")
    report = compactor.compact("full")
    after = pool.stats()
    assert after.bytes_free > before.bytes_free
    assert (plan.bytes_free, plan.bytes_free_after) == (before.bytes_free, after.bytes_free)
    assert plan.largest_free_after == after.largest_free_block
    assert plan.fragmentation_after == pytest.approx(after.external_fragmentation)
    assert report.fragmentation_after == pytest.approx(after.external_fragmentation)
    pool.check()


@pytest.mark.parametrize("mode", ["incremental", "full"])
def test_a_step_frees_the_chunks_and_bytes_its_plan_counts(mode: str) -> None:
    # Slab objects and blocks of every size up to 1 MiB, most of them freed, on two cores: an
    # incremental step empties slabs by moving their objects out, and the slabs, and the
    # chunks they alone kept, go back after it. The plan counts them as the pool then does.
    pool = npumem.Pool(32 * MIB, cores=2, backing="none")
    rng = random.Random(3)
    blocks = []
    with pytest.raises(npumem.OutOfMemoryError):
        while True:
            blocks.append(pool.alloc(int(2 ** rng.uniform(6, 20))))
    rng.shuffle(blocks)
    for blk in blocks[: len(blocks) * 7 // 10]:
        blk.free()
    budget = {"max_bytes": 4 * MIB} if mode == "incremental" else {}
    with pool.pause() as pause:
        plan = pool.plan_compaction(mode, pause=pause, **budget)
        before = pool.stats()
        step = pool.compact_step(pause, mode, **budget)
        after = pool.stats()
    assert step.blocks == plan.blocks > 0
    assert plan.chunks_emptied == step.chunks_freed == after.chunks_free - before.chunks_free > 0
    assert (plan.bytes_free, plan.bytes_free_after) == (before.bytes_free, after.bytes_free)
    assert plan.largest_free_after == after.largest_free_block
    pool.check()
