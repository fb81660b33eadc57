"""The demo workload: worker threads on every core allocate and free blocks of mixed sizes on a
host-backed pool (small descriptors, activations, occasional large buffers), write and verify
every block's bytes, hand blocks to each other so frees are remote, then report the pool."""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

import npumem

__all__ = ["DemoResult", "run_demo"]

MIB = 1 << 20


@dataclass
class DemoResult:
    """What a demo run did and what the pool looked like at its peak and at the end."""

    threads: int
    operations: int
    allocations: int
    failed_allocations: int
    seconds: float
    peak_bytes_in_use: int
    peak_fragmentation: float
    final: npumem.PoolStats
    checked_blocks: int
    samples: list[tuple[float, int, float]] = field(default_factory=list)

    @property
    def allocations_per_second(self) -> float:
        return self.allocations / self.seconds if self.seconds > 0 else 0.0


def _size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.55:
        return rng.randint(16, 4096)  # descriptors, small tensors
    if r < 0.90:
        return rng.randint(4097, 512 << 10)  # activations
    if r < 0.99:
        return rng.randint(512 << 10, 2 * MIB)  # feature maps
    return rng.randint(2 * MIB, 24 * MIB)  # a large buffer now and then


def run_demo(
    *,
    capacity: int = 512 * MIB,
    threads: int | None = None,
    operations: int = 20_000,
    seed: int = 0,
) -> DemoResult:
    """Run the workload; `operations` is per thread."""
    threads = threads or max(2, os.cpu_count() or 2)
    pool = npumem.Pool(capacity, cores=threads, name="demo")
    mailboxes: list[list[tuple[npumem.Block, int]]] = [[] for _ in range(threads)]
    locks = [threading.Lock() for _ in range(threads)]
    failures = [0] * threads
    allocations = [0] * threads
    errors: list[BaseException] = []
    samples: list[tuple[float, int, float]] = []
    stop_sampling = threading.Event()
    start = time.perf_counter()

    def sampler() -> None:
        while not stop_sampling.wait(0.02):
            s = pool.stats()
            samples.append((time.perf_counter() - start, s.bytes_in_use, s.external_fragmentation))

    def verify_and_free(blk: npumem.Block, pattern: int) -> None:
        view = memoryview(blk)
        ok = view[0] == pattern and view[-1] == pattern and view[len(view) // 2] == pattern
        view.release()
        if not ok:
            raise AssertionError(f"block at offset {blk.offset} lost its bytes")
        blk.free()

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        held: list[tuple[npumem.Block, int]] = []
        try:
            for op in range(operations):
                r = rng.random()
                if not held or (r < 0.5 and len(held) < 48):
                    try:
                        blk = pool.alloc(_size(rng), tag=f"worker-{index}")
                    except npumem.OutOfMemoryError:
                        failures[index] += 1
                        continue
                    allocations[index] += 1
                    pattern = (op % 250) + 1
                    view = memoryview(blk)
                    view[0] = view[-1] = view[len(view) // 2] = pattern
                    view.release()
                    held.append((blk, pattern))
                elif r < 0.7:
                    target = rng.randrange(threads)
                    with locks[target]:
                        mailboxes[target].append(held.pop(rng.randrange(len(held))))
                else:
                    verify_and_free(*held.pop(rng.randrange(len(held))))
                    with locks[index]:
                        received, mailboxes[index] = mailboxes[index], []
                    for item in received:
                        verify_and_free(*item)
            for item in held:
                verify_and_free(*item)
        except BaseException as exc:
            errors.append(exc)

    sampling = threading.Thread(target=sampler, daemon=True)
    sampling.start()
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for index in range(threads):
        for item in mailboxes[index]:
            verify_and_free(*item)
    seconds = time.perf_counter() - start
    stop_sampling.set()
    sampling.join()
    if errors:
        raise errors[0]
    checked = pool.check()
    final = pool.stats()
    return DemoResult(
        threads=threads,
        operations=operations * threads,
        allocations=sum(allocations),
        failed_allocations=sum(failures),
        seconds=seconds,
        peak_bytes_in_use=final.peak_bytes_in_use,
        peak_fragmentation=max((f for _, _, f in samples), default=0.0),
        final=final,
        checked_blocks=checked,
        samples=samples,
    )
