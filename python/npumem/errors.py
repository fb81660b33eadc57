"""The exception hierarchy of npumem.

Every error npumem raises derives from :class:`NpumemError`. Most also derive from the built-in
exception a Python user would reach for first (``MemoryError``, ``ValueError``, ``TypeError``), so
``except MemoryError`` around an allocation keeps working.

The Rust extension (``npumem._core``) raises these very classes: its one error-mapping place
imports them from here.
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "ConfigError",
    "CorruptionError",
    "DoubleFreeError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "MoveError",
    "NoBackingError",
    "NpumemError",
    "OutOfMemoryError",
    "PinnedBlockError",
    "PoolBusyError",
    "RequestTooLargeError",
]


class NpumemError(Exception):
    """Base class of every error npumem raises."""


class OutOfMemoryError(NpumemError, MemoryError):
    """No block of the requested size could be found, although the request itself is valid.

    The message gives the bytes asked, the bytes free and the largest free block. The numbers are
    also attributes: ``requested``, ``bytes_free``, ``largest_free_block`` (``None`` when the error
    was not raised by a pool).
    """

    def __init__(
        self,
        message: str,
        requested: int | None = None,
        bytes_free: int | None = None,
        largest_free_block: int | None = None,
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.bytes_free = bytes_free
        self.largest_free_block = largest_free_block


class InvalidArgumentError(NpumemError, ValueError):
    """An argument has a value the call cannot accept (a zero size, an alignment that is not a
    power of two, ...). The pool is left exactly as it was."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument has the wrong type (a float where an int is needed, ...)."""


class RequestTooLargeError(InvalidArgumentError, OutOfMemoryError):
    """The request can never succeed: it is larger than the whole arena.

    It is both misuse (``ValueError``) and a request for more memory than there is
    (``MemoryError``), so either ``except`` clause catches it.
    """


class InvalidHandleError(NpumemError, ValueError):
    """A block handle that is freed, stale, or belongs to another pool."""


class DoubleFreeError(InvalidHandleError):
    """A block was freed twice."""


class PinnedBlockError(NpumemError, RuntimeError):
    """The block is pinned (explicitly, or by a live buffer view) and cannot be freed or moved."""


class NoBackingError(NpumemError, BufferError):
    """The pool has no host memory behind it (``backing="none"``): its bytes live on the device,
    so there is no buffer to view."""


class PoolBusyError(NpumemError, TimeoutError):
    """The pool could not be paused in time (an in-flight call or another pause did not
    finish), or a call was made where it would wait for itself: from inside a compaction's mover,
    or a second pause of the thread that holds one."""


class ConfigError(NpumemError, ValueError):
    """An invalid pool configuration. The message names the field and the rule it broke."""


class CorruptionError(NpumemError):
    """The pool's metadata is inconsistent (raised by ``Pool.check()``), with the details."""


class MoveError(NpumemError, ValueError):
    """A batch of block moves (compaction) was refused or undone: a destination outside the
    arena, misaligned, not free or overlapping another one, moves that overwrite each other in a
    cycle with no free space to bounce through, a pause that no longer holds the pool. Nothing
    moved: the pool and every block are as they were."""


class MissingDependencyError(NpumemError, ImportError):
    """An optional dependency is not installed: reading ONNX models needs the ``onnx`` extra,
    pictures need ``plot`` (matplotlib). The message names the extra to install."""
