"""A pause of the cyclic garbage collector while many objects without cycles are made (the
readers of large files, the snapshot of a pool with a million blocks): each collection would
walk every object made so far, so a long build of small objects spends most of its time there."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (when it runs) for the `with` block; it runs again
    after, unless it was off before."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()
