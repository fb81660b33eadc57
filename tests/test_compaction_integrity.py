"""Compaction keeps every byte: distinct patterns in every block, a fragmented pool, both
modes, host memory and a device (a mover), pinned blocks (explicit pins and live views) stay."""

from __future__ import annotations

import random

import pytest

import npumem
from compaction_helpers import MIB, fill, fragmented, intact
from npumem.compaction import Compactor, HostMirror


@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_every_byte_survives_and_pinned_blocks_stay(mode: str) -> None:
    pool = npumem.Pool(40 * MIB, cores=2)
    kept = fragmented(pool, 6)
    pinned, _ = kept[len(kept) // 3]
    viewed, _ = kept[2 * len(kept) // 3]
    pinned.pin()
    view = memoryview(viewed)  # a live view pins the block too
    where = {pinned.offset, viewed.offset}
    before = pool.stats()
    report = Compactor(pool).compact(mode, max_bytes=4 * MIB)
    assert report.blocks_moved > 0 and report.bytes_moved > 0
    assert {pinned.offset, viewed.offset} == where, "a pinned block moved"
    assert pool.check() == len(kept)
    view.release()
    pinned.unpin()
    for blk, ident in kept:
        assert intact(blk, ident), f"block {ident} lost its bytes"
    after = pool.stats()
    assert after.bytes_in_use == before.bytes_in_use
    if mode == "full":
        assert after.largest_free_block > before.largest_free_block
    else:
        # Steps of 4 MiB empty the sparsest chunks first; those need not join the largest free
        # run, which a step never shrinks (docs/compaction.md): chunks are what it frees.
        assert after.largest_free_block >= before.largest_free_block
        assert all(step.bytes <= 4 * MIB for step in report.steps)
        assert after.chunks_free > before.chunks_free


def test_full_compaction_makes_free_space_one_run_but_for_block_shapes() -> None:
    # Whole power-of-two blocks and slab objects: nothing trims, so everything packs. Rounds
    # enough that the free chunks left at the arena's end (one block with a front takes them
    # with the free end before them) are not most of the free bytes.
    pool = npumem.Pool(24 * MIB, cores=2)
    kept = fragmented(pool, 14, sizes=(64, 256, 1024, 4096, 16_384, 65_536, 262_144, 1 << 20))
    before = pool.stats()
    assert before.external_fragmentation > 0.3
    report = Compactor(pool).compact("full")
    after = pool.stats()
    # What is left outside the largest run: at most the last, partly filled chunk.
    assert after.bytes_free - after.largest_free_block < pool.chunk_size
    assert report.fragmentation_after < pool.chunk_size / after.bytes_free
    assert report.fragmentation_before > 0.3
    for blk, ident in kept:
        assert intact(blk, ident)
    pool.check()


def odd_sizes_compacted(seed: int, backing: str) -> tuple[int, int, int]:
    """Fill a 64 MiB pool with sizes of 1-100 KiB (not powers of two: blocks are packed where
    their buddy node would not start), free every other block, compact fully, and check every
    kept byte. Returns the free bytes outside the largest free block, the bank slack (the rest
    of the last bank of each block larger than a bank: the next block starts on a bank) and
    the chunk size. One core pool: with more, the pool a call uses follows the CPU the
    thread runs on, so the layout that a seed makes would depend on the scheduler."""
    pool = npumem.Pool(64 * MIB, cores=1, backing=backing)
    mirror = HostMirror(pool.capacity) if backing == "none" else None
    rng = random.Random(seed)
    made = []
    while True:
        try:
            made.append(pool.alloc(rng.randint(1024, 100 * 1024)))
        except npumem.OutOfMemoryError:
            break
    kept = []
    for i, blk in enumerate(made):
        if i % 2 == 0:
            blk.free()
        else:
            fill(blk, i, mirror)
            kept.append((blk, i))
    before = pool.stats()
    assert before.external_fragmentation > 0.9
    Compactor(pool, mover=mirror).compact("full")
    after = pool.stats()
    bank = pool.bank_size
    slack = sum(
        -b.block_bytes % bank for b in pool.blocks() if bank < b.block_bytes <= pool.chunk_size // 2
    )
    for blk, ident in kept:
        assert intact(blk, ident, mirror)
    pool.check()
    return after.bytes_free - after.largest_free_block, slack, pool.chunk_size


@pytest.mark.parametrize("backing", ["host", "none"])
def test_full_compaction_of_odd_sizes_leaves_only_the_bank_slack_and_the_last_chunk(
    backing: str,
) -> None:
    # What no packing can use is the bank slack and the partly filled last chunk; for this
    # seed the full compaction's packing leaves nothing more.
    outside, slack, chunk = odd_sizes_compacted(5, backing)
    assert outside <= slack + chunk, (outside, slack)


def test_full_compaction_of_odd_sizes_packs_tightly_over_many_seeds() -> None:
    # The packing is a heuristic: over seeds 0-59 (measured), the free bytes outside the
    # largest free block are at the median about half a chunk beyond the bank slack and at
    # worst 1.26 chunks (seed 21), so the bound of the one-seed test above does not hold for
    # every seed. The bounds here keep a margin over those figures: a packing that strands
    # another quarter chunk of holes on some seed fails.
    beyond = []
    for seed in range(40):
        outside, slack, chunk = odd_sizes_compacted(seed, "none")
        beyond.append((outside - slack) / chunk)
    assert max(beyond) <= 1.5, sorted(beyond)[-3:]
    assert sorted(beyond)[len(beyond) // 2] <= 0.75, sorted(beyond)


def test_a_device_pool_moves_its_bytes_through_the_mover() -> None:
    pool = npumem.Pool(40 * MIB, cores=2, backing="none")
    mirror = HostMirror(pool.capacity)
    kept = fragmented(pool, 6, mirror=mirror)
    report = Compactor(pool, mover=mirror).compact("full")
    assert mirror.batches >= 1 and mirror.transfers >= 1 and report.blocks_moved > 0
    for blk, ident in kept:
        assert intact(blk, ident, mirror), f"block {ident} lost its bytes on the device"
    pool.check()
    report = Compactor(pool, mover=mirror).compact("incremental", max_bytes=2 * MIB)
    for blk, ident in kept:
        assert intact(blk, ident, mirror)


def test_plan_moves_nothing_and_predicts_the_gain() -> None:
    pool = npumem.Pool(40 * MIB, cores=1)
    kept = fragmented(pool, 6)
    blocks = pool.blocks()
    compactor = Compactor(pool)
    plan = compactor.plan("full")
    assert pool.blocks() == blocks, "plan() moved something"
    assert plan.blocks > 0 and plan.bytes > 0 and plan.expected_gain > 0
    assert len(plan.moves) > 0 and all(m.src != m.dst for m in plan.moves)
    assert plan.fragmentation_after < plan.fragmentation_before
    report = compactor.compact("full")
    assert report.largest_free_after == plan.largest_free_after
    assert str(plan).startswith("compaction plan (full)")
    step = compactor.plan("incremental", max_bytes=MIB)
    assert step.bytes <= MIB
    for blk, ident in kept:
        assert intact(blk, ident)


@pytest.mark.parametrize("backing", ["host", "none"])
def test_the_plan_of_a_compactor_with_a_mover_is_what_it_does(backing: str) -> None:
    # With a mover a full compaction is one batch (no slab consolidation): the plan says the same.
    pool = npumem.Pool(40 * MIB, cores=1, backing=backing)
    mirror = HostMirror(pool.capacity)
    kept = fragmented(pool, 6, mirror=mirror)
    compactor = Compactor(pool, mover=mirror)
    plan = compactor.plan("full")
    without = Compactor(pool).plan("full") if backing == "host" else plan
    report = compactor.compact("full")
    assert (plan.blocks, plan.bytes) == (report.blocks_moved, report.bytes_moved)
    assert report.largest_free_after == plan.largest_free_after
    if backing == "host":
        # Without a mover the plan may also repack (whole slabs included): never a worse result.
        assert without.largest_free_after >= plan.largest_free_after
    for blk, ident in kept:
        assert intact(blk, ident, mirror)
    pool.check()


def test_move_blocks_slides_and_swaps_on_host_memory() -> None:
    pool = npumem.Pool(32 * MIB, cores=1)
    gap = pool.alloc(2 * MIB)
    run = pool.alloc(5 * MIB)
    a, b = pool.alloc(64 << 10), pool.alloc(64 << 10)
    for ident, blk in enumerate((run, a, b)):
        fill(blk, ident)
    gap.free()
    oa, ob = a.offset, b.offset
    with pool.pause() as pause:
        done = pool.move_blocks(pause, [(run, 0), (a, ob), (b, oa)])
        pool.check()  # inside the pause: check() nests
    assert len(done) == 3 and (run.offset, a.offset, b.offset) == (0, ob, oa)
    for ident, blk in enumerate((run, a, b)):
        assert intact(blk, ident)


def test_evacuating_a_chunk_empties_it_and_keeps_every_byte() -> None:
    pool = npumem.Pool(40 * MIB, cores=1)
    kept = fragmented(pool, 4, sizes=(200, 3000, 20_000, 70_000, 300_000))
    chunk = kept[0][0].offset // pool.chunk_size
    with pool.pause() as pause:
        done = pool.compact_step(pause, "evacuate", chunks=[chunk])
    assert done.blocks > 0
    assert all(b.offset // pool.chunk_size != chunk for b in pool.blocks())
    for blk, ident in kept:
        assert intact(blk, ident)
    pool.check()
