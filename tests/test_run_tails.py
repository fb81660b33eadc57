"""Blocks past a chunk through the public API: with the default pool a block of 4 KiB or more
reserves at most 17/16 of what it asks for (plus the rest of its last bank), around every
chunk multiple, in an empty pool and in one 2/3 full; `run_tails=False` keeps whole chunks; the
option is checked and reported; blocks of a quarter of a chunk and more, one size at a time,
fill the pool through the binding by tiling across chunk ends."""

from __future__ import annotations

import pytest

import npumem

KIB = 1 << 10
MIB = 1 << 20
CHUNK = 2 * MIB
BANK = 4 * KIB


def bank_slack(reserved: int) -> int:
    """The rest of the last bank of a block larger than a bank."""
    return -reserved % BANK if reserved > BANK else 0


def sizes_around_chunk_multiples() -> list[int]:
    sizes = [4 * KIB, 64 * KIB + 1, MIB + 1, CHUNK - 1]
    for k in (1, 2, 3, 7, 16, 31, 32, 40):
        base = k * CHUNK
        sizes += [base - 1, base, base + 1, base + 4 * KIB + 1, base + MIB, base + CHUNK - 64 * KIB]
    return sizes


def test_tails_are_on_by_default_and_can_be_turned_off() -> None:
    assert npumem.Pool(16 * MIB, cores=1).run_tails is True
    assert npumem.Pool(16 * MIB, cores=1, run_tails=False).run_tails is False
    with pytest.raises(npumem.ConfigError, match="run_tails must be a bool"):
        npumem.Pool(16 * MIB, cores=1, run_tails=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", sizes_around_chunk_multiples())
def test_default_pool_reserves_at_most_a_sixteenth_more(size: int) -> None:
    pool = npumem.Pool(96 * MIB, cores=1, backing="none")
    blk = pool.alloc(size)
    reserved = blk.block_bytes
    assert size <= reserved <= size + size // 16 + bank_slack(reserved), (size, reserved)
    blk.free()
    pool.check()


@pytest.mark.parametrize("size", [s for s in sizes_around_chunk_multiples() if s <= 16 * MIB])
def test_the_bound_holds_once_two_thirds_are_in_use(size: int) -> None:
    # Past 2/3 of the capacity (chunks still free) large blocks go to a free stretch first;
    # the quick attempt leaves them to the full path, which must not take a whole chunk.
    pool = npumem.Pool(96 * MIB, cores=1, backing="none")
    held = []
    while pool.stats().bytes_in_use < 66 * MIB:  # 33 whole chunks: no free end to start in
        held.append(pool.alloc(512 * KIB))
    assert pool.stats().chunks_free * CHUNK > 16 * MIB
    blk = pool.alloc(size)
    reserved = blk.block_bytes
    assert size <= reserved <= size + size // 16 + bank_slack(reserved), (size, reserved)
    blk.free()
    pool.free_many(held)
    pool.check()


def test_whole_chunks_without_tails() -> None:
    pool = npumem.Pool(16 * MIB, cores=1, backing="none", run_tails=False)
    blk = pool.alloc(CHUNK + 1)
    assert blk.block_bytes == 2 * CHUNK
    tailed = npumem.Pool(16 * MIB, cores=1, backing="none")
    assert tailed.alloc(CHUNK + 1).block_bytes == CHUNK + 256


def test_a_snapshot_records_the_option() -> None:
    pool = npumem.Pool(16 * MIB, cores=1, run_tails=False)
    assert pool.snapshot().config["run_tails"] is False


def fill_share(size: int) -> float:
    """Requested / capacity at the first failure of a 1 GiB pool filled with `size`-byte
    blocks through the binding (which tries the quick part with the GIL held first)."""
    pool = npumem.Pool(capacity=1 << 30, backing="none", cores=2)
    held = []
    with pytest.raises(npumem.OutOfMemoryError):
        while True:
            held.append(pool.alloc(size))
    pool.check()
    return len(held) * size / pool.capacity


@pytest.mark.parametrize(("size", "floor"), [(MIB + 1, 0.95), (700_000, 0.75), (600_000, 0.85)])
def test_one_size_over_a_quarter_chunk_fills_the_pool_from_python(size: int, floor: float) -> None:
    """Blocks that fit fewer than four to a chunk fill the pool only where they tile across
    chunk ends (blocks with a front). From Python, the quick part once cut a fresh chunk before
    the full path could take a front (700,000 B filled to 0.67), and a block whose bytes fit a
    chunk's free end but whose class does not found no front at all (1 MiB + 1 B, 0.51)."""
    share = fill_share(size)
    assert share >= floor, f"{size} B: the first failure came at {share:.3f} of the pool"
