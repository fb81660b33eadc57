"""PyTorch on an npumem pool: `torch.cuda` tensors served from a region the runtime reserved.

::

    region = ...  # device memory reserved once (cudaMalloc, cuMemAlloc, a framework's arena)
    pool = npumem.Pool(size, backing="none", base_address=region, device=("cuda", 0))
    allocator = npumem.torch.pluggable_allocator(pool)
    torch.cuda.memory.change_current_allocator(allocator)  # before the first CUDA allocation

The allocator functions live in the C library (`npumem_torch_alloc` / `npumem_torch_free`
in `npumem.h`): nothing is compiled at run time. Blocks are raw blocks (they never move),
256-byte aligned; the pool must outlive every tensor it served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from npumem import clib
from npumem.errors import MissingDependencyError

if TYPE_CHECKING:
    from npumem._core import Pool

ALLOC_FUNCTION = "npumem_torch_alloc"
FREE_FUNCTION = "npumem_torch_free"

# The capsules of the pools serving each device, kept alive while they serve it.
_serving: dict[int, object] = {}


def serve_device(pool: Pool, device: int = 0) -> str:
    """Have the C library's PyTorch functions serve `device` from `pool`.

    Returns the library's path. Needs no PyTorch; `pluggable_allocator()` calls it.
    """
    capsule = pool.c_pool()
    lib = clib.load()
    clib.check(lib.npumem_torch_set_pool(device, clib.capsule_pointer(capsule)))
    _serving[device] = capsule
    return clib.get_library()


def stop_serving(device: int = 0) -> None:
    """Stop serving `device` (only after every tensor it served was freed)."""
    clib.check(clib.load().npumem_torch_set_pool(device, None))
    _serving.pop(device, None)


def pluggable_allocator(pool: Pool, device: int = 0) -> Any:
    """A `torch.cuda.memory.CUDAPluggableAllocator` that allocates from `pool`.

    Install it with `torch.cuda.memory.change_current_allocator` before PyTorch allocates on
    the device. Needs a CUDA build of PyTorch.
    """
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError("npumem.torch needs PyTorch: pip install torch") from exc
    path = serve_device(pool, device)
    return torch.cuda.memory.CUDAPluggableAllocator(path, ALLOC_FUNCTION, FREE_FUNCTION)
