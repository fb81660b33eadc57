"""The presentation `npumem` installs in the Rust extension when it is imported
(`_core.install_views`): what `Pool.snapshot()` returns, made from the extension's
`RawSnapshot` by `snapshot_view()`, and the byte formatter of typed results' text
(`npumem.sizes.format_bytes()`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npumem._core import Pool, RawSnapshot
    from npumem.monitor.snapshot import Snapshot

__all__ = ["snapshot_view"]


def snapshot_view(pool: Pool, raw: RawSnapshot) -> Snapshot:
    """An `npumem.monitor.Snapshot` of `pool` from the extension's raw snapshot."""
    # Imported here: the monitoring package loads when the first snapshot is taken.
    from npumem.monitor.snapshot import Snapshot

    return Snapshot._from_core(pool, raw)
