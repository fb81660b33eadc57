"""Locks of the Python classes that `os.fork()` cannot leave held for ever (private).

A `threading` lock is copied into a forked child as it was: one that another thread of the
parent held at the fork stays held there, since that thread does not exist in the child, and
every later call that takes it would wait for ever. The Rust core answers such calls with
`PoolBusyError`; a `ForkSafeRLock` does the same for a Python object. In the child, after the
fork, each of them is tried without waiting: a lock nobody held, or the forking thread itself
held (it goes on in the child), is released again and works as before; a lock another thread
held guarded state that thread may have left half updated, so it is not reset: from then on
taking it raises `PoolBusyError` saying which object it guards and what to do.

A `ForkSafeRLock` is a `threading.RLock` (a subclass of the C type, so taking it costs what
taking an `RLock` does); breaking it changes its class to `_BrokenRLock`, whose `acquire` and
`with` raise.
"""

from __future__ import annotations

import _thread
import os
import weakref
from types import TracebackType

from npumem.errors import PoolBusyError

__all__ = ["ForkSafeRLock"]

_LOCKS: weakref.WeakSet[ForkSafeRLock] = weakref.WeakSet()


# typeshed marks `_thread.RLock` final; the C type is subclassable (Py_TPFLAGS_BASETYPE).
class ForkSafeRLock(_thread.RLock):  # type: ignore[misc]
    """A reentrant lock that guards a `what` (an object's name: "Compactor") and, in a
    process forked while another thread held it, raises `PoolBusyError` instead of waiting
    for ever."""

    what: str

    def __init__(self, what: str) -> None:
        self.what = what
        _LOCKS.add(self)

    def held_here(self) -> bool:
        """Whether the calling thread holds the lock."""
        # The C type's own test, as `threading.Condition` uses it (typeshed leaves it out).
        return bool(self._is_owned())  # type: ignore[attr-defined]

    def _break(self) -> None:
        self.__class__ = _BrokenRLock


class _BrokenRLock(ForkSafeRLock):  # type: ignore[misc]
    """A `ForkSafeRLock` that another thread held when the process forked (see the module)."""

    def _refuse(self) -> PoolBusyError:
        return PoolBusyError(
            f"this {self.what} was in use by another thread when the process forked; "
            "make a new one in the child process"
        )

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        raise self._refuse()

    def __enter__(self, blocking: bool = True, timeout: float = -1) -> bool:
        raise self._refuse()

    def release(self) -> None:
        raise self._refuse()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        raise self._refuse()


def _after_fork_in_child() -> None:
    """Runs in the child of every `os.fork()`: break each lock another thread held."""
    for lock in list(_LOCKS):
        if type(lock) is not ForkSafeRLock:
            continue  # broken at an earlier fork already
        # Succeeds when nobody held it or the forking thread did (an RLock knows its owner by
        # thread id, and the forking thread keeps its id in the child).
        if _thread.RLock.acquire(lock, False):
            _thread.RLock.release(lock)
        else:
            lock._break()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
