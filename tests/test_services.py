"""Runtime services around free: deferred frees, blocks that free themselves, detach/adopt,
`with` exits that never hide the body's exception, and planned arenas across compactions."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import npumem
from npumem.plan import Buffer, Problem, Solution

MIB = 1 << 20


def live(pool: npumem.Pool) -> int:
    return len(pool.blocks())


# ----- deferred frees -------------------------------------------------------------------------


def test_frees_inside_a_deferred_scope_wait_for_its_end() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blocks = [pool.alloc(1000) for _ in range(10)]
    with pool.deferred() as scope:
        for b in blocks[:4]:
            b.free()
        pool.free(blocks[4])
        pool.free_many(blocks[5:7])
        with blocks[7]:
            pass
        assert scope.pending == 8
        assert live(pool) == 10  # nothing freed yet
        assert pool.stats().deferred_pending == 8
        assert not blocks[0].alive
        with pytest.raises(npumem.InvalidHandleError, match="deferred"):
            _ = blocks[0].offset
        with pytest.raises(npumem.DoubleFreeError, match="deferred"):
            blocks[0].free()
        with pytest.raises(npumem.InvalidHandleError):
            memoryview(blocks[0])
        with pytest.raises(npumem.InvalidHandleError):
            blocks[0].pin()
    assert live(pool) == 2
    stats = pool.stats()
    assert stats.deferred_pending == 0
    assert stats.free_count == 8
    pool.check()


def test_a_block_whose_deferred_free_was_made_is_said_to_be_freed() -> None:
    # Once the deferred free was made, the object still said "the block's free is deferred".
    pool = npumem.Pool(16 * MIB, cores=1)
    blocks = [pool.alloc(1000) for _ in range(2)]
    with pool.deferred():
        blocks[0].free()
        assert "deferred" in repr(blocks[0])
    assert live(pool) == 1
    gone = blocks[0]
    with pytest.raises(npumem.InvalidHandleError, match="the block was freed") as info:
        _ = gone.offset
    assert "is deferred" not in str(info.value)
    with pytest.raises(npumem.DoubleFreeError, match="the block was freed"):
        gone.free()
    with pytest.raises(npumem.DoubleFreeError, match="the block was freed"):
        pool.defer_free(gone)
    with pytest.raises(npumem.InvalidHandleError, match="the block was freed"):
        memoryview(gone)
    with pytest.raises(npumem.DoubleFreeError, match="item 0 of the batch: the block was freed"):
        pool.free_many([gone])
    with (
        pool.pause() as pause,
        pytest.raises(npumem.InvalidHandleError, match="item 0 of the batch: the block was"),
    ):
        pool.move_blocks(pause, [(gone, 0)])
    assert "freed" in repr(gone) and "deferred" not in repr(gone)
    # A free made at the last pin, queued while another thread paused the pool, likewise.
    with pytest.raises(KeyError), blocks[1] as held:
        view = memoryview(held)
        raise KeyError("body")
    with paused_by_another_thread(pool):
        view.release()
        with pytest.raises(npumem.InvalidHandleError, match="free is deferred"):
            memoryview(held)
    assert live(pool) == 0
    with pytest.raises(npumem.InvalidHandleError, match="the block was freed"):
        memoryview(held)
    pool.check()


def test_a_body_that_raises_still_flushes_and_its_exception_propagates() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blocks = [pool.alloc(4096) for _ in range(5)]
    with pytest.raises(ZeroDivisionError), pool.deferred():
        for b in blocks:
            b.free()
        1 / 0  # noqa: B018
    assert live(pool) == 0
    assert pool.stats().deferred_pending == 0
    pool.check()


def test_nested_scopes_flush_at_the_outermost_exit() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    a, b = pool.alloc(100), pool.alloc(100)
    with pool.deferred():
        a.free()
        with pool.deferred() as inner:
            b.free()
            assert inner.pending == 2  # one queue per pool and thread
        assert live(pool) == 2
    assert live(pool) == 0


def test_a_scope_object_is_entered_once_and_exits_on_its_thread() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    scope = pool.deferred()
    with scope:
        with pytest.raises(npumem.InvalidArgumentError, match="open already"):
            scope.__enter__()
        errors: list[BaseException] = []

        def elsewhere() -> None:
            try:
                scope.__exit__(None, None, None)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
        assert isinstance(errors[0], npumem.InvalidArgumentError)
    with pytest.raises(npumem.InvalidArgumentError, match="not open"):
        scope.__exit__(None, None, None)


def test_scopes_are_per_thread() -> None:
    pool = npumem.Pool(16 * MIB, cores=2)
    mine, theirs = pool.alloc(100), pool.alloc(100)
    with pool.deferred():
        mine.free()

        def free_there() -> None:
            theirs.free()  # no scope on this thread: freed at once

        t = threading.Thread(target=free_there)
        t.start()
        t.join()
        assert live(pool) == 1
        assert pool.stats().deferred_pending == 1
    assert live(pool) == 0


def test_frees_are_immediate_again_once_every_scope_closed() -> None:
    pool, other = npumem.Pool(16 * MIB, cores=1), npumem.Pool(16 * MIB, cores=1)
    with other.deferred():
        pool.alloc(100).free()  # another pool's scope: freed at once
        assert live(pool) == 0
    with pool.deferred(), pool.deferred():
        pool.alloc(100).free()
        assert pool.stats().deferred_pending == 1
    with pytest.raises(RuntimeError), pool.deferred():
        raise RuntimeError("the body raised")
    blk = pool.alloc(100)
    blk.free()  # no scope open any more: freed at once
    assert (live(pool), pool.stats().deferred_pending) == (0, 0)
    with pool.deferred():  # and a new scope defers again
        pool.alloc(100).free()
        assert live(pool) == 1
    assert live(pool) == 0


def test_deferred_frees_of_many_threads_at_once() -> None:
    pool = npumem.Pool(64 * MIB, cores=4)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(50):
                with pool.deferred():
                    blocks = pool.alloc_many([256] * 20)
                    for b in blocks:
                        b.free()
                    assert all(not b.alive for b in blocks)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert live(pool) == 0
    assert pool.stats().deferred_pending == 0
    pool.check()


def test_defer_free_and_flush_deferred() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blocks = [pool.alloc(2000, tag="t") for _ in range(3)]
    for b in blocks:
        pool.defer_free(b)
    assert pool.stats().deferred_pending == 3
    assert live(pool) == 3
    with pytest.raises(npumem.DoubleFreeError):
        pool.defer_free(blocks[0])
    assert pool.flush_deferred() == 3
    assert pool.flush_deferred() == 0
    assert live(pool) == 0
    stats = pool.stats()
    assert stats.deferred_pending == 0
    assert [t.blocks_in_use for t in stats.by_tag if t.tag == "t"] == [0]


def test_defer_free_refuses_what_free_refuses() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    other = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(100)
    with pytest.raises(npumem.InvalidHandleError, match="another pool"):
        other.defer_free(blk)
    with pytest.raises(npumem.ArgumentTypeError):
        pool.defer_free(42)  # type: ignore[arg-type]
    view = memoryview(blk)
    with pytest.raises(npumem.PinnedBlockError):
        pool.defer_free(blk)
    view.release()
    blk.free()
    with pytest.raises(npumem.DoubleFreeError):
        pool.defer_free(blk)
    assert pool.stats().deferred_pending == 0


def test_free_many_inside_a_scope_is_all_or_nothing() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    a, b = pool.alloc(100), pool.alloc(100)
    with pool.deferred() as scope:
        view = memoryview(b)
        with pytest.raises(npumem.PinnedBlockError):
            pool.free_many([a, b])
        assert a.alive and b.alive and scope.pending == 0
        with pytest.raises(npumem.DoubleFreeError):
            pool.free_many([a, a])
        view.release()
        pool.free_many([a, b])
        assert scope.pending == 2
    assert live(pool) == 0


def test_a_compaction_moving_a_deferred_block_keeps_its_free_valid() -> None:
    pool = npumem.Pool(32 * MIB, cores=1)
    blocks = [pool.alloc(300_000) for _ in range(40)]
    for b in blocks[:-1:2]:
        b.free()
    last = blocks[-1]
    pool.defer_free(last)
    with pool.pause() as pause:
        report = pool.compact_step(pause, "full")
    assert report.blocks > 0
    assert pool.flush_deferred() == 1
    assert live(pool) == 19
    pool.check()


def test_the_pool_dropped_with_frees_pending_frees_them() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    pool.defer_free(pool.alloc(100))
    assert pool.stats().deferred_pending == 1
    del pool
    gc.collect()  # nothing to assert beyond "no crash": the arena goes with the pool


def test_a_flush_whose_block_c_code_freed_raises_after_freeing_the_rest() -> None:
    import ctypes

    from npumem import clib

    class Handle(ctypes.Structure):
        _fields_ = [
            ("pool_id", ctypes.c_uint32),
            ("slot", ctypes.c_uint32),
            ("generation", ctypes.c_uint32),
            ("reserved", ctypes.c_uint32),
        ]

    pool = npumem.Pool(16 * MIB, cores=1)
    capsule = pool.c_pool()
    lib = ctypes.CDLL(clib.get_library())
    lib.npumem_free.argtypes = [ctypes.c_void_p, Handle]
    blocks = [pool.alloc(100) for _ in range(3)]
    bits = blocks[1].handle
    for b in blocks:
        pool.defer_free(b)
    raw = Handle(bits >> 64, (bits >> 32) & 0xFFFFFFFF, bits & 0xFFFFFFFF, 0)
    assert lib.npumem_free(clib.capsule_pointer(capsule), raw) == 0  # behind Python's back
    with pytest.raises(npumem.InvalidHandleError):
        pool.flush_deferred()
    assert live(pool) == 0
    assert pool.stats().deferred_pending == 0
    pool.check()


# ----- blocks that free themselves ------------------------------------------------------------


def test_a_dropped_block_is_freed_and_counted() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    pool.alloc(1000)
    blk = pool.alloc(2000, tag="x")
    del blk
    stats = pool.stats()
    assert stats.bytes_in_use == 0
    assert stats.auto_freed == 2
    assert stats.free_count == 2
    assert [t.blocks_in_use for t in stats.by_tag if t.tag == "x"] == [0]
    freed = pool.alloc(10)
    freed.free()
    del freed
    assert pool.stats().auto_freed == 2  # freed blocks are not freed twice


def test_a_block_held_by_views_is_freed_when_the_last_view_goes() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(4096)
    view = memoryview(blk)
    arr = np.frombuffer(blk, dtype=np.uint8)
    shaped = blk.as_array("float32", (4, 8))
    del blk
    assert live(pool) == 1
    del view
    assert live(pool) == 1
    del arr
    assert live(pool) == 1
    del shaped
    gc.collect()
    assert live(pool) == 0
    assert pool.stats().auto_freed == 1


def test_a_dlpack_capsule_holds_the_block() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(64)
    capsule = blk.__dlpack__()
    del blk
    assert live(pool) == 1
    del capsule
    assert live(pool) == 0


def test_blocks_collected_on_another_thread() -> None:
    pool = npumem.Pool(64 * MIB, cores=4)
    handoff = [pool.alloc_many([1000] * 200) for _ in range(4)]

    def drop(i: int) -> None:
        handoff[i].clear()

    threads = [threading.Thread(target=drop, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = pool.stats()
    assert stats.bytes_in_use == 0
    assert stats.auto_freed == 800
    pool.check()


@contextmanager
def paused_by_another_thread(pool: npumem.Pool) -> Iterator[None]:
    """Run the `with` body while another thread holds a pause of `pool`; the pause ends (and
    the thread is joined) when the body leaves."""
    paused, go = threading.Event(), threading.Event()

    def pauser() -> None:
        with pool.pause(timeout=10):
            paused.set()
            go.wait(10)

    t = threading.Thread(target=pauser)
    t.start()
    assert paused.wait(10)
    try:
        yield
    finally:
        go.set()
        t.join()


def test_blocks_collected_while_another_thread_pauses_wait_and_do_not_deadlock() -> None:
    pool = npumem.Pool(16 * MIB, cores=2)
    blocks = [pool.alloc(1000) for _ in range(5)]
    with paused_by_another_thread(pool):
        blocks.clear()  # collected while the pool is paused by another thread: queued, no wait
        # The counters, not `blocks()`: that would wait for the pause to end.
        assert pool.stats().blocks_in_use == 5
    stats = pool.stats()  # the resume retried them
    assert stats.deferred_pending == 0
    assert stats.auto_freed == 5
    assert live(pool) == 0


def test_blocks_collected_by_the_pausing_thread() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(1000)
    with pool.pause():
        del blk  # the pausing thread may free
        assert live(pool) == 0


def test_a_block_collected_inside_a_deferred_scope_is_deferred() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(1000)
    with pool.deferred() as scope:
        del blk
        assert scope.pending == 1
        assert live(pool) == 1
    assert live(pool) == 0
    assert pool.stats().auto_freed == 1


def test_the_pool_lives_as_long_as_its_blocks() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(1000)
    del pool
    gc.collect()
    assert blk.pool.stats().bytes_in_use == 1024
    p = blk.pool
    del blk
    assert p.stats().bytes_in_use == 0


def test_blocks_alive_at_interpreter_shutdown() -> None:
    code = (
        "import npumem\n"
        "pool = npumem.Pool(16 << 20, cores=1)\n"
        "keep = [pool.alloc(1000) for _ in range(100)]\n"
        "view = memoryview(keep[0])\n"
        "pool.defer_free(keep[1])\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# ----- detach and adopt -----------------------------------------------------------------------


def test_detach_hands_ownership_on_and_adopt_takes_it_back() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(3000, tag="kept")
    handle = blk.detach()
    assert handle == blk.handle
    assert not blk.alive
    with pytest.raises(npumem.InvalidHandleError, match="detached"):
        blk.free()
    with pytest.raises(npumem.InvalidHandleError, match="detached"):
        blk.detach()
    del blk
    assert live(pool) == 1  # not freed: ownership left
    again = pool.adopt(handle)
    assert again.nbytes == 3000 and again.tag == "kept" and again.alive
    with pytest.raises(npumem.InvalidHandleError, match="not detached"):
        pool.adopt(handle)  # owned by `again`
    del again
    assert live(pool) == 0
    with pytest.raises(npumem.InvalidHandleError):
        pool.adopt(handle)  # freed: stale


def test_adopt_refuses_foreign_owned_and_bad_handles() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    other = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(100)
    with pytest.raises(npumem.InvalidHandleError, match="not detached"):
        pool.adopt(blk.handle)
    mine = blk.detach()
    with pytest.raises(npumem.InvalidHandleError):
        other.adopt(mine)
    with pytest.raises(npumem.InvalidHandleError):
        pool.adopt(-1)
    with pytest.raises(npumem.InvalidHandleError):
        pool.adopt(1 << 100)
    with pytest.raises(npumem.ArgumentTypeError):
        pool.adopt("1")  # type: ignore[arg-type]
    assert pool.adopt(mine).alive
    before = pool.stats()
    assert before.bytes_in_use == 0  # the adopted block was dropped at once


class Index:
    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_adopt_says_which_handles_name_no_block_and_which_were_freed() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    other = npumem.Pool(16 * MIB, cores=1)
    freed = pool.alloc(100)
    stale = freed.handle
    freed.free()
    live = pool.alloc(100)
    handle = live.detach()
    assert handle >> 32 == stale >> 32, "the slot is reused"
    made_up = [
        1 << 90,  # a pool id no pool got
        handle + 1,  # a generation the slot never had
        (handle >> 32) << 32 | 0xFFFF_FFFF,
        1 << 200,
        -1,
    ]
    for value in made_up:
        for arg in (value, Index(value)):
            with pytest.raises(npumem.InvalidHandleError, match="is not a block's handle"):
                pool.adopt(arg)  # type: ignore[arg-type]
    with pytest.raises(npumem.InvalidHandleError, match="was freed"):
        pool.adopt(stale)
    with pytest.raises(npumem.InvalidHandleError, match="another pool"):
        other.adopt(handle)
    assert pool.adopt(Index(handle)).alive
    pool.check()


def test_a_detached_block_survives_a_compaction() -> None:
    pool = npumem.Pool(32 * MIB, cores=1)
    blocks = [pool.alloc(300_000) for _ in range(40)]
    memoryview(blocks[-1])[:4] = b"keep"
    handle = blocks[-1].detach()
    for b in blocks[:-1:2]:
        b.free()
    with pool.pause() as pause:
        pool.compact_step(pause, "full")
    blk = pool.adopt(handle)
    assert bytes(memoryview(blk)[:4]) == b"keep"


def test_deferred_and_detached_blocks_are_refused_by_batch_calls() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    a, b = pool.alloc(100), pool.alloc(100)
    pool.defer_free(a)
    b.detach()
    with pytest.raises(npumem.DoubleFreeError):
        pool.free_many([a])
    with pytest.raises(npumem.InvalidHandleError, match="detached"):
        pool.free_many([b])
    with pool.pause() as pause, pytest.raises(npumem.InvalidHandleError):
        pool.move_blocks(pause, [(a, 0)])


# ----- with exits never hide the body's exception ---------------------------------------------


def test_an_exit_with_a_live_view_lets_the_body_exception_through() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    with pytest.raises(ZeroDivisionError), pool.alloc(4096) as blk:
        x = np.frombuffer(blk, dtype=np.uint8)
        1 / 0  # noqa: B018
    assert live(pool) == 1  # still pinned by x
    assert blk.alive
    del x  # the last pin goes: freed now, although `blk` still names it
    assert live(pool) == 0
    assert not blk.alive
    assert pool.stats().auto_freed == 1


def test_an_exit_with_a_user_pin_frees_at_the_last_unpin() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    with pytest.raises(KeyError), pool.alloc(4096) as blk:
        blk.pin()
        blk.pin()
        raise KeyError("body")
    assert blk.unpin() == 1
    assert live(pool) == 1
    assert blk.unpin() == 0
    assert live(pool) == 0


def test_an_exit_whose_last_pin_goes_inside_a_deferred_scope_is_queued_there() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(3000)
    with pool.deferred() as scope:
        view = memoryview(blk)
        with pytest.raises(KeyError), blk:
            raise KeyError("body")
        view.release()  # the last pin goes inside the scope: the exit's free waits for its end
        assert scope.pending == 1
        assert pool.stats().deferred_pending == 1
        assert live(pool) == 1
        with pytest.raises(npumem.DoubleFreeError):
            blk.free()
    assert live(pool) == 0
    assert pool.stats().deferred_pending == 0
    assert pool.check() == 0


def _hold_by(kind: str, blk: npumem.Block) -> Callable[[], None]:
    """Pin `blk` through `kind`; returns what drops that pin."""
    if kind == "memoryview":
        view = memoryview(blk)
        return view.release
    if kind == "as_array":
        held = [blk.as_array("float32")]
        return held.clear
    if kind == "from_dlpack":
        held = [np.from_dlpack(blk)]
        return held.clear
    if kind == "capsule":  # never consumed: its destructor drops the pin
        held = [blk.__dlpack__()]
        return held.clear
    guard = blk.pinned()
    guard.__enter__()
    return lambda: guard.__exit__(None, None, None)


PIN_HOLDERS = ["memoryview", "as_array", "from_dlpack", "capsule", "pinned"]


@pytest.mark.parametrize("kind", PIN_HOLDERS)
def test_an_exit_with_a_pin_frees_when_that_pin_goes_whatever_holds_it(kind: str) -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(4096, tag="t")
    release = _hold_by(kind, blk)
    with pytest.raises(KeyError), blk:
        raise KeyError("body")
    assert blk.alive and live(pool) == 1
    release()
    gc.collect()
    assert not blk.alive
    assert live(pool) == 0
    stats = pool.stats()
    assert stats.auto_freed == 1 and stats.deferred_pending == 0
    assert [t.blocks_in_use for t in stats.by_tag if t.tag == "t"] == [0]
    pool.check()


@pytest.mark.parametrize("kind", PIN_HOLDERS)
def test_a_last_pin_that_goes_while_another_thread_pauses_frees_after_the_pause(kind: str) -> None:
    pool = npumem.Pool(16 * MIB, cores=2)
    blk = pool.alloc(4096)
    release = _hold_by(kind, blk)
    with pytest.raises(KeyError), blk:
        raise KeyError("body")
    with paused_by_another_thread(pool):
        release()  # the pool is paused by another thread: nothing waits, the free is queued
        gc.collect()
        assert not blk.alive
        assert pool.stats().blocks_in_use == 1  # the counters: `blocks()` waits for the pause
    stats = pool.stats()
    assert stats.deferred_pending == 0 and stats.auto_freed == 1
    assert live(pool) == 0


def test_an_exit_without_an_exception_still_raises_pinned() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(4096)
    view = memoryview(blk)
    with pytest.raises(npumem.PinnedBlockError), blk:
        pass
    view.release()
    assert blk.alive  # as before: not freed at the unpin
    blk.free()


def test_an_exit_after_a_free_inside_the_body_with_an_exception() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    with pytest.raises(RuntimeError, match="body"), pool.alloc(100) as blk:
        blk.free()
        raise RuntimeError("body")
    assert live(pool) == 0


# ----- planned arenas across compactions -----------------------------------------------------


def _small_plan() -> Solution:
    problem = Problem([Buffer("a", 0, 2, 64, 64), Buffer("b", 1, 3, 64, 64)])
    return Solution(problem, {"a": 0, "b": 64})


def test_bind_pins_the_block_so_a_compaction_leaves_the_offsets_true() -> None:
    pool = npumem.Pool(32 * MIB, cores=1)
    blocks = [pool.alloc(300_000) for _ in range(40)]
    arena = blocks[-1]
    for b in blocks[:-1:2]:
        b.free()
    solution = _small_plan()
    table = solution.bind(arena)
    assert table.pinned and arena.pins == 1
    before = dict(table)
    with pool.pause() as pause:
        report = pool.compact_step(pause, "full")
    assert report.blocks > 0
    assert table == before
    assert table["a"] == arena.offset
    with pytest.raises(npumem.PinnedBlockError):
        arena.free()
    table.release()
    table.release()
    assert arena.pins == 0
    with pool.pause() as pause:
        pool.compact_step(pause, "full")
    assert arena.offset != before["a"]  # unpinned, the same compaction moves it
    assert solution.bind(arena)["a"] == arena.offset  # a fresh table reads the new place
    arena.free()


def test_bind_as_a_context_manager_and_on_failure() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(128, align=64)
    with _small_plan().bind(blk) as offsets:
        assert blk.pins == 1 and offsets["b"] == blk.offset + 64
    assert blk.pins == 0
    tiny = pool.alloc(64, align=64)
    with pytest.raises(npumem.plan.PlanError):
        _small_plan().bind(tiny)
    assert tiny.pins == 0


# ----- the demo -------------------------------------------------------------------------------


def test_the_demo_defers_kernel_argument_frees_to_the_end_of_each_batch() -> None:
    from npumem.workloads.demo import run_demo

    result = run_demo(requests=40, workers=2, interval=0.05)
    assert result.ok
    assert result.deferred_batches > 0 and result.deferred_frees >= result.deferred_batches
    assert result.final is not None
    assert result.final.deferred_pending == 0 and result.final.bytes_in_use == 0
    assert result.final.auto_freed == 0  # the demo drops no block it still needs


def test_a_pause_dropped_without_resume_frees_what_was_collected_meanwhile() -> None:
    pool = npumem.Pool(16 * MIB, cores=2)
    blocks = [pool.alloc(1000) for _ in range(3)]
    pause = pool.pause(timeout=10)

    def drop_there() -> None:
        blocks.clear()  # another thread: the gate is closed, so the frees wait

    t = threading.Thread(target=drop_there)
    t.start()
    t.join()
    assert live(pool) == 3 and pool.stats().deferred_pending == 3
    del pause  # collected: resumes, and the waiting frees are made
    assert live(pool) == 0
    assert pool.stats().deferred_pending == 0


@pytest.mark.parametrize("call", ["check", "snapshot", "raw_snapshot", "trace_start", "trim"])
def test_maintenance_calls_wait_for_another_threads_pause_at_most_its_timeout(call: str) -> None:
    """A pause's `timeout` bounds how long other threads' calls wait for it, the pool's own
    maintenance calls too: they raise `PoolBusyError` saying that the pool stayed paused."""
    pool = npumem.Pool(16 << 20, cores=1)
    outcome: list[tuple[BaseException | None, float]] = []

    def other() -> None:
        started = time.monotonic()
        try:
            getattr(pool, call)()
        except npumem.NpumemError as exc:
            outcome.append((exc, time.monotonic() - started))
        else:  # pragma: no cover - reported below
            outcome.append((None, time.monotonic() - started))

    with pool.pause(timeout=0.2):
        t = threading.Thread(target=other)
        t.start()
        t.join(30)
    (raised, waited) = outcome[0]
    assert isinstance(raised, npumem.PoolBusyError), raised
    assert "stayed paused" in str(raised), raised
    assert 0.2 <= waited < 5, f"{call}() waited {waited:.2f} s for a pause of 0.2 s"
    getattr(pool, call)()  # goes through once the pause ended


def test_a_trim_refused_by_another_threads_pause_gives_nothing_back() -> None:
    pool = npumem.Pool(16 << 20, cores=1)
    pool.alloc(256).free()  # an all-free slab for a trim to give back
    before = pool.stats()
    refused: list[BaseException] = []

    def other() -> None:
        try:
            pool.trim()
        except npumem.PoolBusyError as exc:
            refused.append(exc)

    with pool.pause(timeout=0.1):
        t = threading.Thread(target=other)
        t.start()
        t.join(30)
    assert len(refused) == 1 and "stayed paused" in str(refused[0])
    assert pool.stats() == before
    assert pool.trim() > 0
