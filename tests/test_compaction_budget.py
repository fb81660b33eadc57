"""Compaction under a pause budget: a rescue makes the room a failing allocation needs even when
one move is larger than a step; a background compaction moves what fits and says what it could
not move and why; a compaction whose own plan predicts no gain moves nothing; a mover that fails
during a rescue leaves the pool as it was."""

from __future__ import annotations

import pytest

import npumem
from compaction_helpers import MIB, fragmented, intact
from npumem.compaction import Compactor, HostMirror

STAMP = 1 << 16


def stamp(blk: npumem.Block, ident: int, mirror: HostMirror | None = None) -> None:
    """Mark the first, a middle and the last 64 KiB of ``blk`` with the pattern of ``ident``
    (filling hundreds of megabytes would make the test slow)."""
    for at in (0, blk.nbytes // 2, blk.nbytes - STAMP):
        data = bytes([(ident * 37 + at // STAMP) & 0xFF]) * STAMP
        if mirror is None:
            _write(blk, at, data)
        else:
            mirror.write(blk.offset + at, data)


def _write(blk: npumem.Block, at: int, data: bytes) -> None:
    view = memoryview(blk)
    view[at : at + len(data)] = data
    view.release()


def stamped(blk: npumem.Block, ident: int, mirror: HostMirror | None = None) -> bool:
    for at in (0, blk.nbytes // 2, blk.nbytes - STAMP):
        want = bytes([(ident * 37 + at // STAMP) & 0xFF]) * STAMP
        if mirror is None:
            view = memoryview(blk)
            got = view[at : at + STAMP].tobytes()
            view.release()
        else:
            got = mirror.read(blk.offset + at, STAMP)
        if got != want:
            return False
    return True


def seed_timeline(
    mirror: HostMirror | None = None,
) -> tuple[npumem.Pool, list[tuple[npumem.Block, int]]]:
    """The seed's 800 MiB pool and models: A's weights (200 MiB) and activations (100 MiB),
    B's weights (300 MiB) and activations (150 MiB); then A's weights and B's activations go.
    (In the seed's own order, A's activations freed first and then B's weights, npumem
    leaves 300 MiB in one piece and the 250 MiB request needs no compaction: see
    `tests/test_pool.py`.) Here A's activations (at 200 MiB) and B's weights (at 300 MiB)
    stay, with 400 MiB free in two pieces of 200 MiB: the request fails without a compaction,
    and only moving a block of 100 MiB or more makes the room.
    Returns the pool and the live blocks with their pattern ids."""
    if mirror is None:
        pool = npumem.Pool(800 * MIB, cores=1)
    else:
        pool = npumem.Pool(800 * MIB, cores=1, backing="none")
    a_weights = pool.alloc(200 * MIB, tag="model A weights")
    a_act = pool.alloc(100 * MIB, tag="model A activations")
    b_weights = pool.alloc(300 * MIB, tag="model B weights")
    b_act = pool.alloc(150 * MIB, tag="model B activations")
    a_weights.free()
    b_act.free()
    kept = [(a_act, 1), (b_weights, 2)]
    for blk, ident in kept:
        stamp(blk, ident, mirror)
    return pool, kept


def test_the_seed_timeline_fails_without_a_compactor() -> None:
    pool, _ = seed_timeline()
    stats = pool.stats()
    assert stats.bytes_free >= 250 * MIB > stats.largest_free_block
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(250 * MIB)


def test_a_rescue_under_a_pause_budget_makes_the_room_the_request_needs() -> None:
    pool, kept = seed_timeline()
    compactor = Compactor(pool, pause_budget=0.01).attach()
    big = pool.alloc(250 * MIB)
    assert big.nbytes == 250 * MIB
    report = compactor.reports[-1]
    assert report.reason.startswith("allocation of")
    assert report.blocks_moved >= 1
    # A 100 or 150 MB block is larger than any step the budget allows: the rescue moved it
    # anyway, and says it went over the budget.
    assert any(s.bytes >= 100 * MIB for s in report.steps)
    assert any("over the budget" in n for n in report.notes)
    for blk, ident in kept:
        assert stamped(blk, ident)
    pool.check()


def test_a_background_compaction_under_a_budget_says_what_it_could_not_move() -> None:
    pool, kept = seed_timeline()
    compactor = Compactor(pool, pause_budget=0.01)
    before = pool.stats().largest_free_block
    report = compactor.compact("full")
    assert report.mode == "incremental"
    assert all(s.bytes < 100 * MIB for s in report.steps), "no step moved more than fits"
    assert report.unmoved_blocks >= 1 and report.unmoved_bytes >= 100 * MIB
    assert any("not moved" in n and "larger than a step" in n for n in report.notes), report.notes
    assert "not moved" in str(report)
    assert report.as_dict()["unmoved_blocks"] == report.unmoved_blocks
    assert pool.stats().largest_free_block >= before
    for blk, ident in kept:
        assert stamped(blk, ident)
    pool.check()


def test_a_compaction_whose_plan_predicts_no_gain_moves_nothing() -> None:
    pool = npumem.Pool(64 * MIB, cores=1)
    kept = fragmented(pool, 8)
    compactor = Compactor(pool)
    first = compactor.compact("full")
    assert first.blocks_moved > 0
    blocks = pool.blocks()
    for mode in ("full", "incremental"):
        again = compactor.compact(mode)
        assert again.blocks_moved == 0 and not again.steps, mode
        assert any("nothing moved" in n for n in again.notes)
        assert pool.blocks() == blocks
    for blk, ident in kept:
        assert intact(blk, ident)


def test_a_rescue_that_no_compaction_can_serve_moves_nothing() -> None:
    pool, kept = seed_timeline()
    compactor = Compactor(pool, pause_budget=0.01).attach()
    blocks = pool.blocks()
    free = pool.stats().bytes_free
    # Enough bytes are free, but the pinned blocks keep any stretch from growing that long.
    with kept[0][0].pinned(), kept[1][0].pinned(), pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(free - MIB)
    assert pool.blocks() == blocks
    assert compactor.reports[-1].blocks_moved == 0
    assert any("nothing moved" in n for n in compactor.reports[-1].notes)


def test_a_mover_that_fails_during_a_rescue_leaves_the_pool_as_it_was() -> None:
    mirror = HostMirror(800 * MIB)
    pool, kept = seed_timeline(mirror)
    calls = 0

    def failing(transfers: object) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("the device is gone")

    compactor = Compactor(pool, mover=failing, pause_budget=0.01).attach()
    blocks, stats = pool.blocks(), pool.stats()
    # The rescue (the pool's out-of-memory handler) failed: the allocation fails, the mover's
    # exception its cause.
    with pytest.raises(npumem.OutOfMemoryError) as caught:
        pool.alloc(250 * MIB)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert str(caught.value.__cause__) == "the device is gone"
    assert calls >= 1
    assert pool.blocks() == blocks
    assert pool.stats().largest_free_block == stats.largest_free_block
    pool.check()
    for blk, ident in kept:
        assert stamped(blk, ident, mirror)
    # With a working mover the same rescue succeeds and keeps every byte.
    compactor.mover = mirror
    compactor.policy = compactor.policy.__class__(min_interval=0)
    assert pool.alloc(250 * MIB).nbytes == 250 * MIB
    for blk, ident in kept:
        assert stamped(blk, ident, mirror)


def test_a_staged_compaction_is_planned_while_the_pool_runs_and_made_once() -> None:
    pool = npumem.Pool(64 * MIB, cores=1)
    kept = fragmented(pool, 8)
    staged = pool.stage_compaction("full")
    assert staged.moves > 0 and staged.bytes > 0 and staged.planning_seconds >= 0
    assert "StagedCompaction(" in repr(staged)
    assert staged.report is None, "not run yet"
    # Meanwhile: a third of the kept blocks go, new ones come.
    survivors = []
    for k, (blk, ident) in enumerate(kept):
        if k % 3 == 0:
            blk.free()
        else:
            survivors.append((blk, ident))
    extra = [pool.alloc(3000) for _ in range(50)]
    with pool.pause(5.0) as pause:
        done = pool.run_staged(pause, staged)
        assert staged.report == done
        with pytest.raises(npumem.InvalidArgumentError, match="ran already"):
            pool.run_staged(pause, staged)
        assert staged.report == done, "a refused second run keeps the first one's report"
    assert done.blocks > 0 and done.stale >= 1
    assert done.as_dict()["stale"] == done.stale
    pool.check()
    for blk, ident in survivors:
        assert intact(blk, ident)
    assert all(b.alive for b in extra)
