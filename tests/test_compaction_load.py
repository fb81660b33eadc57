"""Compaction while the runtime keeps running: worker threads allocate, write, check and free
blocks while another thread compacts (incremental steps, now and then a full compaction). No
byte is lost, no block is lost, and check() passes at the end."""

from __future__ import annotations

import random
import threading
import time

import npumem
from compaction_helpers import MIB, fill, intact
from npumem.compaction import Compactor

SIZES = (100, 900, 5000, 30_000, 200_000, 700_000, 3 * MIB)


def test_workers_keep_every_byte_while_a_compactor_runs() -> None:
    pool = npumem.Pool(64 * MIB, cores=2)
    stop = threading.Event()
    errors: list[BaseException] = []
    checked = [0, 0]
    live: list[set[int]] = [set(), set()]

    def worker(index: int) -> None:
        rng = random.Random(index)
        held: list[tuple[npumem.Block, int]] = []
        ident = index << 32
        try:
            while not stop.is_set():
                if len(held) < 120 and rng.random() < 0.6:
                    try:
                        blk = pool.alloc(rng.choice(SIZES))
                    except npumem.OutOfMemoryError:
                        continue
                    ident += 1
                    fill(blk, ident)
                    held.append((blk, ident))
                elif held:
                    blk, i = held.pop(rng.randrange(len(held)))
                    assert intact(blk, i), f"block {i} lost its bytes"
                    checked[index] += 1
                    blk.free()
            live[index] = {blk.handle for blk, _ in held}
            for blk, i in held:
                assert intact(blk, i), f"block {i} lost its bytes"
                blk.free()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            stop.set()

    compactor = Compactor(pool)
    steps = 0
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    # At least 3 s, and on until enough work has overlapped (a loaded machine runs fewer
    # iterations per second); a minute at most.
    start = time.monotonic()

    def running() -> bool:
        elapsed = time.monotonic() - start
        enough = elapsed >= 3.0 and steps >= 10 and sum(checked) > 100
        return not enough and elapsed < 60.0 and not stop.is_set()

    try:
        while running():
            mode = "full" if steps % 8 == 7 else "incremental"
            report = compactor.compact(mode, max_bytes=2 * MIB)
            steps += len(report.steps)
            if steps % 10 == 0:
                pool.check()
            time.sleep(0.002)
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert not errors, errors[0]
    assert steps >= 10 and sum(checked) > 100
    assert sum(r.blocks_moved for r in compactor.reports) > 0, "nothing ever moved"
    assert pool.check() == 0
    stats = pool.stats()
    assert stats.bytes_in_use == 0 and stats.alloc_count == stats.free_count
