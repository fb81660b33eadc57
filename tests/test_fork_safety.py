"""`os.fork()` while another thread is inside a call of a Python object of the package: in the
child that object raises `PoolBusyError` (the thread is gone and may have left its state half
updated) instead of waiting for ever on the lock that thread held; the parent's object goes on.
An object nobody was using at the fork, or only the forking thread, works in the child."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import npumem
from npumem.compaction import Compactor
from npumem.monitor import Monitor, TraceRecorder
from npumem.tiers import TieredPool
from npumem.tiers.block import Tier

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="Linux fork"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

MIB = 1 << 20
WATCHDOG = 10  # seconds a child may take before the alarm ends it (a hang)
HOLD = 60  # seconds a thread holds a lock at most (longer than a child may take)


def in_child(call: Callable[[], object]) -> str:
    """Fork, run `call` in the child and return what happened there: "ok", "busy: <message>"
    for `PoolBusyError`, the name of another exception, or "hung" when the watchdog ended it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 0
        try:
            os.close(read)
            signal.alarm(WATCHDOG)
            try:
                call()
                outcome = "ok"
            except npumem.PoolBusyError as e:
                outcome = f"busy: {e}"
            except BaseException as e:
                outcome = type(e).__name__
            os.write(write, outcome.encode())
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 4096):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "hung" if os.WTERMSIG(status) == signal.SIGALRM else f"signal {os.WTERMSIG(status)}"
    return b"".join(chunks).decode()


@contextmanager
def held_by_a_thread(enter: Callable[[threading.Event, threading.Event], object]) -> Iterator[None]:
    """Run `enter(inside, go_on)` in a thread that sets `inside` once it holds the object's
    lock and then waits for `go_on`; the body runs while it waits there, and the thread
    finishes afterwards."""
    inside, go_on = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            enter(inside, go_on)
        except BaseException as e:
            errors.append(e)
            inside.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert inside.wait(WATCHDOG), "the thread never got inside"
        assert not errors, errors
        yield
    finally:
        go_on.set()
        thread.join(WATCHDOG)
    assert not thread.is_alive()
    assert not errors, errors


def hold_lock(lock: threading.RLock) -> Callable[[threading.Event, threading.Event], None]:
    """An `enter` for `held_by_a_thread` that takes the object's lock itself."""

    def enter(inside: threading.Event, go_on: threading.Event) -> None:
        with lock:
            inside.set()
            go_on.wait(HOLD)

    return enter


def refused(outcome: str, what: str) -> bool:
    return outcome.startswith("busy: ") and f"this {what} was in use by another thread" in outcome


# ----- Compactor -------------------------------------------------------------------------------


def fragmented() -> npumem.Pool:
    # 200 blocks of 64 KiB, every other one freed: fragmentation 0.64, past the policy's
    # threshold (0.30), so `maybe_compact` takes the compactor's lock.
    pool = npumem.Pool(16 * MIB, cores=1, chunk_size=MIB)
    blocks = pool.alloc_many([64 << 10] * 200)
    pool.free_many(blocks[::2])
    fragmented.keep = blocks[1::2]  # type: ignore[attr-defined]
    return pool


def test_a_compactor_compacting_in_another_thread_at_the_fork_refuses_in_the_child() -> None:
    inside, go_on = threading.Event(), threading.Event()

    def on_pause() -> None:  # runs with the compactor's lock held, before the pool stops
        inside.set()
        go_on.wait(HOLD)

    pool = fragmented()
    comp = Compactor(pool, on_pause=on_pause)
    thread = threading.Thread(target=comp.compact, args=("full",), daemon=True)
    thread.start()
    try:
        assert inside.wait(WATCHDOG), "the compaction never paused"
        outcome = in_child(comp.compact)
    finally:
        go_on.set()
        thread.join(WATCHDOG)
    assert refused(outcome, "Compactor"), outcome
    assert "make a new one in the child process" in outcome
    assert in_child(lambda: Compactor(pool).compact()) == "ok"  # a new one works there
    # The parent's compactor goes on.
    assert comp.compactions == 1
    comp.on_pause = None
    comp.compact()
    assert comp.compactions == 2


def test_a_compactor_locked_by_another_thread_at_the_fork_refuses_every_call() -> None:
    pool = fragmented()
    comp = Compactor(pool)
    with held_by_a_thread(hold_lock(comp._lock)):
        for call in (comp.compact, comp.maybe_compact, lambda: comp._rescue(1, False)):
            assert refused(in_child(call), "Compactor")
    report = comp.compact("full")
    assert report.largest_free_after > report.largest_free_before


def test_a_compactor_nobody_or_the_forking_thread_held_works_in_the_child() -> None:
    comp = Compactor(fragmented())
    assert in_child(lambda: comp.compact("full")) == "ok"
    with comp._lock:  # the forking thread goes on in the child, holding it still
        assert in_child(lambda: comp.compact("full")) == "ok"
    report = comp.compact("full")
    assert report.largest_free_after > report.largest_free_before


# ----- TieredPool ------------------------------------------------------------------------------


def tiered(movers: Callable[[Tier, int, Tier, int, int], object] | None = None) -> TieredPool:
    return TieredPool(
        fast=[npumem.Pool(4 * MIB, cores=1, name="sram0")],
        slow=npumem.Pool(16 * MIB, cores=1, name="hbm"),
        movers=movers,
    )


def test_a_tiered_pool_moving_in_another_thread_at_the_fork_refuses_in_the_child() -> None:
    inside, go_on = threading.Event(), threading.Event()

    def mover(src: Tier, src_offset: int, dst: Tier, dst_offset: int, nbytes: int) -> None:
        inside.set()  # a move copies with the tiered pool's lock held
        go_on.wait(HOLD)

    mem = tiered(mover)
    moving, other = mem.alloc(1000, tier="slow"), mem.alloc(1000, tier="slow")
    thread = threading.Thread(target=mem.promote, args=(moving,), daemon=True)
    thread.start()
    try:
        assert inside.wait(WATCHDOG), "the move never started"
        outcomes = [in_child(lambda: mem.free(other)), in_child(mem.stats)]
    finally:
        go_on.set()
        thread.join(WATCHDOG)
    assert all(refused(o, "TieredPool") for o in outcomes), outcomes
    # The parent's tiered pool goes on.
    assert moving.tier == "fast"
    mem.free(other)
    mem.free(moving)
    stats = mem.stats()
    assert stats.promotions == 1
    assert stats.slow.blocks == stats.fast[0].blocks == 0


def test_a_tiered_pool_locked_by_another_thread_at_the_fork_refuses_in_the_child() -> None:
    mem = tiered()
    tb = mem.alloc(1000)
    with held_by_a_thread(hold_lock(mem._lock)):
        for call in (lambda: mem.free(tb), mem.stats, lambda: mem.touch(tb), mem.rebalance):
            assert refused(in_child(call), "TieredPool")
    mem.free(tb)


def test_a_tiered_pool_nobody_or_the_forking_thread_held_works_in_the_child() -> None:
    mem = tiered()
    tb = mem.alloc(1000)
    assert in_child(lambda: (mem.free(tb), mem.stats())) == "ok"
    with mem._lock:
        assert in_child(lambda: (mem.free(tb), mem.stats())) == "ok"
    mem.free(tb)
    assert not tb.alive
    assert mem.stats().fast[0].blocks == 0


# ----- Monitor and TraceRecorder ---------------------------------------------------------------


def test_a_monitor_sampling_in_another_thread_at_the_fork_refuses_in_the_child() -> None:
    mon = Monitor(npumem.Pool(4 * MIB, cores=1))
    with held_by_a_thread(hold_lock(mon._lock)):
        for call in (mon.sample, lambda: mon.history, lambda: mon.alerts):
            assert refused(in_child(call), "Monitor")
    mon.sample()
    assert len(mon.history) == 1


def test_a_monitor_nobody_or_the_forking_thread_held_works_in_the_child() -> None:
    mon = Monitor(npumem.Pool(4 * MIB, cores=1))
    assert in_child(lambda: (mon.sample(), mon.history)) == "ok"
    with mon._lock:
        assert in_child(lambda: mon.history) == "ok"
    assert mon.samples_taken == 0


def test_a_trace_recorder_draining_in_another_thread_at_the_fork_refuses_in_the_child() -> None:
    pool = npumem.Pool(4 * MIB, cores=1)
    rec = TraceRecorder(pool).start()
    with held_by_a_thread(hold_lock(rec._lock)):
        for call in (rec.drain, rec.stop):
            assert refused(in_child(call), "TraceRecorder")
    pool.alloc(100).free()
    assert [e.kind for e in rec.stop().events] == ["alloc", "free"]


def test_a_trace_recorder_nobody_held_works_in_the_child() -> None:
    pool = npumem.Pool(4 * MIB, cores=1)
    rec = TraceRecorder(pool).start()
    assert in_child(lambda: (pool.alloc(100).free(), rec.stop())) == "ok"
    with rec._lock:
        assert in_child(rec.drain) == "ok"
    rec.stop()


def test_a_lock_broken_at_one_fork_stays_broken_in_a_grandchild() -> None:
    comp = Compactor(fragmented())

    def fork_again() -> None:
        outcome = in_child(comp.compact)
        if not refused(outcome, "Compactor"):
            raise AssertionError(outcome)
        comp.compact()

    with held_by_a_thread(hold_lock(comp._lock)):
        assert refused(in_child(fork_again), "Compactor")
