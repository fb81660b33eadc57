"""Many Python threads allocate mixed sizes, fill every block with its own pattern, pass blocks
to each other (so most frees are remote, from another thread and often another core), check the
pattern at free, and check every live block against every other for overlap at checkpoints. At
the end every byte is free and check() passes. Sized for a 2-core CI machine."""

from __future__ import annotations

import itertools
import os
import queue
import threading

import numpy as np

import npumem

MIB = 1 << 20
THREADS = 4
OPS = 8000 if os.environ.get("CI") else 3000


def test_threads_remote_frees_patterns_and_overlap() -> None:
    pool = npumem.Pool(96 * MIB, cores=2, core_reserve=0)
    mailboxes: list[queue.SimpleQueue[tuple[npumem.Block, int]]] = [
        queue.SimpleQueue() for _ in range(THREADS)
    ]
    registry_lock = threading.Lock()
    live: dict[int, tuple[int, int]] = {}  # id(block) -> (offset, block_bytes)
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def fill(blk: npumem.Block, pattern: int) -> None:
        np.frombuffer(blk, dtype=np.uint8)[:] = pattern

    def verify_and_free(blk: npumem.Block, pattern: int) -> None:
        data = np.frombuffer(blk, dtype=np.uint8)
        bad = np.flatnonzero(data != pattern)
        assert bad.size == 0, f"block at {blk.offset}: {bad.size} bytes corrupted"
        del data
        with registry_lock:
            live.pop(id(blk))
        blk.free()

    def checkpoint() -> None:
        with registry_lock:
            extents = sorted(live.values())
        for (a_off, a_len), (b_off, _) in itertools.pairwise(extents):
            assert a_off + a_len <= b_off, f"blocks at {a_off} (+{a_len}) and {b_off} overlap"

    def worker(index: int) -> None:
        try:
            rng = np.random.default_rng(1000 + index)
            mine: list[tuple[npumem.Block, int]] = []
            for op in range(OPS):
                r = rng.random()
                if r < 0.5:
                    kind = rng.random()
                    if kind < 0.4:
                        size = int(rng.integers(1, 4097))
                    elif kind < 0.8:
                        size = int(rng.integers(4097, 256 << 10))
                    elif kind < 0.97:
                        size = int(rng.integers(256 << 10, MIB))
                    else:
                        size = int(rng.integers(MIB, 6 * MIB))
                    try:
                        blk = pool.alloc(size, tag=f"t{index}")
                    except npumem.OutOfMemoryError:
                        continue
                    with registry_lock:
                        live[id(blk)] = (blk.offset, blk.block_bytes)
                    pattern = (index * 37 + op) % 255 + 1
                    fill(blk, pattern)
                    mine.append((blk, pattern))
                elif r < 0.75:
                    if mine:
                        mailboxes[int(rng.integers(THREADS))].put(
                            mine.pop(int(rng.integers(len(mine))))
                        )
                else:
                    while True:
                        try:
                            blk, pattern = mailboxes[index].get_nowait()
                        except queue.Empty:
                            break
                        verify_and_free(blk, pattern)
                if op % 200 == 0:
                    checkpoint()
            barrier.wait()
            for blk, pattern in mine:
                verify_and_free(blk, pattern)
            barrier.wait()
            while True:
                try:
                    blk, pattern = mailboxes[index].get_nowait()
                except queue.Empty:
                    break
                verify_and_free(blk, pattern)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert not live
    assert pool.check() == 0
    s = pool.stats()
    assert s.bytes_in_use == 0 and s.alloc_count == s.free_count > 0
    assert s.largest_free_block == 96 * MIB, "every byte free and merged back"
