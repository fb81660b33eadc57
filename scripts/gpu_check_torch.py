"""The real check of npumem under PyTorch, on a machine with a CUDA GPU (one run, about a minute).

    python scripts/gpu_check_torch.py [--out result.json]

1. Reserves one region of device memory with the CUDA driver API (``libcuda.so.1``, present
   wherever the driver is), before PyTorch initializes CUDA.
2. Makes ``npumem.Pool(size, backing="none", base_address=region, device=("cuda", 0))`` and
   installs ``npumem.torch.pluggable_allocator(pool)`` as PyTorch's CUDA allocator.
3. Makes tensors, does arithmetic on them, checks the results against the CPU and that every
   tensor lies in the region, frees them and checks the pool's statistics.
4. Exports a pool block through DLPack (``torch.from_dlpack(block)``): same address, the block
   pinned while the tensor lives, unpinned after.
5. Times ``torch.empty`` + free through the pool.

Prints one line per check and a JSON summary (also written to ``--out``); exits 1 if a check
failed, 2 if there is no CUDA GPU or no CUDA build of PyTorch.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from typing import Any

REGION = 1 << 30  # 1 GiB


class Driver:
    """The few CUDA driver calls needed to reserve and release one region."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.context = ctypes.c_void_p()

    def call(self, name: str, *args: Any) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise RuntimeError(f"{name} failed with CUresult {status}")

    def reserve(self, nbytes: int) -> int:
        device = ctypes.c_int()
        self.call("cuInit", 0)
        self.call("cuDeviceGet", ctypes.byref(device), 0)
        # PyTorch runs on the device's primary context: memory of that context is its memory.
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), device)
        self.call("cuCtxSetCurrent", self.context)
        pointer = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(nbytes))
        return pointer.value

    def release(self, pointer: int) -> None:
        self.call("cuMemFree_v2", ctypes.c_uint64(pointer))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON summary here")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("no PyTorch: pip install torch (a CUDA build)")
        return 2
    if not torch.cuda.is_available():
        print(f"no CUDA GPU visible to PyTorch {torch.__version__}")
        return 2

    import npumem
    import npumem.torch

    results: dict[str, Any] = {"torch": torch.__version__, "device": None, "checks": {}}
    failed: list[str] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        results["checks"][name] = ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
        if not ok:
            failed.append(name)

    driver = Driver()
    base = driver.reserve(REGION)
    print(f"reserved {REGION >> 20} MiB of device memory at {base:#x}")
    pool = npumem.Pool(REGION, backing="none", base_address=base, device=("cuda", 0), cores=4)
    torch.cuda.memory.change_current_allocator(npumem.torch.pluggable_allocator(pool))
    results["device"] = torch.cuda.get_device_name(0)

    # Tensors from the pool, arithmetic on them.
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    c = a @ b + 1.0
    d = (c * 2).sum(dim=0)
    torch.cuda.synchronize()
    expected = (a.cpu() @ b.cpu() + 1.0) * 2
    check("matmul result", torch.allclose(d.cpu(), expected.sum(dim=0), rtol=1e-3, atol=1e-2))
    inside = all(base <= t.data_ptr() < base + REGION for t in (a, b, c, d))
    check("tensors lie in the region", inside, ", ".join(hex(t.data_ptr()) for t in (a, b, c, d)))
    in_use = pool.stats().bytes_in_use
    check("the pool counts the tensors", in_use >= 3 * 4 * 1024 * 1024, f"{in_use} bytes in use")
    del a, b, c, d, expected
    torch.cuda.synchronize()
    # cuBLAS keeps a workspace from the allocator for later matmuls: give it back first.
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    stats = pool.stats()
    check("freed tensors go back", stats.bytes_in_use == 0, f"{stats.bytes_in_use} bytes in use")
    results["allocs"] = stats.alloc_count

    # DLPack: a pool block as a tensor, pinned while the tensor lives.
    block = pool.alloc(1 << 20)
    tensor = torch.from_dlpack(block)
    check("from_dlpack: device", tensor.device == torch.device("cuda", 0), str(tensor.device))
    check("from_dlpack: address", tensor.data_ptr() == block.address, f"{tensor.data_ptr():#x}")
    tensor.fill_(7)
    torch.cuda.synchronize()
    check("from_dlpack: data", int(tensor.sum().item()) == 7 * (1 << 20))
    check("from_dlpack: pinned", block.pins == 1, f"{block.pins} pins")
    del tensor
    check("from_dlpack: unpinned after", block.pins == 0, f"{block.pins} pins")
    block.free()

    # Cost of a tensor made and freed through the pool.
    n = 20000
    for _ in range(1000):
        torch.empty(4096, device="cuda")
    start = time.perf_counter()
    for _ in range(n):
        torch.empty(4096, device="cuda")
    per = (time.perf_counter() - start) / n * 1e6
    results["torch_empty_free_us"] = round(per, 3)
    print(f"torch.empty(4096) + free through npumem: {per:.2f} us")
    check("pool empty at the end", pool.stats().bytes_in_use == 0)

    npumem.torch.stop_serving(0)
    driver.release(base)
    results["failed"] = failed
    print(json.dumps(results, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
