"""Helpers shared by the pool tests."""

from __future__ import annotations

from typing import Any

import npumem


def state_of(pool: npumem.Pool) -> dict[str, Any]:
    """Everything observable about a pool, for 'unchanged' assertions."""
    stats = pool.stats().as_dict()
    return {"stats": stats, "blocks": pool.blocks()}


def assert_unchanged(pool: npumem.Pool, before: dict[str, Any]) -> None:
    pool.check()
    after = state_of(pool)
    assert after == before


def assert_block_rules(pool: npumem.Pool, blk: npumem.Block, align: int | None = None) -> None:
    """In bounds, aligned, bank-safe."""
    off, n, bank = blk.offset, blk.nbytes, pool.bank_size
    assert off >= 0 and off + n <= pool.capacity
    assert off % (align or pool.alignment) == 0
    if n <= bank:
        assert off // bank == (off + n - 1) // bank, f"[{off}, +{n}) straddles a bank"
    else:
        assert off % bank == 0, f"[{off}, +{n}) does not start on a bank"


def assert_unchanged_but_one_failure(pool: npumem.Pool, before: dict[str, Any]) -> None:
    """As `assert_unchanged`, except one more failed allocation (a request larger than the
    arena counts as one)."""
    pool.check()
    after = state_of(pool)
    assert after["stats"]["failed_allocs"] == before["stats"]["failed_allocs"] + 1
    for state in (before, after):
        state["stats"].pop("failed_allocs")
        for core in state["stats"]["per_core"]:
            core.pop("failed_allocs")
    assert after == before
