"""npumem: an accelerator-memory manager.

One large device (or host) memory region, handed out in pieces to many threads at once by a
lock-free Rust core: per-core buddy pools with a global overflow pool, bank-aligned blocks,
generation-checked handles. On top, in Python: lifetime planning (`npumem.plan`),
monitoring and the `npumem` command. Blocks leave through DLPack; C and C++ programs link the
shipped library (`get_library()`, `get_include()`; see `npumem.clib`).

    >>> import npumem
    >>> pool = npumem.Pool(64 << 20, cores=2)
    >>> with pool.alloc(1000, tag="scratch") as blk:
    ...     memoryview(blk)[:5] = b"hello"
    ...     bytes(memoryview(blk)[:5])
    b'hello'
    >>> pool.stats().bytes_in_use
    0
"""

from __future__ import annotations

# First: in the `npumem` command's own process, a Ctrl-C while the package loads ends as the
# command ends on Ctrl-C, not with a traceback (see the module).
from npumem import _command_start  # isort: skip
from npumem import _core, _views, kv
from npumem._core import (
    MAX_TAG_BYTES,
    Block,
    BlockInfo,
    CoreStats,
    Deferred,
    Measurement,
    Pool,
    PoolStats,
    SizeClassStats,
    TagStats,
    TraceStatus,
    __version__,
)
from npumem.clib import get_include, get_library
from npumem.errors import (
    ArgumentTypeError,
    ConfigError,
    CorruptionError,
    DoubleFreeError,
    ExportError,
    InvalidArgumentError,
    InvalidHandleError,
    MissingDependencyError,
    MoveError,
    NoBackingError,
    NpumemError,
    OutOfMemoryError,
    PinnedBlockError,
    PoolBusyError,
    RequestTooLargeError,
)

# Pool.snapshot() returns an npumem.monitor.Snapshot.
_core.install_views(_views.snapshot_view)
_command_start.release()

__all__ = [
    "MAX_TAG_BYTES",
    "ArgumentTypeError",
    "Block",
    "BlockInfo",
    "ConfigError",
    "CoreStats",
    "CorruptionError",
    "Deferred",
    "DoubleFreeError",
    "ExportError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "Measurement",
    "MissingDependencyError",
    "MoveError",
    "NoBackingError",
    "NpumemError",
    "OutOfMemoryError",
    "PinnedBlockError",
    "Pool",
    "PoolBusyError",
    "PoolStats",
    "RequestTooLargeError",
    "SizeClassStats",
    "TagStats",
    "TraceStatus",
    "__version__",
    "get_include",
    "get_library",
    "kv",
]
