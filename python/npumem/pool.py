"""``npumem.Pool``: the Rust pool (``npumem._core.Pool``) with the views that the Python side
builds, such as :meth:`Pool.snapshot`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from npumem import _core

if TYPE_CHECKING:
    from npumem.monitor.snapshot import Snapshot

__all__ = ["Pool"]


class Pool(_core.Pool):
    """A pool over one arena: allocate blocks from any thread, read ``stats()``, ``check()`` it.

    ``Pool(capacity, *, cores=None, chunk_size=2097152, min_block=256, bank_size=4096,
    alignment=64, slab_sizes=(64, ..., 4096), backing="host", placement="best-fit",
    core_reserve=1, name=None)``.
    """

    __slots__ = ()

    def snapshot(self) -> Snapshot:
        """Pause the pool and return an :class:`npumem.monitor.Snapshot`: every live block,
        every maximal free run, and the stats, all at one moment."""
        # Imported here: the monitoring package loads only when a snapshot is taken.
        from npumem.monitor.snapshot import Snapshot

        return Snapshot._from_core(self, self.raw_snapshot())
