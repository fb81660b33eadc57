"""Every allocation traced with ``stacks=True`` reaches a drain with its stack, also when the
drain runs on another thread while the allocating thread is between its allocation and the
recording of its stack (without the GIL, or running a collector callback)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import npumem


@pytest.fixture
def collector_gives_up_the_gil() -> Iterator[None]:
    """A collection after almost every object made, and a callback that sleeps in it: the
    allocating thread lets other threads run in the middle of making its blocks."""

    def nap(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            time.sleep(0.0002)

    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(nap)
    try:
        yield
    finally:
        gc.callbacks.remove(nap)
        gc.set_threshold(*threshold)


def _drain_while(
    allocate: Callable[[npumem.Pool], list[npumem.Block]], rounds: int
) -> tuple[int, int]:
    """Allocate (and free) `rounds` times on one thread while another drains; the alloc events
    drained, and those without a stack."""
    pool = npumem.Pool(64 << 20, cores=2)
    pool.trace_start(1 << 16, stacks=True)
    done = threading.Event()
    seen = [0, 0]

    def take(events: list[tuple[object, ...]]) -> None:
        for e in events:
            if e[1] == "alloc":
                seen[0] += 1
                seen[1] += e[8] is None

    def drainer() -> None:
        while not done.is_set():
            take(pool.trace_drain())

    thread = threading.Thread(target=drainer)
    thread.start()
    try:
        for _ in range(rounds):
            for block in allocate(pool):
                block.free()
    finally:
        done.set()
        thread.join()
    take(pool.trace_drain())
    pool.check()
    return seen[0], seen[1]


@pytest.mark.usefixtures("collector_gives_up_the_gil")
@pytest.mark.parametrize(
    "allocate",
    [
        pytest.param(lambda pool: pool.alloc_many([4096] * 20), id="alloc_many"),
        pytest.param(lambda pool: [pool.alloc(4096) for _ in range(20)], id="alloc"),
    ],
)
def test_a_drain_on_another_thread_gets_every_stack(
    allocate: Callable[[npumem.Pool], list[npumem.Block]],
) -> None:
    allocs, missing = _drain_while(allocate, rounds=150)
    assert allocs == 150 * 20
    assert missing == 0, f"{missing} of {allocs} alloc events drained without their stack"


def test_a_drain_inside_an_allocation_does_not_wait_for_it() -> None:
    """A collector callback that drains while its own thread is making the blocks of an
    `alloc_many` (inside the recording) returns at once, without those blocks' stacks."""
    pool = npumem.Pool(64 << 20, cores=2)
    pool.trace_start(1 << 16, stacks=True)
    drained: list[float] = []

    def drain_here(phase: str, _info: dict[str, int]) -> None:
        if phase == "start" and len(drained) < 5:
            start = time.monotonic()
            pool.trace_drain()
            drained.append(time.monotonic() - start)

    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(drain_here)
    try:
        blocks = pool.alloc_many([4096] * 50)
    finally:
        gc.callbacks.remove(drain_here)
        gc.set_threshold(*threshold)
    pool.free_many(blocks)
    assert drained, "the collector ran while the blocks were made"
    assert max(drained) < 2.0, f"a drain inside the allocation waited {max(drained):.1f} s"


def test_a_drain_under_its_own_pause_does_not_wait_for_allocations_held_by_it() -> None:
    """An allocation that began recording and then waits at the pool's entry for the pause the
    draining thread holds: the drain returns at once instead of waiting for it."""
    pool = npumem.Pool(64 << 20, cores=2)
    pool.trace_start(1 << 16, stacks=True)
    kept = pool.alloc(4096)
    with pool.pause(timeout=20):
        waiting = threading.Thread(target=lambda: pool.alloc_many([4096] * 4))
        waiting.start()
        time.sleep(0.2)  # the other thread is at the pool's entry, inside its recording
        start = time.monotonic()
        events = pool.trace_drain()
        took = time.monotonic() - start
        assert any(e[1] == "alloc" and e[8] is not None for e in events), "the earlier stack"
    waiting.join()
    assert took < 2.0, f"the drain waited {took:.1f} s for an allocation its own pause holds"
    kept.free()
    pool.trace_stop()
