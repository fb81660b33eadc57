"""Raw blocks freed through the C library (``npumem_free_raw``, the route of ``npumem.cupy``):
a size other than the block's, an offset inside it, or a block with a handle is refused with
``NPUMEM_ERR_INVALID_BLOCK`` and changes nothing."""

from __future__ import annotations

import ctypes

import pytest

import npumem
from npumem import clib

KIB = 1 << 10
ERR_INVALID_BLOCK = 12


def alloc_raw(lib: ctypes.CDLL, pointer: int, size: int) -> int:
    offset, address = ctypes.c_size_t(), ctypes.c_uint64()
    assert lib.npumem_alloc_raw(pointer, size, 0, ctypes.byref(offset), ctypes.byref(address)) == 0
    return offset.value


@pytest.mark.parametrize(
    ("delta", "size", "why"),
    [
        (0, 256 * KIB, b"another size"),  # too small: the first node only
        (0, 288 * KIB, b"another size"),  # too small by one piece
        (0, 320 * KIB, b"another size"),  # too large
        (256 * KIB, 48 * KIB, b"no block of the raw API"),  # inside the block
    ],
)
def test_a_raw_free_of_another_size_is_refused(delta: int, size: int, why: bytes) -> None:
    pool = npumem.Pool(16 << 20, cores=1)
    capsule = pool.c_pool()
    pointer = clib.capsule_pointer(capsule)
    lib = clib.load()
    offset = alloc_raw(lib, pointer, 300 * KIB)
    before = pool.stats()
    assert lib.npumem_free_raw(pointer, offset + delta, size) == ERR_INVALID_BLOCK
    assert why in lib.npumem_last_error()
    after = pool.stats()
    assert (after.blocks_in_use, after.bytes_in_use) == (before.blocks_in_use, before.bytes_in_use)
    pool.check()
    assert lib.npumem_free_raw(pointer, offset, 300 * KIB) == 0
    assert lib.npumem_free_raw(pointer, offset, 300 * KIB) == ERR_INVALID_BLOCK
    assert pool.stats().blocks_in_use == 0


def test_a_block_with_a_handle_is_not_freed_raw() -> None:
    pool = npumem.Pool(16 << 20, cores=1)
    capsule = pool.c_pool()
    pointer = clib.capsule_pointer(capsule)
    lib = clib.load()
    block = pool.alloc(300 * KIB)
    assert lib.npumem_free_raw(pointer, block.offset, 300 * KIB) == ERR_INVALID_BLOCK
    assert b"with a handle" in lib.npumem_last_error()
    block.free()
    pool.check()
