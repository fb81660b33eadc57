"""A free that waits for another thread's pause (without the GIL) owns its block meanwhile: a
detach, a deferral, a pin or a second free of the block on another thread is refused with a
typed error, and exactly one call takes the block. A free that fails in the end (the block is
pinned by a view) leaves the block owned again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

import npumem

MIB = 1 << 20


def _wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.001)
    return condition()


def _free_during_a_pause(
    pool: npumem.Pool, block: npumem.Block, first: str, second: Callable[[], object]
) -> tuple[dict[str, object], object]:
    """Hold a pause on one thread, free `block` (`first`: "free" or "free_many") on a second,
    which waits for the pause; once that free has claimed the block (the block is no longer
    alive to its object), run `second` here. Returns the free's outcome and `second`'s (its
    result, or the exception it raised)."""
    outcome: dict[str, object] = {}
    paused, resume = threading.Event(), threading.Event()

    def pauser() -> None:
        with pool.pause(timeout=10.0):
            paused.set()
            resume.wait(10.0)

    def freer() -> None:
        try:
            if first == "free":
                block.free()
            else:
                pool.free_many([block])
            outcome["free"] = "ok"
        except npumem.NpumemError as err:
            outcome["free"] = err

    holder = threading.Thread(target=pauser)
    holder.start()
    assert paused.wait(10.0)
    freeing = threading.Thread(target=freer)
    freeing.start()
    claimed = _wait_until(lambda: not block.alive)
    try:
        result: object = second()
    except npumem.NpumemError as err:
        result = err
    resume.set()
    holder.join(10.0)
    freeing.join(10.0)
    assert not holder.is_alive() and not freeing.is_alive()
    assert claimed, "the waiting free claims the block before it waits"
    return outcome, result


@pytest.mark.parametrize("first", ["free", "free_many"])
@pytest.mark.parametrize(
    ("second", "refused_as"),
    [
        ("detach", npumem.InvalidHandleError),
        ("defer_free", npumem.DoubleFreeError),
        ("pin", npumem.InvalidHandleError),
        ("free", npumem.DoubleFreeError),
        ("free_many", npumem.DoubleFreeError),
    ],
)
def test_a_call_on_a_block_whose_free_waits_for_a_pause_is_refused(
    first: str, second: str, refused_as: type[npumem.NpumemError]
) -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    block = pool.alloc(3 * MIB)
    calls: dict[str, Callable[[], object]] = {
        "detach": block.detach,
        "defer_free": lambda: pool.defer_free(block),
        "pin": block.pin,
        "free": block.free,
        "free_many": lambda: pool.free_many([block]),
    }
    outcome, result = _free_during_a_pause(pool, block, first, calls[second])
    assert outcome["free"] == "ok", outcome
    assert isinstance(result, refused_as), result
    assert "being freed by another call" in str(result), result
    # Nothing is left queued or handed on: the flush finds nothing, the pool holds nothing.
    assert pool.flush_deferred() == 0
    stats = pool.stats()
    assert (stats.blocks_in_use, stats.bytes_in_use) == (0, 0)
    assert not block.alive
    with pytest.raises(npumem.DoubleFreeError):
        block.free()
    pool.check()


@pytest.mark.parametrize("first", ["free", "free_many"])
def test_a_free_that_fails_after_waiting_leaves_the_block_owned(first: str) -> None:
    # A view pins the block: the free waits for the pause, then is refused for the pin, and
    # the block is owned again (the detach during the wait was refused).
    pool = npumem.Pool(16 * MIB, cores=1)
    block = pool.alloc(3 * MIB)
    view = memoryview(block)
    outcome, result = _free_during_a_pause(pool, block, first, block.detach)
    assert isinstance(outcome["free"], npumem.PinnedBlockError), outcome
    assert isinstance(result, npumem.InvalidHandleError), result
    assert block.alive
    view.release()
    handle = block.detach()
    pool.adopt(handle).free()
    assert pool.stats().blocks_in_use == 0
    pool.check()
