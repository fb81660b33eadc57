"""PyTorch on an npumem pool: `torch.cuda` tensors served from a region the runtime reserved.

::

    region = ...  # device memory reserved once (cudaMalloc, cuMemAlloc, a framework's arena)
    pool = npumem.Pool(size, backing="none", base_address=region, device=("cuda", 0))
    allocator = npumem.torch.pluggable_allocator(pool)
    torch.cuda.memory.change_current_allocator(allocator)  # before the first CUDA allocation

The allocator functions live in the C library (`npumem_torch_alloc` / `npumem_torch_free`
in `npumem.h`): nothing is compiled at run time. Blocks are raw blocks (they never move),
256-byte aligned; the pool must outlive every tensor it served.

The pool must be a `backing="none"` pool with a nonzero `base_address` (the device address of
its offset 0): a host-backed pool's bytes are this process's host memory, which CUDA kernels
cannot use as device memory, and without a base address the tensors' pointers would be bare
offsets (offset 0 a NULL pointer). A pool declared on a `cuda` or `rocm` device serves only that
device's index. `device` is a CUDA device index from 0 to `MAX_DEVICES - 1`.
"""

from __future__ import annotations

import operator
from typing import Any

from npumem import clib
from npumem._core import Pool
from npumem._shown import shown
from npumem.errors import ArgumentTypeError, InvalidArgumentError, MissingDependencyError

ALLOC_FUNCTION = "npumem_torch_alloc"
FREE_FUNCTION = "npumem_torch_free"

MAX_DEVICES = 64
"""Devices the C library serves: indices 0 to `MAX_DEVICES - 1` (`npumem_torch_set_pool`)."""

# Device types whose index names one GPU: a pool declared on one of them serves that GPU only.
_ONE_GPU_TYPES = ("cuda", "rocm")

# The capsules of the pools serving each device, kept alive while they serve it.
_serving: dict[int, object] = {}


def _device(device: object) -> int:
    """`device` checked: an int (or an object with `__index__`, not a bool) from 0 to
    `MAX_DEVICES - 1`, as the C library's `int` takes it without wrapping."""
    if isinstance(device, bool):
        raise ArgumentTypeError("device must be an int (a CUDA device index), got bool")
    try:
        index = operator.index(device)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentTypeError(
            f"device must be an int (a CUDA device index), got {type(device).__name__}"
        ) from None
    if not 0 <= index < MAX_DEVICES:
        raise InvalidArgumentError(
            f"device must be a CUDA device index from 0 to {MAX_DEVICES - 1}, got {shown(index)}"
        )
    return index


def _check_pool(pool: object, device: int) -> Pool:
    """`pool` checked as one that can serve CUDA device `device` (see the module docstring)."""
    if not isinstance(pool, Pool):
        raise ArgumentTypeError(f"pool must be an npumem.Pool, got {type(pool).__name__}")
    if pool.backing != "none":
        raise InvalidArgumentError(
            'npumem.torch serves device memory: the pool must be made with backing="none", '
            "base_address= (the device address of its offset 0) and device=; this pool is "
            "host-backed, and its bytes are host memory that CUDA kernels cannot use"
        )
    if pool.base_address == 0:
        raise InvalidArgumentError(
            "a pool serving PyTorch needs a nonzero base address (base_address=, the device "
            "address of its offset 0): without one, offset 0 would be a NULL pointer"
        )
    kind, index = pool.device
    if kind in _ONE_GPU_TYPES and index != device:
        raise InvalidArgumentError(
            f"the pool's memory is on device {(kind, index)!r}: it cannot serve CUDA device "
            f"{device} (tensors of that device would get another device's memory)"
        )
    return pool


def serve_device(pool: Pool, device: int = 0) -> str:
    """Have the C library's PyTorch functions serve `device` from `pool`.

    Returns the library's path. Needs no PyTorch; `pluggable_allocator()` calls it. Raises
    `ArgumentTypeError` or `InvalidArgumentError` for a `device` that is not an index from 0
    to `MAX_DEVICES - 1` and for a pool that cannot serve it (see the module docstring); then
    nothing changes.
    """
    device = _device(device)
    capsule = _check_pool(pool, device).c_pool()
    lib = clib.load()
    clib.check(lib.npumem_torch_set_pool(device, clib.capsule_pointer(capsule)))
    _serving[device] = capsule
    return clib.get_library()


def stop_serving(device: int = 0) -> None:
    """Stop serving `device` (only after every tensor it served was freed)."""
    device = _device(device)
    clib.check(clib.load().npumem_torch_set_pool(device, None))
    _serving.pop(device, None)


def pluggable_allocator(pool: Pool, device: int = 0) -> Any:
    """A `torch.cuda.memory.CUDAPluggableAllocator` that allocates from `pool`.

    Install it with `torch.cuda.memory.change_current_allocator` before PyTorch allocates on
    the device. Needs a CUDA build of PyTorch. The pool and `device` are checked first, as
    `serve_device` checks them.
    """
    device = _device(device)
    _check_pool(pool, device)
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError("npumem.torch needs PyTorch: pip install torch") from exc
    path = serve_device(pool, device)
    return torch.cuda.memory.CUDAPluggableAllocator(path, ALLOC_FUNCTION, FREE_FUNCTION)
