"""A signal handler that raises (Ctrl-C's `KeyboardInterrupt`, an alarm's handler) while a call
waits for another thread's pause ends that wait: the call gives up having done nothing, the
handler's exception propagates, and the pool is exactly as it was."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import npumem
from helpers import state_of
from kv_helpers import make_cache

MIB = 1 << 20
# The other thread's pause holds the pool this long; a call that waited for it to end would
# take all of it.
PAUSE_TIMEOUT = 30.0
# How long the interrupted call may take at most: a generous bound, far below the pause's
# timeout (the point is that the call did not wait for the pause, not how fast it gave up).
GAVE_UP_WITHIN = 5.0
# When the signal comes, after the call began to wait.
SIGNAL_AFTER = 0.2


class Alarm(Exception):
    """What the test's SIGALRM handler raises."""


def raise_alarm(signum: int, frame: object) -> None:
    raise Alarm


@contextmanager
def paused_by_another_thread(pool: npumem.Pool) -> Iterator[None]:
    """Another thread holds `pool.pause(timeout=PAUSE_TIMEOUT)` while the body runs."""
    held = threading.Event()
    release = threading.Event()
    failed: list[BaseException] = []

    def hold() -> None:
        try:
            with pool.pause(timeout=PAUSE_TIMEOUT):
                held.set()
                release.wait(PAUSE_TIMEOUT)
        except BaseException as exc:  # reported below
            failed.append(exc)
            held.set()

    pauser = threading.Thread(target=hold)
    pauser.start()
    assert held.wait(10) and not failed, failed
    try:
        yield
    finally:
        release.set()
        pauser.join(PAUSE_TIMEOUT)
    assert not pauser.is_alive() and not failed, failed


@contextmanager
def alarm_after(seconds: float) -> Iterator[None]:
    """SIGALRM after `seconds`, its handler raising `Alarm`."""
    previous = signal.signal(signal.SIGALRM, raise_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def interrupted(call: Callable[[], object], exception: type[BaseException]) -> float:
    """Run `call`, which must raise `exception` (from the signal): the seconds it took."""
    started = time.monotonic()
    with pytest.raises(exception):
        call()
    return time.monotonic() - started


# Each call, given the pool and two live blocks of it, waits for another thread's pause.
CALLS: dict[str, Callable[[npumem.Pool, npumem.Block, npumem.Block], object]] = {
    "alloc": lambda pool, a, b: pool.alloc(1000),
    "alloc-large": lambda pool, a, b: pool.alloc(3 * MIB),
    "alloc-tagged": lambda pool, a, b: pool.alloc(100, tag="kv", align=256),
    "alloc_many": lambda pool, a, b: pool.alloc_many([100, 5000, MIB]),
    "block.free": lambda pool, a, b: a.free(),
    "pool.free": lambda pool, a, b: pool.free(b),
    "free_many": lambda pool, a, b: pool.free_many([a, b]),
    "with-block": lambda pool, a, b: pool.alloc(64).__enter__(),
    "check": lambda pool, a, b: pool.check(),
    "snapshot": lambda pool, a, b: pool.snapshot(),
    "raw_snapshot": lambda pool, a, b: pool.raw_snapshot(),
    "trace_start": lambda pool, a, b: pool.trace_start(),
    "plan_compaction": lambda pool, a, b: pool.plan_compaction(),
    "stage_compaction": lambda pool, a, b: pool.stage_compaction(),
    "trim": lambda pool, a, b: pool.trim(),
    "pause": lambda pool, a, b: pool.pause(timeout=PAUSE_TIMEOUT),
}


def two_blocks(pool: npumem.Pool) -> tuple[npumem.Block, npumem.Block]:
    return pool.alloc(4096, tag="a"), pool.alloc(200)


@pytest.mark.parametrize("name", list(CALLS))
def test_an_alarm_ends_a_wait_for_another_threads_pause(name: str) -> None:
    pool = npumem.Pool(32 * MIB, cores=2)
    a, b = two_blocks(pool)
    keep = pool.alloc_many([64] * 10 + [70_000] * 3)
    before = state_of(pool)
    with paused_by_another_thread(pool):
        with alarm_after(SIGNAL_AFTER):
            took = interrupted(lambda: CALLS[name](pool, a, b), Alarm)
        assert took < GAVE_UP_WITHIN, f"{name} waited {took:.2f} s for a pause of {PAUSE_TIMEOUT} s"
        assert a.alive and b.alive
        assert not pool.trace_status().enabled
    # Nothing was done: the same blocks, counters and figures, and the blocks still usable.
    assert state_of(pool) == before
    assert pool.check() == len(keep) + 2
    memoryview(a)[:3] = b"abc"
    a.free()
    pool.free_many([b])
    pool.free_many(keep)
    assert pool.stats().blocks_in_use == 0
    pool.check()


def test_ctrl_c_ends_a_wait_for_another_threads_pause() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    a, b = two_blocks(pool)
    before = state_of(pool)
    # Python's own handler: a process started in the background by a shell without job control
    # inherits SIGINT ignored, and Python then installs no handler for it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with paused_by_another_thread(pool):
            for call, how in [
                (lambda: pool.alloc(100), lambda: os.kill(os.getpid(), signal.SIGINT)),
                (a.free, lambda: signal.raise_signal(signal.SIGINT)),
                (pool.check, lambda: os.kill(os.getpid(), signal.SIGINT)),
            ]:
                timer = threading.Timer(SIGNAL_AFTER, how)
                timer.start()
                try:
                    took = interrupted(call, KeyboardInterrupt)
                finally:
                    timer.cancel()
                    timer.join()
                assert took < GAVE_UP_WITHIN, f"waited {took:.2f} s for a {PAUSE_TIMEOUT} s pause"
    finally:
        signal.signal(signal.SIGINT, previous)
    assert state_of(pool) == before
    a.free()
    b.free()
    pool.check()


def test_a_handler_that_does_not_raise_lets_the_wait_go_on() -> None:
    # The handler runs during the wait (signals are not held until it ends), and the call then
    # goes on waiting: it is made once the pause ends.
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(100)
    ran: list[float] = []
    release = threading.Event()
    held = threading.Event()

    def hold() -> None:
        with pool.pause(timeout=PAUSE_TIMEOUT):
            held.set()
            release.wait(PAUSE_TIMEOUT)

    def on_alarm(signum: int, frame: object) -> None:
        ran.append(time.monotonic())
        release.set()  # the handler itself ends the pause

    pauser = threading.Thread(target=hold)
    pauser.start()
    assert held.wait(10)
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, SIGNAL_AFTER)
    try:
        started = time.monotonic()
        blk.free()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        release.set()
        pauser.join(PAUSE_TIMEOUT)
    assert len(ran) == 1 and ran[0] - started < GAVE_UP_WITHIN
    assert not blk.alive
    assert pool.stats().blocks_in_use == 0
    pool.check()


def test_an_alarm_ends_a_kv_caches_wait_for_a_page() -> None:
    cache: Any = make_cache(capacity_tokens=None, page_tokens=4)
    pool = cache.pool
    cache.add_sequence(1, 6)
    before = (state_of(pool), cache.num_tokens(1), cache.num_pages(1))
    with paused_by_another_thread(pool):
        with alarm_after(SIGNAL_AFTER):
            took = interrupted(lambda: cache.append(1, 8), Alarm)
        assert took < GAVE_UP_WITHIN
        with alarm_after(SIGNAL_AFTER):
            took = interrupted(lambda: cache.add_sequence(2, 4), Alarm)
        assert took < GAVE_UP_WITHIN
    assert (state_of(pool), cache.num_tokens(1), cache.num_pages(1)) == before
    assert 2 not in cache
    cache.append(1, 8)
    assert cache.num_tokens(1) == 14
    cache.close()
    pool.check()


def test_an_alarm_during_a_with_blocks_free_goes_through() -> None:
    # The free at the end of a `with` block waits for the pause; the alarm's exception goes
    # through (it is no refusal of the free), also when the body raised, and the block stays
    # allocated.
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(100)
    before = state_of(pool)
    with paused_by_another_thread(pool):
        with alarm_after(SIGNAL_AFTER), pytest.raises(Alarm) as raised, blk:
            raise ValueError("the body's own error")
        assert isinstance(raised.value.__context__, ValueError)
        assert blk.alive
        with alarm_after(SIGNAL_AFTER), pytest.raises(Alarm), blk:
            pass
        assert blk.alive
    assert state_of(pool) == before
    with blk:
        pass
    assert not blk.alive
    pool.check()


def test_an_alarm_ends_the_copies_of_a_long_compaction_and_they_are_undone() -> None:
    """Copies on host memory take seconds in a large batch (8 GiB: more than 10 s): an alarm
    during them ends them within a slice of the wait, undone, and nothing was moved."""
    import random

    from npumem.compaction import Compactor

    pool = npumem.Pool(1 << 30, cores=1)
    rng = random.Random(1)
    blocks: list[npumem.Block] = []
    with contextlib.suppress(npumem.OutOfMemoryError):
        while True:
            blocks.append(pool.alloc(rng.choice([3 * MIB, 5 * MIB, MIB, 300 << 10])))
    for blk in blocks[::2]:
        blk.free()
    kept = blocks[1::2]
    for i, blk in enumerate(kept):
        memoryview(blk)[:8] = i.to_bytes(8, "little")

    # What a caller sees: the blocks and the byte counts (a full compaction on host memory
    # gives the cores' empty chunks back first, as a step of its own).
    def seen() -> tuple[object, ...]:
        stats = pool.stats()
        return (pool.blocks(), stats.bytes_in_use, stats.bytes_free, stats.blocks_in_use)

    before = seen()
    offsets = [blk.offset for blk in kept]
    paused = threading.Event()

    def alarm_once_paused() -> None:
        # The copies (hundreds of MiB: 0.1-1 s) begin right after the pause; the alarm comes
        # during them, and the copy loop looks for it one slice (20 ms) after it began.
        paused.wait(30)
        time.sleep(0.01)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)

    compactor = Compactor(pool, on_pause=paused.set)
    previous = signal.signal(signal.SIGALRM, raise_alarm)
    sender = threading.Thread(target=alarm_once_paused)
    sender.start()
    try:
        took = interrupted(lambda: compactor.compact("full"), Alarm)
    finally:
        sender.join(30)
        signal.signal(signal.SIGALRM, previous)
    assert took < GAVE_UP_WITHIN
    assert compactor.compactions == 0 and compactor.reports == []
    assert [blk.offset for blk in kept] == offsets, "every block where it was"
    assert all(bytes(memoryview(blk)[:8]) == i.to_bytes(8, "little") for i, blk in enumerate(kept))
    assert seen() == before
    assert pool.check() == len(kept)
    # The compaction is made when nothing interrupts it.
    compactor.compact("full")
    assert pool.stats().external_fragmentation < 0.1
