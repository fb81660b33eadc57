"""One pool shared by Python and C in one process (``pool.c_pool()``), and the PyTorch and CuPy
hooks on a pool without backing at a fake base address (with stand-ins for torch and cupy: the
real ones need a GPU, see ``scripts/gpu_check_torch.py``)."""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import npumem
from npumem import clib
from test_capi import C_TESTS, compiler

BASE = 0x7F00_0000_0000


class Handle(ctypes.Structure):
    _fields_ = [
        ("pool_id", ctypes.c_uint32),
        ("slot", ctypes.c_uint32),
        ("generation", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


class Block(ctypes.Structure):
    _fields_ = [
        ("handle", Handle),
        ("offset", ctypes.c_size_t),
        ("size", ctypes.c_size_t),
        ("address", ctypes.c_uint64),
    ]


@pytest.fixture(scope="module")
def shared_c(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """tests/c/shared_pool.c built as a shared library linked against libnpumem.so."""
    library = Path(clib.get_library())
    out = tmp_path_factory.mktemp("shared") / "libshared_pool.so"
    command = [compiler("cc", "gcc", "clang"), "-std=c99", "-Wall", "-Werror", "-shared", "-fPIC"]
    command += [f"-I{clib.get_include()}", str(C_TESTS / "shared_pool.c"), str(library)]
    command += [f"-Wl,-rpath,{library.parent}", "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lib = ctypes.CDLL(str(out))
    lib.keep.argtypes = [ctypes.c_void_p]
    lib.fill_block.argtypes = [ctypes.c_size_t, ctypes.c_ubyte, ctypes.POINTER(Block)]
    lib.free_block.argtypes = [Handle]
    lib.blocks_in_use.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    return lib


def test_python_and_c_share_one_pool(shared_c: ctypes.CDLL) -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    capsule = pool.c_pool()
    assert shared_c.keep(clib.capsule_pointer(capsule)) == 0
    made = Block()
    assert shared_c.fill_block(1000, 0xAB, ctypes.byref(made)) == 0
    assert ctypes.string_at(made.address, 1000) == b"\xab" * 1000
    stats = pool.stats()
    assert stats.blocks_in_use == 1 and stats.requested_bytes_in_use == 1000
    assert [b.offset for b in pool.blocks()] == [made.offset]
    mine = pool.alloc(500)
    assert mine.address - mine.offset == made.address - made.offset, "one base address"
    count = ctypes.c_uint64()
    assert shared_c.blocks_in_use(ctypes.byref(count)) == 0 and count.value == 2
    # Python lets go of the pool: the C reference keeps it alive.
    mine.free()
    del capsule, pool, mine
    gc.collect()
    again = Block()
    assert shared_c.fill_block(64, 1, ctypes.byref(again)) == 0
    assert shared_c.free_block(again.handle) == 0
    assert shared_c.free_block(made.handle) == 0
    assert shared_c.free_block(made.handle) == 10  # NPUMEM_ERR_DOUBLE_FREE
    assert shared_c.drop() == 0


def test_each_capsule_holds_one_reference() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    lib = clib.load()
    capsules = [pool.c_pool() for _ in range(3)]
    pointers = {clib.capsule_pointer(c) for c in capsules}
    assert len(pointers) == 3
    pointer = clib.capsule_pointer(capsules[0])
    assert lib.npumem_pool_retain(pointer) == 0
    del capsules
    gc.collect()
    offset, address = ctypes.c_size_t(), ctypes.c_uint64()
    assert lib.npumem_alloc_raw(pointer, 64, 0, ctypes.byref(offset), ctypes.byref(address)) == 0
    assert pool.stats().bytes_in_use > 0
    assert lib.npumem_free_raw(pointer, offset.value, 64) == 0
    assert lib.npumem_pool_release(pointer) == 0
    with pytest.raises(npumem.InvalidArgumentError, match="capsule"):
        clib.capsule_pointer(object())


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str, str]]]:
    made: list[tuple[str, str, str]] = []

    class CUDAPluggableAllocator:
        def __init__(self, path: str, alloc: str, free: str) -> None:
            made.append((path, alloc, free))

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        memory=types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator)
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    yield made
    npumem.torch.stop_serving(0)


def test_the_torch_allocator_functions(fake_torch: list[tuple[str, str, str]]) -> None:
    import npumem.torch

    pool = npumem.Pool(64 << 20, cores=2, backing="none", base_address=BASE, device=("cuda", 0))
    npumem.torch.pluggable_allocator(pool)
    assert fake_torch == [(clib.get_library(), "npumem_torch_alloc", "npumem_torch_free")]
    lib = clib.load()
    pointers = [lib.npumem_torch_alloc(n, 0, None) for n in (1000, 4096, 3 << 20)]
    assert all(p and p % 256 == 0 and BASE <= p < BASE + (64 << 20) for p in pointers)
    assert pool.stats().requested_bytes_in_use == 1000 + 4096 + (3 << 20)
    assert lib.npumem_torch_alloc(1 << 40, 0, None) is None, "out of memory is NULL"
    assert lib.npumem_torch_alloc(64, 1, None) is None, "no pool serves device 1"
    for p, n in zip(pointers, (1000, 4096, 3 << 20), strict=True):
        lib.npumem_torch_free(p, n, 0, None)
    stats = pool.stats()
    assert stats.bytes_in_use == 0 and stats.free_count == 3
    with pytest.raises(npumem.InvalidArgumentError, match="nonzero base address"):
        npumem.torch.serve_device(npumem.Pool(1 << 20, backing="none"), 0)


def test_the_torch_hooks_check_the_device_and_the_pool_first(
    fake_torch: list[tuple[str, str, str]],
) -> None:
    # The device went through ctypes' int unchecked: 2**32 served device 0, 2**31 was said to
    # be negative, "0" raised ctypes.ArgumentError. A host pool was served as CUDA memory.
    import npumem.torch

    lib = clib.load()
    pool = npumem.Pool(4 << 20, cores=1, backing="none", base_address=BASE, device=("cuda", 0))
    other = npumem.Pool(4 << 20, cores=1, backing="none", base_address=BASE << 1)
    npumem.torch.serve_device(pool, 0)
    calls = [npumem.torch.serve_device, npumem.torch.pluggable_allocator]
    for device in (2**32, 2**31, 2**64, 64, -1, -(2**32)):
        for call in calls:
            with pytest.raises(npumem.InvalidArgumentError, match=r"from 0 to 63, got -?\d+"):
                call(other, device)
        with pytest.raises(npumem.InvalidArgumentError, match=r"from 0 to 63"):
            npumem.torch.stop_serving(device)
    for device in ("0", 0.0, True, None):
        for call in calls:
            with pytest.raises(npumem.ArgumentTypeError, match="device must be an int"):
                call(other, device)  # type: ignore[arg-type]
        with pytest.raises(npumem.ArgumentTypeError, match="device must be an int"):
            npumem.torch.stop_serving(device)  # type: ignore[arg-type]
    assert sorted(npumem.torch._serving) == [0], "nothing refused was recorded"
    pointer = lib.npumem_torch_alloc(256, 0, None)
    assert pointer and BASE <= pointer < BASE + (4 << 20), "device 0 is still served by `pool`"
    lib.npumem_torch_free(pointer, 256, 0, None)
    with pytest.raises(npumem.InvalidArgumentError, match="host-backed"):
        npumem.torch.serve_device(npumem.Pool(1 << 20, cores=1), 1)
    with pytest.raises(npumem.InvalidArgumentError, match="host-backed"):
        npumem.torch.pluggable_allocator(npumem.Pool(1 << 20, cores=1), 1)
    with pytest.raises(npumem.InvalidArgumentError, match=r"on device \('cuda', 0\).*device 2"):
        npumem.torch.serve_device(pool, 2)
    with pytest.raises(npumem.ArgumentTypeError, match=r"pool must be an npumem\.Pool"):
        npumem.torch.serve_device(object(), 1)  # type: ignore[arg-type]
    assert lib.npumem_torch_alloc(256, 1, None) is None, "no refused call served device 1"
    assert lib.npumem_torch_alloc(256, 2, None) is None
    assert fake_torch == [], "no allocator was made"
    # An object with __index__ (a NumPy integer) names a device as the int does.
    import numpy as np

    npumem.torch.serve_device(other, np.int64(5))
    assert lib.npumem_torch_alloc(256, 5, None) is not None
    npumem.torch.stop_serving(np.int64(5))
    assert sorted(npumem.torch._serving) == [0]
    assert pool.stats().blocks_in_use == 0


def test_the_torch_hooks_check_the_pool_before_they_look_for_pytorch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import npumem.torch

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails, as without PyTorch
    for call in (npumem.torch.serve_device, npumem.torch.pluggable_allocator):
        with pytest.raises(npumem.InvalidArgumentError, match="nonzero base address"):
            call(npumem.Pool(1 << 20, cores=1, backing="none"), 1)


def test_the_cupy_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    class UnownedMemory:
        def __init__(self, ptr: int, size: int, owner: object) -> None:
            self.ptr, self.size, self.owner = ptr, size, owner

    class MemoryPointer:
        def __init__(self, memory: UnownedMemory, offset: int) -> None:
            self.mem, self.ptr = memory, memory.ptr + offset

    class CupyOutOfMemory(MemoryError):
        pass

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        UnownedMemory=UnownedMemory,
        MemoryPointer=MemoryPointer,
        memory=types.SimpleNamespace(OutOfMemoryError=CupyOutOfMemory),
    )
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    import npumem.cupy

    pool = npumem.Pool(8 << 20, cores=1, backing="none", base_address=BASE, device=("cuda", 0))
    malloc = npumem.cupy.allocator(pool)
    pointers = [malloc(n) for n in (100, 5000, 1 << 20)]
    assert all(p.ptr % 256 == 0 and BASE <= p.ptr < BASE + (8 << 20) for p in pointers)
    assert pool.stats().requested_bytes_in_use == 100 + 5000 + (1 << 20)
    with pytest.raises(CupyOutOfMemory):
        malloc(7 << 20)
    # A size that ctypes' size_t would wrap (2**64 + 100 became 100), a negative one (which
    # took a 1-byte block) or one of another type is refused before the C call.
    for size in (2**64 + 100, -1, -(2**64)):
        with pytest.raises(npumem.InvalidArgumentError, match="size must be an int from 0"):
            malloc(size)
    for size in (1.5, "8", True, None):
        with pytest.raises(npumem.ArgumentTypeError, match="size must be an int"):
            malloc(size)  # type: ignore[arg-type]
    assert pool.stats().requested_bytes_in_use == 100 + 5000 + (1 << 20)
    assert malloc(0).mem.size == 1
    del pointers
    gc.collect()
    assert pool.stats().bytes_in_use == 0
    # Only a pool over device memory with a base address can serve CuPy.
    with pytest.raises(npumem.InvalidArgumentError, match="host-backed"):
        npumem.cupy.allocator(npumem.Pool(1 << 20, cores=1))
    with pytest.raises(npumem.InvalidArgumentError, match="nonzero base_address"):
        npumem.cupy.allocator(npumem.Pool(1 << 20, cores=1, backing="none"))
    with pytest.raises(npumem.ArgumentTypeError, match=r"pool must be an npumem\.Pool"):
        npumem.cupy.allocator("pool")  # type: ignore[arg-type]


def test_python_and_c_threads_share_one_pool_at_once() -> None:
    """Two Python threads and two threads in C (ctypes calls run without the GIL) allocate and
    free in one pool at the same time; the pool stays consistent and ends empty."""
    import threading

    pool = npumem.Pool(16 << 20, cores=4)
    capsule = pool.c_pool()
    pointer = clib.capsule_pointer(capsule)
    lib = ctypes.CDLL(clib.get_library())  # its own function objects, the same library
    alloc, free = lib.npumem_alloc, lib.npumem_free
    alloc.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_uint32,
        ctypes.POINTER(Block),
    ]
    free.argtypes = [ctypes.c_void_p, Handle]
    errors: list[str] = []

    def in_c(seed: int) -> None:
        block = Block()
        for i in range(3000):
            size = 64 + (i * 7919 + seed) % 20000
            if alloc(pointer, size, 0, 0, ctypes.byref(block)) != 0:
                errors.append(f"C alloc of {size}")
                return
            ctypes.memset(block.address, seed, size)
            if ctypes.string_at(block.address, size) != bytes([seed]) * size:
                errors.append("C block overwritten")
            if free(pointer, block.handle) != 0:
                errors.append("C free")

    def in_python(seed: int) -> None:
        for i in range(3000):
            size = 64 + (i * 104729 + seed) % 20000
            with pool.alloc(size) as blk:
                memoryview(blk)[:] = bytes([seed]) * size
                if bytes(memoryview(blk)) != bytes([seed]) * size:
                    errors.append("Python block overwritten")

    threads = [threading.Thread(target=in_c, args=(s,)) for s in (1, 2)]
    threads += [threading.Thread(target=in_python, args=(s,)) for s in (3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    pool.check()
    stats = pool.stats()
    assert stats.bytes_in_use == 0 and stats.alloc_count == 12000 == stats.free_count


def handle_api() -> ctypes.CDLL:
    """The library with the signatures of the handle API's functions (its own function
    objects: `clib.load()`'s are shared)."""
    lib = ctypes.CDLL(clib.get_library())
    pool = ctypes.c_void_p
    lib.npumem_alloc.argtypes = [
        pool,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_uint32,
        ctypes.POINTER(Block),
    ]
    lib.npumem_free.argtypes = [pool, Handle]
    lib.npumem_block_info.argtypes = [pool, Handle, ctypes.POINTER(Block)]
    lib.npumem_last_error.restype = ctypes.c_char_p
    return lib


def tag_rows(pool: npumem.Pool) -> dict[str | None, tuple[int, int]]:
    return {t.tag: (t.blocks_in_use, t.requested_bytes_in_use) for t in pool.stats().by_tag}


def test_a_c_block_stays_untagged_when_its_tag_number_becomes_a_python_tag() -> None:
    """A C block allocated with a tag number that is no tag id yet counts as untagged; when
    Python then interns a tag that gets that id, the block stays untagged, and its free comes
    off the untagged row, never off the tag's."""
    lib = handle_api()
    pool = npumem.Pool(8 << 20, cores=1)
    capsule = pool.c_pool()
    pointer = clib.capsule_pointer(capsule)
    kept, early = Block(), Block()
    assert lib.npumem_alloc(pointer, 100, 0, 0, ctypes.byref(kept)) == 0
    assert lib.npumem_alloc(pointer, 512, 0, 1, ctypes.byref(early)) == 0
    weights = pool.alloc(64, tag="weights")
    assert weights.tag == "weights"
    assert tag_rows(pool) == {None: (2, 612), "weights": (1, 64)}
    assert {b.offset: b.tag for b in pool.blocks()} == {
        kept.offset: None,
        early.offset: None,
        weights.offset: "weights",
    }
    assert lib.npumem_free(pointer, early.handle) == 0
    assert tag_rows(pool) == {None: (1, 100), "weights": (1, 64)}
    weights.free()
    assert tag_rows(pool) == {None: (1, 100), "weights": (0, 0)}
    assert lib.npumem_free(pointer, kept.handle) == 0
    assert pool.check() == 0


def test_a_block_that_c_pins_stays_in_place_through_a_compaction() -> None:
    """C code pins a block for as long as it uses its address: a full compaction moves the
    blocks around it but not that one, and Python's view of the pool counts the pin."""
    lib = handle_api()
    lib.npumem_pin.argtypes = [ctypes.c_void_p, Handle, ctypes.POINTER(Block)]
    lib.npumem_unpin.argtypes = [ctypes.c_void_p, Handle]
    pool = npumem.Pool(64 << 20, cores=1)
    capsule = pool.c_pool()
    pointer = clib.capsule_pointer(capsule)
    blocks = [Block() for _ in range(200)]
    for b in blocks:
        assert lib.npumem_alloc(pointer, 50_000, 0, 0, ctypes.byref(b)) == 0
    for b in blocks[::2]:
        assert lib.npumem_free(pointer, b.handle) == 0
    live = blocks[1::2]
    pinned = live[-1]
    where = Block()
    assert lib.npumem_pin(pointer, pinned.handle, ctypes.byref(where)) == 0
    assert (where.offset, where.address) == (pinned.offset, pinned.address)
    ctypes.memset(where.address, 7, 50_000)
    assert [b.pins for b in pool.blocks() if b.offset == pinned.offset] == [1]
    with pool.pause(5.0) as pause:
        pool.compact_step(pause, "full")
    now = Block()
    moved = 0
    for b in live:
        assert lib.npumem_block_info(pointer, b.handle, ctypes.byref(now)) == 0
        moved += now.offset != b.offset
    assert moved > 0, "the compaction moved the unpinned blocks"
    assert lib.npumem_block_info(pointer, pinned.handle, ctypes.byref(now)) == 0
    assert now.offset == pinned.offset
    assert ctypes.string_at(where.address, 50_000) == b"\x07" * 50_000
    assert lib.npumem_free(pointer, pinned.handle) == 11  # NPUMEM_ERR_PINNED
    assert lib.npumem_unpin(pointer, pinned.handle) == 0
    assert lib.npumem_unpin(pointer, pinned.handle) == 20  # NPUMEM_ERR_NOT_PINNED
    assert b"holds no pin" in lib.npumem_last_error()
    for b in live:
        assert lib.npumem_free(pointer, b.handle) == 0
    assert pool.check() == 0
    assert pool.stats().blocks_in_use == 0
