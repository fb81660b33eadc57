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

from collections.abc import Callable, Iterable, Sequence

from npumem._core import Transfer
from npumem._shown import shown

__all__ = ["HostMirror", "Mover", "Transfer"]

#: A mover: called with each wave of a batch's transfers, in order; raising undoes the batch.
Mover = Callable[[Sequence[Transfer]], object]


class HostMirror:
    """A device arena simulated in host memory, with the mover that keeps it in step with a
    `backing="none"` pool: `pool.compact_step(..., mover=mirror)`. Its `capacity` is the
    pool's `offset_space` (its `capacity` unless it can grow: then offsets pass
    `max_capacity`)."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            from npumem.errors import InvalidArgumentError

            raise InvalidArgumentError(f"capacity must be an int >= 1, got {shown(capacity)}")
        self.memory = bytearray(capacity)
        self.batches = 0
        self.transfers = 0

    def _range(self, offset: object, nbytes: object, what: str) -> tuple[int, int]:
        """`offset` and `nbytes` checked: ints (not bools), `nbytes` >= 0, and the `nbytes`
        bytes from `offset` inside the mirror, which never grows nor wraps around; `what`
        names the range in the error."""
        from npumem.errors import ArgumentTypeError, InvalidArgumentError

        for name, value in (("offset", offset), ("nbytes", nbytes)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArgumentTypeError(
                    f"{what}: {name} must be an int, got {type(value).__name__}"
                )
        assert isinstance(offset, int) and isinstance(nbytes, int)
        if nbytes < 0:
            raise InvalidArgumentError(f"{what}: nbytes must be >= 0, got {shown(nbytes)}")
        size = len(self.memory)
        if offset < 0 or offset + nbytes > size:
            raise InvalidArgumentError(
                f"{what}: {shown(nbytes)} bytes at offset {shown(offset)} do not lie inside the "
                f"mirror's {size} bytes"
            )
        return offset, nbytes

    def write(self, offset: int, data: bytes) -> None:
        """Put `data` (bytes-like) at `offset`; `InvalidArgumentError`, and nothing written,
        unless it lies inside the mirror."""
        from npumem.errors import ArgumentTypeError

        try:
            raw = memoryview(data).tobytes()
        except TypeError:
            raise ArgumentTypeError(
                f"write: data must be bytes-like, got {type(data).__name__}"
            ) from None
        at, n = self._range(offset, len(raw), "write")
        self.memory[at : at + n] = raw

    def read(self, offset: int, nbytes: int) -> bytes:
        """The `nbytes` bytes at `offset`; `InvalidArgumentError` unless they lie inside the
        mirror (never fewer bytes)."""
        at, n = self._range(offset, nbytes, "read")
        return bytes(self.memory[at : at + n])

    def __call__(self, transfers: Sequence[Transfer] | Sequence[tuple[int, int, int]]) -> None:
        """Copy each transfer `(src, dst, nbytes)`, in order. When a transfer does not lie
        inside the mirror (a mirror smaller than its pool), `InvalidArgumentError` is raised
        before anything is copied (and the pool undoes the batch)."""
        copies: list[tuple[int, int, int]] = []
        each: Iterable[Iterable[int]] = transfers
        for i, (src, dst, n) in enumerate(each):
            at, nbytes = self._range(src, n, f"transfers[{i}] src")
            copies.append((at, self._range(dst, n, f"transfers[{i}] dst")[0], nbytes))
        view = memoryview(self.memory)
        for at, to, nbytes in copies:
            # Slice assignment copies through a temporary when the ranges overlap (memmove).
            view[to : to + nbytes] = bytes(view[at : at + nbytes])
        self.batches += 1
        self.transfers += len(copies)
