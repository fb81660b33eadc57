"""The exception hierarchy of npumem.

Every error npumem raises derives from `NpumemError`. Most also derive from the built-in
exception a Python user would reach for first (`MemoryError`, `ValueError`, `TypeError`), so
`except MemoryError` around an allocation keeps working:

    NpumemError(Exception)
    ├── OutOfMemoryError(MemoryError)      no block of the size, although the request is valid;
    │                                      attributes requested, bytes_free, largest_free_block
    ├── InvalidArgumentError(ValueError)   an argument value the call cannot accept
    │   ├── ArgumentTypeError(TypeError)   an argument of the wrong type
    │   └── RequestTooLargeError           too large for any block (also an OutOfMemoryError)
    ├── InvalidHandleError(ValueError)     a freed, stale or foreign block handle
    │   └── DoubleFreeError                a block freed twice
    ├── PinnedBlockError(RuntimeError)     a pinned block cannot be freed or moved (or pinned
    │                                      once more past its most pins)
    ├── NoBackingError(BufferError)        backing="none": no host bytes to view (and, without
    │                                      a base_address, no address to export through DLPack)
    ├── ExportError(BufferError)           a DLPack export asked for a copy or another device
    ├── PoolBusyError(TimeoutError)        the pool could not be paused in time, or a call
    │                                      would wait for itself, or (in a child process) it
    │                                      was in use by another thread at the fork
    ├── ConfigError(ValueError)            an invalid pool configuration
    ├── CorruptionError                    inconsistent metadata (Pool.check())
    ├── MoveError(ValueError)              a batch of moves refused or undone; nothing moved
    └── MissingDependencyError(ImportError) an optional extra (onnx, plot) is not installed

A bad call leaves the pool exactly as it was. The classes are defined by the Rust extension,
which raises them (`npumem.errors.X is npumem._core.X`); each has its own docstring.
`MissingDependencyError` is raised by the Python facade alone and is defined here.
"""

from __future__ import annotations

from npumem._core import (
    ArgumentTypeError,
    ConfigError,
    CorruptionError,
    DoubleFreeError,
    ExportError,
    InvalidArgumentError,
    InvalidHandleError,
    MoveError,
    NoBackingError,
    NpumemError,
    OutOfMemoryError,
    PinnedBlockError,
    PoolBusyError,
    RequestTooLargeError,
)

__all__ = [
    "ArgumentTypeError",
    "ConfigError",
    "CorruptionError",
    "DoubleFreeError",
    "ExportError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "MissingDependencyError",
    "MoveError",
    "NoBackingError",
    "NpumemError",
    "OutOfMemoryError",
    "PinnedBlockError",
    "PoolBusyError",
    "RequestTooLargeError",
]


class MissingDependencyError(NpumemError, ImportError):
    """An optional dependency is not installed: reading ONNX models needs the `onnx` extra,
    pictures need `plot` (matplotlib). The message names the extra to install."""
