"""Movers: the copy function a compaction calls when the pool's bytes are not in host memory.

A pool made with `backing="none"` only tracks offsets; its bytes live on a device. To move a
block, the compactor calls `mover(transfers)` once per *wave* of a batch, with a list of
`Transfer` copies that touch disjoint bytes and may run in parallel, *before* any block is
re-pointed; the mover returns once they are all done. A transfer reads as the tuple
`(src_offset, dst_offset, nbytes)` and carries `src_address` and `dst_address` (the pool's
`base_address` plus each offset). If the mover raises (having done any part of the wave), the
pool copies the earlier waves back through the same mover, undoes the batch and the exception
propagates: every block's bytes are where they were. A device runtime implements it with its
copy engines (device-to-device copies, then a synchronize). `docs/compaction.md` states the
contract in full.

`HostMirror` is a reference mover over host memory: the "device" is a `bytearray`. Tests
and examples use it to check that every byte lands where the pool says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from npumem._core import Transfer
from npumem._shown import shown

__all__ = ["HostMirror", "Mover", "Transfer"]

#: A mover: called with each wave of a batch's transfers, in order; raising undoes the batch.
Mover = Callable[[Sequence[Transfer]], object]


class HostMirror:
    """A device arena simulated in host memory, with the mover that keeps it in step with a
    `backing="none"` pool: `pool.compact_step(..., mover=mirror)`."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            from npumem.errors import InvalidArgumentError

            raise InvalidArgumentError(f"capacity must be an int >= 1, got {shown(capacity)}")
        self.memory = bytearray(capacity)
        self.batches = 0
        self.transfers = 0

    def write(self, offset: int, data: bytes) -> None:
        """Put `data` at `offset`."""
        self.memory[offset : offset + len(data)] = data

    def read(self, offset: int, nbytes: int) -> bytes:
        """The `nbytes` bytes at `offset`."""
        return bytes(self.memory[offset : offset + nbytes])

    def __call__(self, transfers: Sequence[Transfer] | Sequence[tuple[int, int, int]]) -> None:
        view = memoryview(self.memory)
        for src, dst, n in transfers:
            # Slice assignment copies through a temporary when the ranges overlap (memmove).
            view[dst : dst + n] = bytes(view[src : src + n])
        self.batches += 1
        self.transfers += len(transfers)
