"""The C library and header shipped in the package, as `numpy.get_include()` does for NumPy.

Compile and link a C or C++ program against npumem:

    cc prog.c -I"$(python -c 'import npumem; print(npumem.get_include())')" \\
       "$(python -c 'import npumem; print(npumem.get_library())')" -Wl,-rpath,<its folder>

`load()` opens the same library in this process with `ctypes`; a pool made in Python
(`pool.c_pool()`) works with its functions, which run the Python extension's own code for it.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path

from npumem import errors

_PACKAGE = Path(__file__).resolve().parent
_LIBRARY_NAMES = {"darwin": "libnpumem.dylib", "win32": "npumem.dll"}
CAPSULE_NAME = b"npumem.pool"


def get_include() -> str:
    """The folder that holds `npumem.h`."""
    return str(_PACKAGE / "include")


def get_library() -> str:
    """The path of the C library (`libnpumem.so` on Linux).

    Raises FileNotFoundError when the package was built without it (a build that skipped the
    `c-library` feature).
    """
    path = _PACKAGE / _LIBRARY_NAMES.get(sys.platform, "libnpumem.so")
    if not path.is_file():
        raise FileNotFoundError(
            f"the npumem C library is not installed at {path}; build the package with "
            "`pip install .` or `make develop` (the c-library feature)"
        )
    return str(path)


@functools.cache
def load() -> ctypes.CDLL:
    """The C library, opened with `ctypes` (once), with the signatures used from Python."""
    lib = ctypes.CDLL(get_library())
    pool = ctypes.c_void_p
    lib.npumem_strerror.restype = ctypes.c_char_p
    lib.npumem_strerror.argtypes = [ctypes.c_int]
    lib.npumem_last_error.restype = ctypes.c_char_p
    lib.npumem_last_error.argtypes = []
    lib.npumem_pool_retain.argtypes = [pool]
    lib.npumem_pool_release.argtypes = [pool]
    lib.npumem_alloc_raw.argtypes = [
        pool,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_uint64),
    ]
    lib.npumem_free_raw.argtypes = [pool, ctypes.c_size_t, ctypes.c_size_t]
    lib.npumem_torch_set_pool.argtypes = [ctypes.c_int, pool]
    lib.npumem_torch_alloc.restype = ctypes.c_void_p
    lib.npumem_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.npumem_torch_free.restype = None
    lib.npumem_torch_free.argtypes = [
        ctypes.c_void_p,
        ctypes.c_ssize_t,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    return lib


def capsule_pointer(capsule: object) -> int:
    """The `npumem_pool*` in a capsule of `pool.c_pool()` (valid while the capsule lives)."""
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    try:
        address = get_pointer(capsule, CAPSULE_NAME)
    except ValueError:
        address = None
    if not address:
        raise errors.InvalidArgumentError(
            f"expected a capsule of pool.c_pool() (named {CAPSULE_NAME.decode()}), "
            f"got {type(capsule).__name__}"
        )
    return int(address)


# The exception of each status code of npumem.h (0 is success).
_ERRORS: dict[int, type[errors.NpumemError]] = {
    1: errors.InvalidArgumentError,  # NULL argument
    2: errors.InvalidArgumentError,  # not a live pool
    3: errors.ConfigError,
    4: errors.InvalidArgumentError,  # invalid size
    5: errors.RequestTooLargeError,
    6: errors.InvalidArgumentError,  # invalid alignment
    7: errors.OutOfMemoryError,
    8: errors.InvalidHandleError,
    9: errors.InvalidHandleError,  # foreign handle
    10: errors.DoubleFreeError,
    11: errors.PinnedBlockError,
    12: errors.InvalidArgumentError,  # raw free of a block that is not there
    13: errors.NoBackingError,
    15: errors.PoolBusyError,
    16: errors.CorruptionError,
}


def check(status: int) -> None:
    """Raise the npumem exception of a failed C call, with the library's message."""
    if status != 0:
        lib = load()
        message = lib.npumem_last_error().decode("utf-8", "replace")
        if not message:
            message = lib.npumem_strerror(status).decode()
        raise _ERRORS.get(status, errors.NpumemError)(f"{message} (npumem C status {status})")
