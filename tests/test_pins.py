"""User pins and view pins are separate: a user drops only the pins they took, and a block with
a live buffer view is never freed or moved."""

from __future__ import annotations

import gc
import threading

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


def test_a_guards_repr_names_its_block_and_the_pins_it_holds() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    b = pool.alloc(100, tag="kv")
    guard = b.pinned()
    assert repr(guard) == f"<npumem.Pinned {b!r} held=0>"
    with guard:
        assert repr(guard) == f"<npumem.Pinned {b!r} held=1>"
        assert f"offset={b.offset}" in repr(guard) and 'tag="kv"' in repr(guard)
    b.free()
    assert repr(guard) == '<npumem.Pinned <npumem.Block freed nbytes=100 tag="kv"> held=0>'


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


def _state(pool: npumem.Pool) -> tuple[int, int]:
    gc.collect()
    pool.flush_deferred()
    stats = pool.stats()
    return stats.blocks_in_use, stats.deferred_pending


def test_a_collected_block_drops_the_pins_its_pin_took_and_is_freed() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    b = pool.alloc(100, tag="t")
    assert b.pin() == 1 and b.pin() == 2
    handle = b.handle
    del b
    assert _state(pool) == (0, 0)
    stats = pool.stats()
    assert stats.auto_freed == 1
    assert [t.blocks_in_use for t in stats.by_tag if t.tag == "t"] == [0]
    with pytest.raises(npumem.InvalidHandleError):
        pool.adopt(handle)  # freed: stale
    pool.check()


def test_a_view_keeps_a_collected_pinned_block_until_the_view_goes() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    b = pool.alloc(4096)
    b.pin()
    arr = b.as_array()
    arr[:] = 9
    del b
    assert _state(pool) == (1, 0)
    assert (arr == 9).all()
    del arr
    assert _state(pool) == (0, 0)
    pool.check()


def test_a_guard_collected_while_entered_drops_its_pin() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    b = pool.alloc(100)
    guard = b.pinned()
    guard.__enter__()
    b.pin()
    assert b.pins == 2
    del b
    assert _state(pool) == (1, 0)  # the guard holds the object
    del guard
    assert _state(pool) == (0, 0)
    pool.check()


def test_unpin_drops_only_the_pins_pin_took_through_this_object() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    b = pool.alloc(100)
    with b.pinned():
        with pytest.raises(npumem.InvalidHandleError, match=r"no pin taken by pin\(\)"):
            b.unpin()
        assert b.pins == 1
        assert b.pin() == 1
        assert b.pins == 2
        assert b.unpin() == 0
        assert b.pins == 1
    assert b.pins == 0
    b.free()


def test_detach_hands_the_pins_of_pin_on_to_the_adopting_object() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    b = pool.alloc(100)
    b.pin()
    handle = b.detach()
    del b
    assert _state(pool) == (1, 0)  # detached: its old object neither unpins nor frees it
    owner = pool.adopt(handle)
    assert owner.pins == 1
    with pytest.raises(npumem.PinnedBlockError):
        owner.free()
    assert owner.unpin() == 0
    owner.pin()
    del owner  # the adopting object's pins go with it
    assert _state(pool) == (0, 0)
    pool.check()


def test_defer_free_is_refused_while_pin_holds_the_block() -> None:
    pool = npumem.Pool(1 << 20, cores=1)
    b = pool.alloc(100)
    b.pin()
    with pytest.raises(npumem.PinnedBlockError):
        pool.defer_free(b)
    with pool.deferred(), pytest.raises(npumem.PinnedBlockError):
        pool.free_many([b])
    assert b.alive and b.unpin() == 0
    pool.defer_free(b)
    assert _state(pool) == (0, 0)


def test_pins_of_many_threads_on_one_object_balance() -> None:
    pool = npumem.Pool(1 << 20, cores=2)
    b = pool.alloc(100)

    def work() -> None:
        for _ in range(2000):
            b.pin()
            b.unpin()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.pins == 0
    with pytest.raises(npumem.InvalidHandleError):
        b.unpin()
    b.free()
    pool.check()
