"""Movers: the copy function a compaction calls when the pool's bytes are not in host memory.

A pool made with ``backing="none"`` only tracks offsets; its bytes live on a device. To move a
block, the compactor calls ``mover(transfers)`` with every copy of a batch, a list of
:class:`Transfer` in the order to perform them (each one like ``memmove``: source and destination
of one transfer may overlap), *before* any block is re-pointed. A transfer reads as the tuple
``(src_offset, dst_offset, nbytes)`` and carries ``src_address`` and ``dst_address`` (the pool's
``base_address`` plus each offset). If the mover raises, the batch is undone and the exception
propagates. A device runtime implements it with its copy engine (device-to-device copies on one
stream, then a synchronize).

:class:`HostMirror` is a reference mover over host memory: the "device" is a ``bytearray``. Tests
and examples use it to check that every byte lands where the pool says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from npumem._core import Transfer

__all__ = ["HostMirror", "Mover", "Transfer"]

#: A mover: called with a batch of transfers, in order; raising undoes the batch.
Mover = Callable[[Sequence[Transfer]], object]


class HostMirror:
    """A device arena simulated in host memory, with the mover that keeps it in step with a
    ``backing="none"`` pool: ``pool.compact_step(..., mover=mirror)``."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            from npumem.errors import InvalidArgumentError

            raise InvalidArgumentError(f"capacity must be an int >= 1, got {capacity!r}")
        self.memory = bytearray(capacity)
        self.batches = 0
        self.transfers = 0

    def write(self, offset: int, data: bytes) -> None:
        """Put ``data`` at ``offset``."""
        self.memory[offset : offset + len(data)] = data

    def read(self, offset: int, nbytes: int) -> bytes:
        """The ``nbytes`` bytes at ``offset``."""
        return bytes(self.memory[offset : offset + nbytes])

    def __call__(self, transfers: Sequence[Transfer] | Sequence[tuple[int, int, int]]) -> None:
        view = memoryview(self.memory)
        for src, dst, n in transfers:
            # Slice assignment copies through a temporary when the ranges overlap (memmove).
            view[dst : dst + n] = bytes(view[src : src + n])
        self.batches += 1
        self.transfers += len(transfers)
