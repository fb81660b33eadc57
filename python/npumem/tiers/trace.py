"""Recording what a tiered pool was asked to do, and replaying it under another policy.

`mem.record()` starts a recording; every allocation, access (one event per `touch`, per
block of `touch_many(blocks)`, or one per call of `touch_many(blocks, counts)`), free, explicit
move and rebalance is then appended as a `TierEvent`, in the order the
tiered pool serialized them (under its lock). `mem.stop_recording()` returns them.
`replay` runs such a list on a fresh tiered pool, single-threaded, and returns its
`TierStats`: the same accesses under another policy give comparable
hit rates.
"""

from __future__ import annotations

from collections.abc import Iterable

from npumem.errors import NpumemError
from npumem.tiers.block import TieredBlock
from npumem.tiers.events import TierEvent
from npumem.tiers.pool import TieredPool
from npumem.tiers.report import TierStats

__all__ = ["replay"]


def replay(events: Iterable[TierEvent], mem: TieredPool) -> TierStats:
    """Run `events` on `mem` (a fresh tiered pool) and return its stats. Calls that fail
    on `mem` (an allocation that does not fit, a move without room) are skipped, with the
    later events of that block."""
    blocks: dict[int, TieredBlock] = {}
    for ev in events:
        try:
            if ev.kind == "alloc":
                blocks[ev.serial] = mem.alloc(
                    ev.nbytes, core=ev.core, tier=ev.tier, hot=ev.hot, tag=ev.tag
                )
            elif ev.kind == "rebalance":
                mem.rebalance(ev.max_bytes)
            elif ev.kind == "touch_many":
                tbs, counts = [], []
                for serial, count in zip(ev.serials, ev.counts, strict=True):
                    known = blocks.get(serial)
                    if known is not None:
                        tbs.append(known)
                        counts.append(count)
                mem.touch_many(tbs, counts)
            elif ev.serial in blocks:
                tb = blocks[ev.serial]
                if ev.kind == "touch":
                    mem.touch(tb, ev.count)
                elif ev.kind == "free":
                    del blocks[ev.serial]
                    mem.free(tb)
                elif ev.kind == "promote":
                    mem.promote(tb, core=ev.core)
                elif ev.kind == "demote":
                    mem.demote(tb)
        except NpumemError:
            continue
    stats = mem.stats()
    for tb in blocks.values():
        mem.free(tb)
    return stats
