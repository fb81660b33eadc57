"""The KV cache from many threads: each thread's sequences stay exact, pages are never handed out
twice, and everything goes back to the pool."""

from __future__ import annotations

import gc
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import npumem
from kv_helpers import SHAPE, make_cache
from npumem.kv import KVCache


@pytest.mark.parametrize("capacity", [4096, None])
def test_threads_share_one_cache(capacity: int | None) -> None:
    cache = make_cache(capacity_tokens=capacity, pool_bytes=8 << 20)
    threads, rounds, errors = 4, 150, []
    cache.add_sequence(-1, num_tokens=6)  # a shared prompt every thread forks from
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            start.wait()
            mine = [t * 1000 + i for i in range(4)]
            for i, s in enumerate(mine):
                if i % 2:
                    cache.fork(-1, s)
                else:
                    cache.add_sequence(s, num_tokens=i)
            for r in range(rounds):
                cache.append(mine[r % 4])
                cache.append_many(mine, 1)
                if r % 50 == 49:
                    s = mine[r % 4]
                    cache.free_sequence(s)
                    cache.fork(-1, s)
            for s in mine:
                table = cache.block_table(s)
                assert len(table) == -(-cache.num_tokens(s) // cache.page_tokens)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = cache.pool
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    s = cache.stats()
    assert s.sequences == threads * 4 + 1
    owned: dict[int, int] = {}
    for seq in cache.sequences():
        for off in cache.block_table(seq).tolist():
            owned[off] = owned.get(off, 0) + 1
    assert len(owned) == s.pages_in_use
    assert sorted(r for _, r in cache.pages() if r) == sorted(owned.values())
    for seq in cache.sequences():
        cache.free_sequence(seq)
    assert cache.stats().pages_in_use == 0
    cache.close()
    pool.check()
    assert pool.stats().bytes_in_use == 0


def test_threads_running_out_of_pages_change_nothing() -> None:
    cache = make_cache(capacity_tokens=64)  # 16 pages
    failures = []

    def work(t: int) -> None:
        for i in range(200):
            seq = t * 1000 + i
            try:
                cache.add_sequence(seq, num_tokens=8)
            except npumem.OutOfMemoryError:
                failures.append(seq)
                continue
            cache.free_sequence(seq)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    s = cache.stats()
    assert (s.sequences, s.pages_in_use, s.pages_free) == (0, 0, 16)


def test_calling_the_cache_from_its_own_mover_is_refused() -> None:
    pool = npumem.Pool(4 << 20, cores=1, backing="none")
    seen: list[BaseException] = []

    def mover(_: object) -> None:
        try:
            cache.stats()
        except npumem.PoolBusyError as exc:
            seen.append(exc)

    cache = KVCache(pool, page_tokens=4, capacity_tokens=64, mover=mover, **SHAPE)
    cache.add_sequence(0, num_tokens=1)
    cache.fork(0, 1)
    cache.append(1)
    assert len(seen) == 1


@pytest.mark.parametrize("capacity", [4096, None])
def test_page_reads_and_writes_race_frees_of_their_sequence(capacity: int | None) -> None:
    """Threads write and read the pages of sequences that other threads free and add again: a
    page access either finds the sequence's page or is refused (the sequence is gone); it never
    reaches a page the sequence gave up (a write there would land in another sequence's page,
    or keep the page's block pinned so that the free that gave it back failed and the block
    leaked)."""
    cache = make_cache(capacity_tokens=capacity)
    pool = cache.pool
    threads, rounds, errors = 4, 3000, []
    seqs = list(range(8))
    for seq in seqs:
        cache.add_sequence(seq, num_tokens=16)
    page = {seq: bytes([seq + 1]) * cache.page_bytes for seq in seqs}
    # A fresh number for a sequence each time it is freed: a page read that follows a free and
    # an add of its sequence reads a fresh page, whose bytes nobody wrote yet.
    freed = {seq: 0 for seq in seqs}
    numbers = itertools.count(1)

    def work(t: int) -> None:
        for i in range(rounds):
            seq = seqs[(t + i) % len(seqs)]
            try:
                if t % 2:
                    cache.free_sequence(seq)
                    freed[seq] = next(numbers)
                    cache.add_sequence(seq, num_tokens=16)
                    cache.write_page(seq, 0, page[seq])
                else:
                    before = freed[seq]
                    cache.write_page(seq, 0, page[seq])
                    if cache.read_page(seq, 0) != page[seq] and freed[seq] == before:
                        errors.append(f"sequence {seq}: a page with other bytes")
            except (KeyError, npumem.InvalidArgumentError):
                pass  # the sequence was gone or not back yet
            except Exception as exc:  # any other failure is the finding
                errors.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors[:3] == []
    for seq in cache.sequences():
        cache.free_sequence(seq)
    cache.close()
    pool.check()
    assert pool.stats().bytes_in_use == 0


@contextmanager
def one_cpu() -> Iterator[None]:
    """Threads started inside the block run on one CPU (they inherit the starting thread's
    affinity), where contention for the cache and the GIL is the sharpest."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def run_until_each_made(
    calls: int, work: list[Callable[[], object]], within: float = 10.0
) -> list[int]:
    """Run each of `work` in a loop on a thread of its own, all on one CPU, until each made
    `calls` calls or `within` seconds passed; the calls each made."""
    made = [0] * len(work)
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop(i: int) -> None:
        try:
            while not stop.is_set():
                work[i]()
                made[i] += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with one_cpu():
        threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(work))]
        for t in threads:
            t.start()
    deadline = time.monotonic() + within
    while min(made) < calls and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    return made


@pytest.mark.parametrize("capacity", [4096, None])
def test_every_thread_gets_its_turn_at_the_cache(capacity: int | None) -> None:
    """Four threads reading and writing pages all make progress: a thread that finds the cache
    taken waits for its turn, and the one that just had the cache does not take it again ahead
    of the threads waiting for it."""
    cache = make_cache(capacity_tokens=capacity)
    for seq in range(4):
        cache.add_sequence(seq, num_tokens=16)
    data = bytes(cache.page_bytes)

    def reader(seq: int) -> Callable[[], object]:
        return lambda: cache.read_page(seq, 0)

    def writer(seq: int) -> Callable[[], object]:
        return lambda: cache.write_page(seq, 1, data)

    made = run_until_each_made(200, [reader(0), reader(1), writer(2), writer(3)])
    assert min(made) >= 200, f"calls per thread in 10 s: {made}"


def test_stats_wait_for_no_more_than_a_few_calls() -> None:
    """`stats()` while four threads keep the cache busy returns as soon as its turn comes."""
    cache = make_cache(capacity_tokens=None)
    for seq in range(4):
        cache.add_sequence(seq, num_tokens=16)

    def reader(seq: int) -> Callable[[], object]:
        return lambda: cache.read_page(seq, 0)

    made = run_until_each_made(20, [*(reader(seq) for seq in range(4)), cache.stats])
    assert made[4] >= 20, f"stats() calls in 10 s: {made[4]} (page reads: {made[:4]})"


_FINALIZER_CALLS_THE_CACHE = """
import gc, npumem
from npumem.kv import KVCache
pool = npumem.Pool(16 << 20, cores=1)
cache = KVCache(pool, num_layers=2, num_kv_heads=2, head_dim=32, page_tokens=8)
cache.add_sequence(0, 64)
seen = []
class Finalized:
    def __del__(self):
        try:
            cache.stats()
            seen.append("ok")
        except npumem.PoolBusyError as err:
            seen.append("busy: " + str(err))
for seq in range(20):
    gc.collect()
    gc.disable()
    for _ in range(30):
        a = Finalized()
        a.me = a
    del a
    gc.enable()
    gc.set_threshold(1)
    try:
        cache.add_sequence(0, 64)  # refused: the sequence exists; its error is made under the turn
    except npumem.NpumemError:
        pass
    gc.set_threshold(700)
gc.collect()
print(len(seen), sorted(set(seen)))
"""


def test_a_finalizer_that_calls_the_cache_inside_its_own_call_is_refused_not_left_waiting() -> None:
    """The garbage collector may run finalizers on the thread that holds the cache's turn (a
    refused `add_sequence` makes its error under it): a finalizer that calls the cache then is
    refused with `PoolBusyError` instead of waiting for its own thread. Run in a child process,
    so that a wait for itself would end in the timeout, not hang the tests."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FINALIZER_CALLS_THE_CACHE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    count, kinds = done.stdout.strip().split(" ", 1)
    assert int(count) == 600, done.stdout
    assert (
        "busy: the KV cache was called from Python code that one of its own calls runs" in kinds
    ), done.stdout


@pytest.mark.parametrize("capacity_tokens", [None, 64], ids=["on-demand", "reserved"])
@pytest.mark.parametrize("how", ["free_sequence", "close", "collected"])
def test_pages_given_back_during_another_threads_pause_wait_and_are_never_lost(
    capacity_tokens: int | None, how: str
) -> None:
    """A page the cache gives back while another thread pauses the pool past the pause's
    timeout waits in the pool's stranded frees (the call does not wait out the pause) and is
    freed when the pause ends: no byte is lost."""
    pool = npumem.Pool(8 << 20, cores=1)
    cache: KVCache | None = KVCache(
        pool,
        num_layers=2,
        num_kv_heads=1,
        head_dim=8,
        page_tokens=4,
        capacity_tokens=capacity_tokens,
    )
    assert cache is not None
    cache.add_sequence(0, num_tokens=16)
    held, release = threading.Event(), threading.Event()

    def pauser() -> None:
        with pool.pause(0.05):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=pauser)
    thread.start()
    held.wait(10)
    try:
        if how == "free_sequence":
            cache.free_sequence(0)
            assert cache.stats().pages_in_use == 0
        elif how == "close":
            cache.close()
        else:
            cache = None
            gc.collect()
        stats = pool.stats()  # retries the stranded frees, which the pause still refuses
        assert stats.bytes_in_use > 0
        # A reservation keeps its block when a sequence goes: its pages are free inside it.
        keeps_block = how == "free_sequence" and capacity_tokens is not None
        assert stats.deferred_pending == (0 if keeps_block else 1 if capacity_tokens else 4)
    finally:
        release.set()
        thread.join()
    if cache is not None and how == "free_sequence":
        cache.close()
    stats = pool.stats()
    assert (stats.bytes_in_use, stats.deferred_pending) == (0, 0)
    pool.check()
