"""DLPack and device addresses: ``Block.__dlpack__`` / ``__dlpack_device__``, ``np.from_dlpack``
round trips that share the block's bytes and hold a pin while the array lives, ``as_array``,
device pools with a base address, and the mover's addresses."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
from collections.abc import Sequence

import numpy as np
import pytest

import npumem
from npumem.compaction import HostMirror

KDL_CPU, KDL_CUDA = 1, 2
BASE = 0x7F00_0000_0000


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))),
]


def consume(capsule: object) -> DLManagedTensor:
    """Take the tensor out of a capsule as a consumer does: read it, rename the capsule."""
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = api.PyCapsule_GetPointer(capsule, b"dltensor")
    assert address
    assert api.PyCapsule_SetName(capsule, b"used_dltensor") == 0
    return DLManagedTensor.from_address(address)


def test_from_dlpack_shares_the_bytes_and_pins_the_block() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    blk = pool.alloc(1000)
    array = np.from_dlpack(blk)
    assert array.dtype == np.uint8 and array.shape == (1000,)
    assert array.flags.writeable
    assert array.ctypes.data == blk.address
    array[:] = 7
    assert bytes(memoryview(blk)) == b"\x07" * 1000
    memoryview(blk)[:3] = b"abc"
    assert bytes(array[:3]) == b"abc"
    assert blk.pins == 1
    with pytest.raises(npumem.PinnedBlockError):
        blk.free()
    view = array[10:20]
    del array
    assert blk.pins == 1, "a view of the array keeps the export alive"
    del view
    assert blk.pins == 0
    blk.free()
    assert pool.stats().bytes_in_use == 0


def test_dlpack_device_and_protocol_arguments() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    blk = pool.alloc(64)
    assert blk.__dlpack_device__() == (KDL_CPU, 0)
    # What a copy would take: a typed error, and the BufferError the array API asks for.
    for request, said in (({"copy": True}, "copy"), ({"dl_device": (KDL_CUDA, 0)}, "device")):
        with pytest.raises(npumem.ExportError, match=said) as raised:
            blk.__dlpack__(**request)
        assert isinstance(raised.value, npumem.NpumemError)
        assert isinstance(raised.value, BufferError)
    assert pool.check() == 1
    with pytest.raises(npumem.InvalidArgumentError, match="stream"):
        blk.__dlpack__(stream=5)
    # copy is a bool: a truth value of something else is refused, not guessed.
    for copy in ("x", 0, 1.0):
        with pytest.raises(npumem.ArgumentTypeError, match="copy must be None, True or False"):
            blk.__dlpack__(copy=copy)
    for version in ((1,), "1.0", (1.0, 0), (True, 0), [1, 0]):
        with pytest.raises(npumem.ArgumentTypeError, match=r"pair of ints >= 0, got"):
            blk.__dlpack__(max_version=version)
    # A negative version is a bad value, not a bad type.
    for version in ((-1, -1), (-1, 0), (1, -1), (-(2**200), 0)):
        with pytest.raises(npumem.InvalidArgumentError, match=r"pair of ints >= 0, got \(") as info:
            blk.__dlpack__(max_version=version)
        assert not isinstance(info.value, npumem.ArgumentTypeError)
    # dl_device is refused for what is wrong with it.
    with pytest.raises(npumem.ArgumentTypeError, match=r"dl_device\[0\], is str 'cpu'"):
        blk.__dlpack__(dl_device=("cpu", 0))
    with pytest.raises(npumem.ArgumentTypeError, match=r"dl_device\[1\], is float"):
        blk.__dlpack__(dl_device=(KDL_CPU, 0.0))
    for device in ([KDL_CPU, 0], (KDL_CPU,), KDL_CPU):
        with pytest.raises(npumem.ArgumentTypeError, match=r"\(device type, index\) pair of ints"):
            blk.__dlpack__(dl_device=device)
    for device, at in (((2**40, 0), 0), ((KDL_CPU, -(2**31) - 1), 1), ((2**200, 0), 0)):
        with pytest.raises(
            npumem.InvalidArgumentError, match=rf"dl_device\[{at}\] = .* 32-bit ints"
        ):
            blk.__dlpack__(dl_device=device)
    assert blk.pins == 0, "refused exports pin nothing"
    # A consumer may know versions far beyond DLPack 1.0: it gets the versioned capsule.
    for version in ((2**40, 0), (1, 2**70), (2**200, 0)):
        assert "dltensor_versioned" in repr(blk.__dlpack__(max_version=version))
    assert "used_dltensor" not in repr(blk.__dlpack__(max_version=(0, 2**40)))
    assert blk.pins == 0
    legacy = blk.__dlpack__()
    versioned = blk.__dlpack__(max_version=(1, 0), dl_device=(KDL_CPU, 0), copy=False)
    assert "dltensor" in repr(legacy) and "dltensor_versioned" in repr(versioned)
    assert blk.pins == 2
    del legacy, versioned
    assert blk.pins == 0, "an unconsumed capsule unpins when it goes"
    blk.free()
    with pytest.raises(npumem.InvalidHandleError):
        blk.__dlpack__()


def test_a_consumer_takes_the_tensor_and_its_deleter_unpins() -> None:
    pool = npumem.Pool(1 << 20, cores=1, backing="none", base_address=BASE, device=("cuda", 3))
    blk = pool.alloc(5000)
    assert blk.address == BASE + blk.offset
    assert blk.__dlpack_device__() == (KDL_CUDA, 3)
    capsule = blk.__dlpack__(stream=1)
    managed = consume(capsule)
    tensor = managed.dl_tensor
    assert tensor.data == BASE + blk.offset
    assert (tensor.device.device_type, tensor.device.device_id) == (KDL_CUDA, 3)
    assert tensor.ndim == 1 and tensor.shape[0] == 5000 and not tensor.strides
    assert (tensor.code, tensor.bits, tensor.lanes) == (1, 8, 1)
    del capsule
    assert blk.pins == 1, "a consumed capsule leaves the pin to its consumer"
    managed.deleter(ctypes.pointer(managed))
    assert blk.pins == 0
    blk.free()


def test_numpy_refuses_device_memory_and_no_pin_is_left() -> None:
    pool = npumem.Pool(1 << 20, cores=1, backing="none", base_address=BASE, device=("cuda", 0))
    blk = pool.alloc(256)
    with pytest.raises((BufferError, RuntimeError, ValueError)):
        np.from_dlpack(blk)
    assert blk.pins == 0
    with pytest.raises(npumem.NoBackingError):
        blk.as_array()
    # A freed block is reported as freed, not as a block without host memory.
    blk.free()
    with pytest.raises(npumem.InvalidHandleError, match="the block was freed"):
        blk.as_array()
    with pytest.raises(npumem.InvalidHandleError, match="the block was freed"):
        memoryview(blk)


def test_as_array_leaves_no_object_behind() -> None:
    # A view's slice of the exported bytes is built from ints; none may outlive the call (a
    # size above 256 is an int that CPython does not cache).
    pool = npumem.Pool(1 << 20, cores=1)
    blk = pool.alloc(4096)
    for _ in range(100):
        blk.as_array()
    before = sys.getallocatedblocks()
    for _ in range(10_000):
        blk.as_array()
    assert sys.getallocatedblocks() - before < 1_000
    assert blk.pins == 0


def test_as_array_is_a_typed_view() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    blk = pool.alloc(1000)
    floats = blk.as_array(np.float32, (10, 25))
    assert floats.shape == (10, 25) and floats.dtype == np.float32
    floats[:] = 1.5
    assert np.frombuffer(memoryview(blk), np.float32).tolist() == [1.5] * 250
    kept = [blk.as_array(), blk.as_array("int64"), blk.as_array(np.int16, 3)]
    assert [a.shape for a in kept] == [(1000,), (125,), (3,)]
    assert kept[0][:4].tolist() == [0, 0, 192, 63], "the same bytes (1.5 as float32)"
    assert blk.pins == 4
    with pytest.raises(npumem.InvalidArgumentError, match="1000"):
        blk.as_array(np.float64, (200,))
    with pytest.raises(npumem.InvalidArgumentError):
        blk.as_array("S3")  # 1000 bytes is not a whole number of 3-byte items
    with pytest.raises(npumem.ArgumentTypeError, match="dtype must be a NumPy dtype, got str"):
        blk.as_array("not a dtype")
    with pytest.raises(npumem.ArgumentTypeError, match="dtype must be a NumPy dtype"):
        blk.as_array(3.5)
    for objects in (object, "O", [("a", "i4"), ("b", "O")]):
        with pytest.raises(npumem.InvalidArgumentError, match="holds Python objects"):
            blk.as_array(objects)
    # A byte size beyond 64 bits is said to overflow, not given as a clamped count.
    for dtype, shape in [(np.float32, (1 << 62, 4)), (np.uint8, (1 << 40, 1 << 40))]:
        with pytest.raises(npumem.InvalidArgumentError, match="overflows 64 bits") as info:
            blk.as_array(dtype, shape)
        assert str(2**64 - 1) not in str(info.value)
    assert blk.as_array(np.float32, (1 << 40, 0)).shape == (1 << 40, 0)
    # What NumPy would refuse with its own ValueError is a typed error, said plainly.
    for dtype in ("V0", "S0", "U0", np.dtype([])):
        for shape in (None, 0, (5,)):
            with pytest.raises(npumem.InvalidArgumentError, match="items of 0 bytes"):
                blk.as_array(dtype, shape)
    for shape in ((0, 2**70), (0, 2**63), 2**64):
        with pytest.raises(
            npumem.InvalidArgumentError, match=r"at most 9223372036854775807"
        ) as info:
            blk.as_array(np.uint8, shape)
        assert ">= 0" not in str(info.value)
    with pytest.raises(npumem.InvalidArgumentError, match="NumPy's largest size"):
        blk.as_array(np.uint8, (0, 2**62, 4))
    with pytest.raises(npumem.InvalidArgumentError, match=r"NumPy makes no array .* 64"):
        blk.as_array(np.uint8, (0,) * 65)
    with pytest.raises(npumem.InvalidArgumentError, match=">= 0, got -1"):
        blk.as_array(np.uint8, (0, -1))
    assert blk.as_array(np.uint8, (0, 2**63 - 1)).shape == (0, 2**63 - 1)
    assert blk.pins == 4, "refused views pin nothing"
    del floats, kept
    assert blk.pins == 0


# Every path that exports or views a block's bytes, for a child process to try on a pool (a
# regression that hands a consumer a bad pointer crashes the child, not the test run).
EXPORTS = """
import numpy as np, npumem
def exports(blk, device):
    yield "np.from_dlpack", lambda: np.from_dlpack(blk)
    yield "__dlpack__", lambda: blk.__dlpack__()
    yield "__dlpack__ versioned", lambda: blk.__dlpack__(max_version=(1, 0))
    yield "__dlpack__ on its device", lambda: blk.__dlpack__(dl_device=device, copy=False)
    yield "memoryview", lambda: memoryview(blk)
    yield "as_array", lambda: blk.as_array()
    yield "as_array typed", lambda: blk.as_array(np.float32, (4,))
"""


def _run_child(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", EXPORTS + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"child died ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("device", [None, "cpu", "cuda_host", "cuda_managed", "rocm_host", "cuda"])
def test_a_pool_without_a_base_address_exports_nothing(device: str | None) -> None:
    # A backing="none" pool has offsets only when no base_address is given: a DLPack export
    # handed consumers the offset as a pointer (NULL at offset 0, so NumPy read a private
    # buffer; elsewhere NumPy read a tiny address and the process died).
    out = _run_child(
        f"""
        device = {device!r}
        config = {{}} if device is None else {{"device": (device, 0)}}
        pool = npumem.Pool(16 << 20, cores=1, backing="none", **config)
        blocks = [pool.alloc(4096) for _ in range(3)]
        assert sorted(b.offset for b in blocks)[0] == 0
        for blk in blocks:
            for name, export in exports(blk, blk.__dlpack_device__()):
                try:
                    export()
                except npumem.NoBackingError as exc:
                    if name.startswith(("np.", "__dlpack__")):
                        assert "no base_address" in str(exc), (name, str(exc))
                else:
                    raise AssertionError(f"{{name}} exported a block at offset {{blk.offset}}")
            assert blk.pins == 0, "a refused export pins nothing"
        blocks[0].free()
        try:
            blocks[0].__dlpack__()
        except npumem.InvalidHandleError as exc:
            assert "freed" in str(exc)
        pool.check()
        print("refused", pool.stats().blocks_in_use)
        """
    )
    assert out.split() == ["refused", "2"]


def test_a_pool_over_declared_host_memory_exports_it() -> None:
    # With a base_address, the pool's bytes are the memory the user declared: on a device the
    # host reads, NumPy's view of a block is that memory.
    out = _run_child(
        """
        arena = np.zeros(1 << 20, np.uint8)
        base = arena.ctypes.data
        pool = npumem.Pool(1 << 20, cores=1, backing="none", base_address=base, device=("cpu", 0))
        first, second = pool.alloc(1000), pool.alloc(1000)
        for blk, value in ((first, 5), (second, 7)):
            view = np.from_dlpack(blk)
            assert view.ctypes.data == base + blk.offset == blk.address
            view[:] = value
            assert blk.pins == 1
            del view
            assert blk.pins == 0
            assert (arena[blk.offset : blk.offset + 1000] == value).all()
        assert int(arena.sum()) == 12 * 1000
        for name in ("memoryview", "as_array"):
            try:
                dict(exports(first, (1, 0)))[name]()
            except npumem.NoBackingError:
                pass
            else:
                raise AssertionError(name + " made a view of a pool without host backing")
        pool.check()
        print("ok")
        """
    )
    assert out.split() == ["ok"]


def test_device_configuration_rules() -> None:
    with pytest.raises(npumem.ConfigError, match="base_address"):
        npumem.Pool(1 << 20, base_address=4096)
    with pytest.raises(npumem.ConfigError, match="device"):
        npumem.Pool(1 << 20, device=("cuda", 0))  # host memory is the CPU's
    with pytest.raises(npumem.ConfigError, match="device"):
        npumem.Pool(1 << 20, backing="none", device=("tpu", 0))
    with pytest.raises(npumem.ConfigError, match="device"):
        npumem.Pool(1 << 20, backing="none", device=("cuda", -1))
    with pytest.raises(npumem.ConfigError, match="base_address"):
        npumem.Pool(1 << 20, backing="none", base_address=(1 << 64) - 4096)
    with pytest.raises((npumem.ConfigError, npumem.ArgumentTypeError)):
        npumem.Pool(1 << 20, backing="none", device="cuda")
    pool = npumem.Pool(1 << 20, backing="none", device=("rocm", 1), base_address=1 << 40)
    assert pool.device == ("rocm", 1) and pool.base_address == 1 << 40
    assert npumem.Pool(1 << 20, backing="none").device == ("ext_dev", 0)
    host = npumem.Pool(1 << 20)
    assert host.device == ("cpu", 0) and host.base_address != 0


def test_the_mover_gets_addresses() -> None:
    pool = npumem.Pool(8 << 20, cores=1, backing="none", base_address=BASE)
    mirror = HostMirror(pool.capacity)
    seen: list[tuple[int, int, int, int, int]] = []

    def mover(transfers: Sequence[npumem.compaction.Transfer]) -> None:
        for t in transfers:
            src, dst, n = t
            seen.append((src, dst, n, t.src_address, t.dst_address))
        mirror(transfers)

    blocks = [pool.alloc(64 << 10) for _ in range(8)]
    hole = blocks[0].offset
    for blk in blocks[::2]:
        blk.free()
    with pool.pause() as pause:
        pool.move_blocks(pause, [(blocks[-1], hole)], mover=mover)
    assert blocks[-1].offset == hole and blocks[-1].address == BASE + hole
    assert seen, "the block moved"
    for src, dst, _n, src_address, dst_address in seen:
        assert (src_address, dst_address) == (BASE + src, BASE + dst)
