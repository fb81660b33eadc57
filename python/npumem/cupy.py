"""CuPy on an npumem pool: `cupy.cuda.set_allocator(npumem.cupy.allocator(pool))`.

Each CuPy allocation is a raw block of the pool (it never moves), 256-byte aligned, at the
pool's base address plus its offset; CuPy's memory object frees it when the last array using
it goes. The pool must be a `backing="none"` pool over device memory the runtime reserved.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from npumem import clib
from npumem.errors import MissingDependencyError

if TYPE_CHECKING:
    from npumem._core import Pool

ALIGNMENT = 256


class _RawBlock:
    """One raw block of a pool, freed when CuPy lets go of it (the owner of its memory)."""

    def __init__(self, capsule: object, offset: int, nbytes: int) -> None:
        self.capsule = capsule  # keeps the pool alive
        self.offset = offset
        self.nbytes = nbytes

    def __del__(self) -> None:
        clib.load().npumem_free_raw(clib.capsule_pointer(self.capsule), self.offset, self.nbytes)


def allocator(pool: Pool) -> Callable[[int], Any]:
    """A CuPy allocator function (`size -> cupy.cuda.MemoryPointer`) over `pool`."""
    try:
        import cupy
    except ImportError as exc:
        raise MissingDependencyError("npumem.cupy needs CuPy: pip install cupy-cuda12x") from exc
    capsule = pool.c_pool()
    handle = clib.capsule_pointer(capsule)
    lib = clib.load()

    def malloc(size: int) -> Any:
        nbytes = max(int(size), 1)
        offset, address = ctypes.c_size_t(), ctypes.c_uint64()
        status = lib.npumem_alloc_raw(
            handle, nbytes, ALIGNMENT, ctypes.byref(offset), ctypes.byref(address)
        )
        if status == 7:  # NPUMEM_ERR_OUT_OF_MEMORY: CuPy frees its cached blocks and retries
            raise cupy.cuda.memory.OutOfMemoryError(nbytes, 0, 0)
        clib.check(status)
        owner = _RawBlock(capsule, offset.value, nbytes)
        memory = cupy.cuda.UnownedMemory(address.value, nbytes, owner=owner)
        return cupy.cuda.MemoryPointer(memory, 0)

    return malloc
