"""Memory tiers: a small fast memory per core (SRAM) in front of a large shared one (HBM).

`TieredPool` puts one `npumem.Pool` per core (the fast tier) and one shared pool
(the slow tier) behind one allocation call. Hot blocks go to the calling core's fast pool when
they fit and spill to the slow pool when it is full; a replaceable policy
(`npumem.tiers.policy`: access counts with decay, LRU, size only) tells
`TieredPool.rebalance` which blocks to promote and which to demote, within a byte budget.
Blocks move through movers (`npumem.tiers.movers`), and their handles
(`TieredBlock`) stay valid. `docs/tiers.md` describes the rules.

    >>> import npumem
    >>> from npumem.tiers import TieredPool
    >>> mem = TieredPool(
    ...     fast=[npumem.Pool(4 << 20, cores=1) for _ in range(2)],
    ...     slow=npumem.Pool(64 << 20, cores=2),
    ... )
    >>> tb = mem.alloc(4096, core=0, hot=True)
    >>> tb.tier, tb.core
    ('fast', 0)
    >>> mem.demote(tb); tb.tier
    'slow'
    >>> mem.touch(tb); report = mem.rebalance(); tb.tier
    'fast'
    >>> tb.free()

Static plans with tiers (which buffers live in SRAM at compile time) are in
`npumem.plan.tiers`.
"""

from __future__ import annotations

from npumem.tiers.block import FAST, SLOW, Tier, TieredBlock, TierKind
from npumem.tiers.events import EventKind, TierEvent
from npumem.tiers.movers import TierMover, host_copy
from npumem.tiers.policy import FrequencyPolicy, Heat, LRUPolicy, Policy, SizeOnlyPolicy
from npumem.tiers.pool import TieredPool
from npumem.tiers.report import RebalanceReport, TierMove, TierStats, TierUsage
from npumem.tiers.trace import replay

__all__ = [
    "FAST",
    "SLOW",
    "EventKind",
    "FrequencyPolicy",
    "Heat",
    "LRUPolicy",
    "Policy",
    "RebalanceReport",
    "SizeOnlyPolicy",
    "Tier",
    "TierEvent",
    "TierKind",
    "TierMove",
    "TierMover",
    "TierStats",
    "TierUsage",
    "TieredBlock",
    "TieredPool",
    "host_copy",
    "replay",
]
