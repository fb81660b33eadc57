"""CuPy on an npumem pool: `cupy.cuda.set_allocator(npumem.cupy.allocator(pool))`.

Each CuPy allocation is a raw block of the pool (it never moves), 256-byte aligned, at the
pool's base address plus its offset; CuPy's memory object frees it when the last array using
it goes. The pool must be a `backing="none"` pool over device memory the runtime reserved, with
a nonzero `base_address` (the device address of its offset 0): `allocator()` refuses a
host-backed pool (its bytes are host memory, which CuPy would use as device memory) and one
without a base address (its pointers would be bare offsets, offset 0 a NULL pointer).
"""

from __future__ import annotations

import ctypes
import operator
from collections.abc import Callable
from typing import Any

from npumem import clib
from npumem._core import Pool
from npumem._shown import shown
from npumem.errors import ArgumentTypeError, InvalidArgumentError, MissingDependencyError

ALIGNMENT = 256

# The largest size `malloc` passes on: the C library's `size_t`, which would wrap a larger one.
_MAX_SIZE = (1 << 64) - 1


class _RawBlock:
    """One raw block of a pool, freed when CuPy lets go of it (the owner of its memory)."""

    def __init__(self, capsule: object, offset: int, nbytes: int) -> None:
        self.capsule = capsule  # keeps the pool alive
        self.offset = offset
        self.nbytes = nbytes

    def __del__(self) -> None:
        clib.load().npumem_free_raw(clib.capsule_pointer(self.capsule), self.offset, self.nbytes)


def allocator(pool: Pool) -> Callable[[int], Any]:
    """A CuPy allocator function (`size -> cupy.cuda.MemoryPointer`) over `pool`.

    Raises `ArgumentTypeError` or `InvalidArgumentError` for a pool that cannot serve CuPy (see
    the module docstring). The function raises them for a size that is not an int >= 0.
    """
    if not isinstance(pool, Pool):
        raise ArgumentTypeError(f"pool must be an npumem.Pool, got {type(pool).__name__}")
    if pool.backing != "none":
        raise InvalidArgumentError(
            'npumem.cupy serves device memory: the pool must be made with backing="none", '
            "base_address= (the device address of its offset 0) and device=; this pool is "
            "host-backed, and its bytes are host memory that CuPy cannot use as device memory"
        )
    if pool.base_address == 0:
        raise InvalidArgumentError(
            "npumem.cupy needs a pool with a nonzero base_address (the device address of its "
            "offset 0): without one, CuPy would get bare offsets as pointers (offset 0 a NULL "
            "pointer)"
        )
    try:
        import cupy
    except ImportError as exc:
        raise MissingDependencyError("npumem.cupy needs CuPy: pip install cupy-cuda12x") from exc
    capsule = pool.c_pool()
    handle = clib.capsule_pointer(capsule)
    lib = clib.load()

    def malloc(size: int) -> Any:
        if isinstance(size, bool):
            raise ArgumentTypeError("size must be an int, got bool")
        try:
            asked = operator.index(size)
        except TypeError:
            raise ArgumentTypeError(f"size must be an int, got {type(size).__name__}") from None
        if not 0 <= asked <= _MAX_SIZE:
            raise InvalidArgumentError(
                f"size must be an int from 0 to {_MAX_SIZE} bytes, got {shown(asked)}"
            )
        nbytes = max(asked, 1)
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
