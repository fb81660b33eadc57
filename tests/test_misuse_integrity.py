"""Misuse and interruptions leave the pool as it was: failed and interrupted batches, bad
arguments to compaction and pauses, bad configurations, freed blocks in `with`, exceptions from
`__index__`, out-of-memory retries, and pools used in a child process after `fork()`."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import warnings

import pytest

import npumem

MIB = 1 << 20
COUNTERS = ("alloc_count", "free_count", "peak_bytes_in_use", "bytes_in_use", "blocks_in_use")


def counters(pool: npumem.Pool) -> dict[str, int]:
    s = pool.stats()
    return {k: getattr(s, k) for k in COUNTERS}


def test_failed_alloc_many_leaves_the_counters_unchanged() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    keep = pool.alloc(100)
    before = counters(pool)
    failed_before = pool.stats().failed_allocs
    with pytest.raises(npumem.OutOfMemoryError, match=r"item 1[56]"):
        pool.alloc_many([MIB] * 40)
    assert counters(pool) == before
    assert pool.stats().failed_allocs == failed_before + 1
    # Small blocks (slab objects) too.
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc_many([64] * 1000 + [16 * MIB])
    assert counters(pool) == before
    pool.check()
    keep.free()
    assert len(pool.alloc_many([MIB] * 15)) == 15


def test_keyboard_interrupt_during_alloc_many_leaves_nothing_allocated() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled on the main thread")
    pool = npumem.Pool(1 << 30, cores=1, backing="none")
    count = 25_000  # some 20 ms of work: the timer below lands anywhere in it
    started = time.perf_counter()
    blocks = pool.alloc_many([64] * count)
    took = time.perf_counter() - started
    del blocks  # its blocks free themselves
    # To the main thread itself: a signal sent to the process may land on another thread, and
    # then nothing wakes the main thread's sleep below before it ends.
    main = threading.main_thread().ident
    assert main is not None
    # Python's own handler: a process started in the background by a shell without job
    # control inherits SIGINT ignored, and Python then installs no handler for it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # No collection while the signal may arrive: a handler that runs inside a gc callback (the
    # hypothesis plugin registers one) raises its KeyboardInterrupt there, where Python reports
    # it as unraisable and drops it.
    collecting = gc.isenabled()
    gc.disable()
    # Ctrl-C at moments spread over the whole call: while the blocks are allocated (the batch
    # rolls back), while they become Python objects (those made free themselves, the rest are
    # freed), and after the list reached the caller.
    tries = 60
    try:
        for k in range(tries):
            timer = threading.Timer(
                took * 1.2 * k / tries, signal.pthread_kill, (main, signal.SIGINT)
            )
            with pytest.raises(KeyboardInterrupt):
                timer.start()
                pool.alloc_many([64] * count)
                # The batch finished before the signal: wait for it here, in a loop (the
                # interpreter runs a handler that came during the list's release at the
                # loop's next turn, not before a single long sleep).
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    time.sleep(0.001)
            timer.join()
            assert pool.stats().blocks_in_use == 0, f"Ctrl-C after {k}/{tries} of the call"
    finally:
        signal.signal(signal.SIGINT, previous)
        if collecting:
            gc.enable()
    pool.check()


def test_ctrl_c_while_another_thread_pauses_the_pool_strands_the_batchs_frees() -> None:
    # Ctrl-C after the batch was allocated, while its blocks become Python objects, with
    # another thread's pause holding the pool past its timeout: the blocks not made into
    # objects yet cannot be freed then. They wait in the stranded frees, as the frees of the
    # objects already made do, and go at the next flush: nothing leaks.
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled on the main thread")
    pool = npumem.Pool(1 << 30, cores=1, backing="none")
    count = 200_000
    resume = threading.Event()
    pausers: list[threading.Thread] = []
    paused: list[bool] = []

    def pause_for_a_while(held: threading.Event) -> None:
        try:
            pause = pool.pause(timeout=0.05)
        except npumem.PoolBusyError:  # the batch was still being allocated
            held.set()
            return
        paused.append(True)
        held.set()
        resume.wait(10)
        pause.resume()

    def on_alarm(*_: object) -> None:
        # Polled every millisecond (signals run between steps of the call) until every block
        # of the batch is allocated; then paused by another thread, and interrupted.
        if pool.stats().blocks_in_use == count:
            held = threading.Event()
            pauser = threading.Thread(target=pause_for_a_while, args=(held,))
            pauser.start()
            held.wait(10)
            pausers.append(pauser)
            if paused:
                raise KeyboardInterrupt
        signal.setitimer(signal.ITIMER_REAL, 0.001)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    collecting = gc.isenabled()
    gc.disable()
    interrupted = 0
    try:
        for _ in range(5):
            signal.setitimer(signal.ITIMER_REAL, 0.001)
            try:
                blocks = pool.alloc_many([64] * count)
            except KeyboardInterrupt:
                interrupted += 1
            else:
                del blocks  # finished before the pause: try again
            signal.setitimer(signal.ITIMER_REAL, 0)
            resume.set()
            for pauser in pausers:
                pauser.join()
            pausers.clear()
            paused.clear()
            resume.clear()
            s = pool.stats()  # flushes the stranded frees
            assert (s.blocks_in_use, s.bytes_in_use, s.deferred_pending) == (0, 0, 0), s
            assert s.alloc_count == s.free_count
            pool.check()
            if interrupted:
                break
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resume.set()
        if collecting:
            gc.enable()
    assert interrupted, "no try was interrupted while the pool was paused"


def test_an_alarm_while_free_many_reads_a_long_list_frees_nothing() -> None:
    # The list is read with signals checked now and then: a handler that raises while it is
    # read (before any free) leaves every block allocated; one that comes later finds the batch
    # freed whole. Alarms at moments spread over the call, until one stopped it.
    pool = npumem.Pool(1 << 30, cores=1, backing="none")
    count = 300_000
    blocks = pool.alloc_many([64] * count)
    started = time.perf_counter()
    pool.free_many(blocks)
    took = time.perf_counter() - started

    class Alarm(Exception):
        pass

    def on_alarm(*_: object) -> None:
        raise Alarm

    previous = signal.signal(signal.SIGALRM, on_alarm)
    collecting = gc.isenabled()
    gc.disable()  # no handler run inside a gc callback (see the alloc_many test above)
    stopped = 0
    tries = 40
    try:
        blocks = pool.alloc_many([64] * count)
        for k in range(1, tries + 1):
            before = counters(pool)
            with pytest.raises(Alarm):
                signal.setitimer(signal.ITIMER_REAL, took * k / tries)
                pool.free_many(blocks)
                # The batch finished before the alarm: wait for it here.
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    time.sleep(0.001)
            signal.setitimer(signal.ITIMER_REAL, 0)
            if any(b.alive for b in blocks):
                # Stopped: nothing freed, every block usable.
                assert all(b.alive for b in blocks), f"alarm after {k}/{tries} of the call"
                assert counters(pool) == before
                stopped += 1
                break
            assert pool.stats().blocks_in_use == 0, f"alarm after {k}/{tries} of the call"
            blocks = pool.alloc_many([64] * count)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if collecting:
            gc.enable()
    assert stopped, "no alarm came while the list was read"
    pool.free_many(blocks)
    assert pool.stats().blocks_in_use == 0
    pool.check()


def test_ctrl_c_inside_free_manys_generator_frees_nothing() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blocks = pool.alloc_many([100] * 10)

    def interrupted_after_five() -> object:
        yield from blocks[:5]
        raise KeyboardInterrupt

    before = counters(pool)
    with pytest.raises(KeyboardInterrupt):
        pool.free_many(interrupted_after_five())
    assert counters(pool) == before
    assert all(b.alive for b in blocks)
    pool.free_many(iter(blocks))
    assert pool.stats().blocks_in_use == 0
    pool.check()


def test_pause_refuses_a_bool_timeout() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    with pytest.raises(npumem.ArgumentTypeError, match="bool"):
        pool.pause(True)  # type: ignore[arg-type]
    pool.alloc(64).free()  # not paused


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"mode": 5}, npumem.ArgumentTypeError),
        ({"mode": b"full"}, npumem.ArgumentTypeError),
        ({"mode": "sideways"}, npumem.InvalidArgumentError),
        ({"mode": "incremental"}, npumem.InvalidArgumentError),
        ({"mode": "incremental", "max_bytes": -1}, npumem.InvalidArgumentError),
        ({"mode": "incremental", "max_bytes": "x"}, npumem.ArgumentTypeError),
        ({"mode": "evacuate", "chunks": [2**70]}, npumem.InvalidArgumentError),
        ({"mode": "evacuate", "chunks": ["a"]}, npumem.ArgumentTypeError),
        ({"mode": "evacuate", "chunks": 3}, npumem.ArgumentTypeError),
    ],
)
def test_compaction_calls_raise_typed_errors(kwargs: dict, error: type[Exception]) -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blocks = [pool.alloc(100_000) for _ in range(20)]
    with pytest.raises(error):
        pool.plan_compaction(**kwargs)
    with pool.pause() as pause, pytest.raises(error):
        pool.compact_step(pause, **kwargs)
    assert all(b.alive for b in blocks)
    pool.check()


@pytest.mark.parametrize(
    ("capacity", "kwargs", "field"),
    [
        (16 * MIB, {"slab_sizes": {64: 1}}, "slab_sizes"),
        (16 * MIB, {"slab_sizes": {64, 128}}, "slab_sizes"),
        (16 * MIB, {"alignment": 2**30}, "alignment"),
        (100, {}, "capacity"),
        (255, {"cores": 1}, "capacity"),
    ],
)
def test_bad_configurations_are_refused(capacity: int, kwargs: dict, field: str) -> None:
    with pytest.raises(npumem.ConfigError, match=field):
        npumem.Pool(capacity, **kwargs)


def test_with_on_a_freed_block_raises() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    block = pool.alloc(100)
    block.free()
    with pytest.raises(npumem.InvalidHandleError), block:
        pass
    with pool.alloc(100) as live:
        assert live.alive


class Interrupting:
    def __index__(self) -> int:
        raise KeyboardInterrupt


class Broken:
    def __index__(self) -> int:
        raise ValueError("broken __index__")


@pytest.mark.parametrize("value", [Interrupting(), Broken()])
def test_exceptions_raised_inside_index_propagate(value: object) -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    expected = KeyboardInterrupt if isinstance(value, Interrupting) else ValueError
    with pytest.raises(expected):
        pool.alloc(value)  # type: ignore[arg-type]
    with pytest.raises(expected):
        pool.alloc(64, align=value)  # type: ignore[arg-type]
    with pytest.raises(expected):
        npumem.Pool(value)  # type: ignore[arg-type]
    assert pool.stats().blocks_in_use == 0


def test_a_failed_retry_counts_one_failure() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    calls = []
    pool.set_oom_handler(lambda n: calls.append(n) or True)
    big = pool.alloc(15 * MIB)
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(15 * MIB)
    assert calls == [15 * MIB]
    assert pool.stats().failed_allocs == 1
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc_many([8 * MIB, 8 * MIB])
    assert pool.stats().failed_allocs == 2
    big.free()
    # A retry that succeeds counts none.
    hog = pool.alloc(15 * MIB)
    pool.set_oom_handler(lambda n: hog.free() or True)
    pool.alloc(15 * MIB).free()
    assert pool.stats().failed_allocs == 2


FORKED = "forked while another thread was inside a call of this pool"


def fork_quietly() -> int:
    """`os.fork()` without Python's warning that the process has other threads."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def in_child(pool: npumem.Pool, body: object) -> int:
    """Fork; the child runs `body(pool)` and exits 0 when it returns, 3 when it raises (with
    the exception on stderr). Returns the child's exit code, after at most 60 s."""
    pid = fork_quietly()
    if pid == 0:  # the child: only this thread exists
        code = 0
        try:
            body(pool)  # type: ignore[operator]
        except BaseException as exc:
            print(f"child: {type(exc).__name__}: {exc!r}", file=sys.stderr)
            code = 3
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the child hung")


def refuses_at_once(pool: npumem.Pool) -> None:
    """Every call that needs the pool raises PoolBusyError naming the fork, without waiting;
    stats stay readable."""
    started = time.monotonic()
    calls = {
        "alloc": lambda: pool.alloc(4096),
        "alloc_many": lambda: pool.alloc_many([64, 4096]),
        "check": pool.check,
        "snapshot": pool.snapshot,
        "pause": lambda: pool.pause(timeout=5),
        "trim": pool.trim,
    }
    for name, call in calls.items():
        try:
            call()
        except npumem.PoolBusyError as exc:
            assert FORKED in str(exc), f"{name}: {exc}"
        else:
            raise AssertionError(f"{name} ran on a pool torn by the fork")
    assert pool.stats().capacity == pool.capacity
    assert time.monotonic() - started < 2, "a refused call waited"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_refuses_a_pool_that_a_parent_thread_was_inside_at_the_fork() -> None:
    # A growth hook holds its thread inside the allocation that grows the pool.
    inside, leave = threading.Event(), threading.Event()

    def on_grow(offset: int, nbytes: int) -> None:
        inside.set()
        leave.wait(30)

    pool = npumem.Pool(
        4 * MIB, cores=1, backing="none", max_capacity=64 * MIB, grow_by=4 * MIB, on_grow=on_grow
    )
    other = npumem.Pool(4 * MIB, cores=1, backing="none")
    kept = pool.alloc_many([MIB] * 3)
    grower = threading.Thread(target=lambda: kept.append(pool.alloc(2 * MIB)))
    grower.start()
    try:
        assert inside.wait(30)
        assert in_child(pool, refuses_at_once) == 0
        # A pool no parent thread was using at the fork works in the child.
        assert in_child(other, lambda p: (p.free_many(p.alloc_many([4096] * 100)), p.check())) == 0
    finally:
        leave.set()
        grower.join()
    # The parent's pool is whole.
    assert len(kept) == 4
    pool.free_many(kept)
    assert pool.check() == 0
    assert pool.stats().bytes_in_use == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_does_not_wait_for_a_pause_that_a_parent_thread_was_taking_at_the_fork() -> None:
    # A held pause keeps the gate closed; a second thread's check() then takes the pausers'
    # lock and waits for the gate. In a child forked then, that lock's holder does not exist.
    pool = npumem.Pool(16 * MIB, cores=1, backing="none")
    held = pool.pause(timeout=30)
    calling = threading.Event()
    checked: list[int] = []

    def check() -> None:
        calling.set()
        checked.append(pool.check())

    checking = threading.Thread(target=check)
    checking.start()
    try:
        assert calling.wait(30)
        time.sleep(0.2)  # check() is waiting for the held pause, with the lock (without the GIL)
        assert in_child(pool, refuses_at_once) == 0
    finally:
        held.resume()
        checking.join()
    assert checked == [0], "the parent's check() ran once the pause ended"
    assert pool.check() == 0


HELD_AT_FORK = "forked while another thread held a pause of this pool"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_gives_up_on_a_pause_a_parent_thread_held_at_the_fork_after_its_timeout() -> None:
    # A thread of the parent holds a pause (timeout 1 s) at the fork and does not exist in the
    # child: every call there that waits for the pause gives up after that pause's timeout,
    # not its own longer one (check() and snapshot() waited 10 s), and says why.
    pool = npumem.Pool(4 * MIB, cores=1, backing="none")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with pool.pause(timeout=1.0):
            held.set()
            release.wait(60)

    def gives_up(p: npumem.Pool) -> None:
        calls = {
            "alloc": lambda: p.alloc(4096),
            "check": p.check,
            "snapshot": p.snapshot,
            "pause": lambda: p.pause(timeout=30),
        }
        for name, call in calls.items():
            started = time.monotonic()
            try:
                call()
            except npumem.PoolBusyError as exc:
                assert HELD_AT_FORK in str(exc), f"{name}: {exc}"
            else:
                raise AssertionError(f"{name} ran while the parent's pause held the pool")
            waited = time.monotonic() - started
            assert 0.9 <= waited < 5, f"{name} waited {waited:.2f} s"
        assert p.stats().capacity == p.capacity

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        assert in_child(pool, gives_up) == 0
    finally:
        release.set()
        holder.join()
    pool.free(pool.alloc(4096))
    assert pool.check() == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_s_flush_of_deferred_frees_says_that_a_parent_thread_held_the_pause() -> None:
    # The flush waits out the pause once (not once for the batch and once per block), keeps
    # the frees queued for a later flush, and raises the pause's PoolBusyError.
    pool = npumem.Pool(4 * MIB, cores=1, backing="none")
    blocks = [pool.alloc(4096) for _ in range(3)]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with pool.pause(timeout=1.0):
            held.set()
            release.wait(60)

    def flush_gives_up(p: npumem.Pool) -> None:
        for blk in blocks:
            p.defer_free(blk)
        started = time.monotonic()
        with pytest.raises(npumem.PoolBusyError, match=HELD_AT_FORK):
            p.flush_deferred()
        waited = time.monotonic() - started
        assert 0.9 <= waited < 1.9, f"flush_deferred waited {waited:.2f} s"
        assert p.stats().deferred_pending == 3

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        assert in_child(pool, flush_gives_up) == 0
    finally:
        release.set()
        holder.join()
    assert pool.stats().blocks_in_use == pool.check() == 3  # the parent's blocks, untouched
    pool.free_many(blocks)
    assert pool.check() == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_pause_the_forking_thread_holds_goes_on_in_the_child() -> None:
    pool = npumem.Pool(4 * MIB, cores=1, backing="none")
    pause = pool.pause(timeout=1.0)

    def resumes(p: npumem.Pool) -> None:
        p.free(p.alloc(4096))  # the holder may use the pool
        pause.resume()
        assert p.check() == 0

    try:
        assert in_child(pool, resumes) == 0
    finally:
        pause.resume()
    assert pool.check() == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_either_uses_or_refuses_a_pool_its_parent_was_busy_with() -> None:
    # Threads churn while the main thread forks: a child whose fork found one of them inside a
    # call refuses the pool; any other child uses it, and its pool passes check().
    pool = npumem.Pool(64 * MIB, cores=2, backing="none")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            blocks = pool.alloc_many([4096] * 256)
            pool.free_many(blocks)

    def use_or_refuse(p: npumem.Pool) -> None:
        try:
            p.check()
        except npumem.PoolBusyError as exc:
            assert FORKED in str(exc), str(exc)
            refuses_at_once(p)
            os._exit(10)
        # Blocks the parent's threads held at the fork stay live here (their lists were copied).
        live = p.check()
        p.free_many(p.alloc_many([4096] * 100))
        assert p.check() == live

    workers = [threading.Thread(target=churn) for _ in range(3)]
    for w in workers:
        w.start()
    codes = []
    try:
        for _ in range(10):
            time.sleep(0.01)
            codes.append(in_child(pool, use_or_refuse))
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert set(codes) <= {0, 10}, codes
    pool.check()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_refuses_a_kv_cache_a_parent_thread_was_inside_at_the_fork() -> None:
    from kv_helpers import SHAPE
    from npumem.kv import KVCache

    # A device pool's cache calls its mover under its mutex: one that blocks holds a thread
    # inside the cache (not inside the pool) at the fork.
    inside, leave = threading.Event(), threading.Event()

    def mover(transfers: object) -> None:
        inside.set()
        leave.wait(30)

    pool = npumem.Pool(4 * MIB, cores=1, backing="none")
    cache = KVCache(pool, page_tokens=4, capacity_tokens=64, mover=mover, **SHAPE)
    cache.add_sequence(0, num_tokens=2)
    cache.fork(0, 1)
    copying = threading.Thread(target=cache.append, args=(1,))  # copies the shared last page
    copying.start()

    def refuses(p: npumem.Pool) -> None:
        started = time.monotonic()
        for call in (lambda: cache.append(0), cache.stats):
            with pytest.raises(npumem.PoolBusyError, match="inside a call of this KV cache"):
                call()
        assert time.monotonic() - started < 10, "each call gives up after a second"
        assert cache.closed is False, "a flag read without the cache's mutex"
        # The pool itself was not in use: it works.
        p.free(p.alloc(4096))
        p.check()

    try:
        assert inside.wait(30)
        assert in_child(pool, refuses) == 0
    finally:
        leave.set()
        copying.join()
    assert cache.num_tokens(1) == 3
    # A cache no parent thread was inside works in the child.
    assert in_child(pool, lambda p: cache.append(0)) == 0
