"""User pins and view pins are separate: a user drops only the pins they took, and a block with
a live buffer view is never freed or moved."""

from __future__ import annotations

import numpy as np
import pytest

import npumem

MIB = 1 << 20


def test_unpin_cannot_drop_a_views_pin() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    a = pool.alloc(4096)
    v = np.frombuffer(a, np.uint8)
    assert a.pins == 1
    with pytest.raises(npumem.InvalidHandleError, match="pin"):
        a.unpin()
    assert a.pins == 1
    with pytest.raises(npumem.PinnedBlockError):
        a.free()
    assert a.alive
    del v
    assert a.pins == 0
    a.free()
    pool.check()


def test_user_pins_and_views_count_apart() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    a = pool.alloc(1000)
    assert a.pin() == 1
    m = memoryview(a)
    assert a.pins == 2
    assert a.unpin() == 0  # the user's pin; the view's stays
    assert a.pins == 1
    with pytest.raises(npumem.InvalidHandleError):
        a.unpin()
    m.release()
    assert a.pins == 0
    with a.pinned():
        v = np.frombuffer(a, np.uint8)
        assert a.pins == 2
    assert a.pins == 1
    del v
    a.free()


def test_compaction_never_moves_a_block_with_a_live_view() -> None:
    pool = npumem.Pool(64 * MIB, cores=1)
    blocks = [pool.alloc(50_000) for _ in range(200)]
    for b in blocks[::2]:
        b.free()
    keep = blocks[-1]
    view = np.frombuffer(keep, np.uint8)
    view[:] = 7
    with pytest.raises(npumem.InvalidHandleError):
        keep.unpin()
    where = keep.offset
    with pool.pause(5.0) as pause:
        pool.compact_step(pause, "full")
    assert keep.offset == where
    assert (view == 7).all()
    del view
    pool.check()


def test_a_guard_exited_twice_never_drops_a_pin_the_caller_took() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    b = pool.alloc(100)
    b.pin()
    guard = b.pinned()
    with guard:
        assert b.pins == 2
    assert b.pins == 1
    with pytest.raises(npumem.InvalidArgumentError, match="holds no pin"):
        guard.__exit__(None, None, None)
    assert b.pins == 1
    with pytest.raises(npumem.PinnedBlockError):
        b.free()
    # The guard can be entered again.
    with guard:
        assert b.pins == 2
    b.unpin()
    b.free()
    pool.check()


@pytest.mark.parametrize("end", ["detach", "defer", "free"])
def test_a_guard_of_an_object_that_no_longer_owns_its_block_refuses_to_pin(end: str) -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    b = pool.alloc(100)
    guard = b.pinned()
    owner = None
    if end == "detach":
        owner = pool.adopt(b.detach())
    elif end == "defer":
        pool.defer_free(b)
    else:
        b.free()
    with pytest.raises(npumem.InvalidHandleError):
        guard.__enter__()
    with pytest.raises(npumem.InvalidHandleError), b.pinned():
        pass
    with pytest.raises(npumem.InvalidHandleError):
        b.pin()
    if owner is not None:
        assert owner.pins == 0
        owner.free()  # nothing was left pinned through the detached object
    pool.flush_deferred()
    assert pool.stats().blocks_in_use == 0
    pool.check()
