"""Compaction: move live blocks to heal fragmentation while the runtime keeps running.

Every device allocator in common use only gives back wholly free segments; an npumem block is
reached through a handle, so it can move. The Rust core pauses the pool (waiting for calls in
flight), moves batches of blocks (validated before anything moves, copied in an order that
never overwrites bytes still to be read, or handed to a *mover* when the bytes live on a
device), re-points the handles and resumes. Pinned blocks (`blk.pin()`, `with
blk.pinned():`, live buffer views) never move.

This package decides when and how:

* `Compactor` compacts on demand (`compact(mode="full" | "incremental")`), answers
  what-if questions (`plan()`), applies a `Policy` (compact when fragmentation passes
  a threshold; when an allocation fails although enough bytes are free or unused in partly
  used slabs, once `attach()` ed;
  never more often than an interval), respects a pause budget and calls pause and resume hooks;
* `CompactionReport` / `StepReport` say what moved and how long the pool stopped;
  `CompactionPlan` (of `PlannedMove`s) what would move. `StepReport`,
  `CompactionPlan` and `PlannedMove` are the classes the Rust extension returns
  (`Pool.compact_step`, `Pool.plan_compaction`); a `StagedCompaction`
  (`Pool.stage_compaction`) is planned while the pool runs, and `Pool.run_staged` makes it
  on the paused pool, checking only its moves (the compactor's steps run so);
* `npumem.compaction.movers`: the mover protocol for `backing="none"` pools and
  `HostMirror`, a reference mover.

    >>> import npumem
    >>> from npumem.compaction import Compactor
    >>> pool = npumem.Pool(64 << 20, cores=1)
    >>> blocks = [pool.alloc(300_000) for _ in range(40)]
    >>> for b in blocks[::2]:
    ...     b.free()
    >>> report = Compactor(pool).compact()
    >>> report.fragmentation_after < report.fragmentation_before
    True
"""

from __future__ import annotations

from npumem._core import CompactionPlan, PlannedMove, StagedCompaction, StepReport
from npumem.compaction.compactor import Compactor
from npumem.compaction.movers import HostMirror, Mover, Transfer
from npumem.compaction.policy import DEFAULT_THRESHOLD, MODES, Policy
from npumem.compaction.report import CompactionReport

__all__ = [
    "DEFAULT_THRESHOLD",
    "MODES",
    "CompactionPlan",
    "CompactionReport",
    "Compactor",
    "HostMirror",
    "Mover",
    "PlannedMove",
    "Policy",
    "StagedCompaction",
    "StepReport",
    "Transfer",
]
