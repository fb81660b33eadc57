"""Trace replay: run a recorded trace's allocations and frees against a fresh pool with a chosen
configuration, and report what would happen: which allocations would fail, the peak, the
fragmentation. A what-if tool ("would 20% less memory have been enough?", "does a 1 MiB chunk
size help?").

The replay runs the events in time order on one thread, on a pool without host memory (offsets
only, nothing is touched), pinned to one CPU so every allocation goes to the same core pool and
the outcome is deterministic. The recording may have used several cores: placements then
differ from the recording, the bytes in use at every moment do not.

* an `alloc` is allocated with its size, alignment and tag; if it fails, its later `free`
  is skipped. A request that this pool cannot take at all (a size or an alignment larger than
  its arena, which a smaller `capacity` can make of a recorded one) fails as one with no room
  does: a failure of the replay, not a refusal of the trace;
* a `failed` event is tried again; if it succeeds now it is counted as rescued and freed at
  once (the program gave up on it then);
* a `free` frees the block its handle names; a free of a block allocated before the recording
  began is counted as unmatched and skipped;
* `move` events (compactions) are counted, not replayed.

Once the events are done, every block still live is freed and the pool proves its metadata
consistent (`Pool.check()`, a self-check of the core) when its arena spans at most
`CHECK_CHUNKS` chunks: the check walks every chunk, which takes seconds from a few TiB on.
A larger pool checks only that it holds no block any more, which costs next to nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import npumem
from npumem._shown import shown
from npumem.monitor.trace import EVENT_KINDS, Trace

__all__ = ["CHECK_CHUNKS", "ReplayFailure", "ReplayResult", "replay_trace"]

CHECK_CHUNKS = 1 << 16
"""The most chunks (`max_capacity` over `chunk_size`) of a replay's pool that `Pool.check()`
proves consistent at the end: 128 GiB of 2 MiB chunks, checked in about 0.1 s."""

_CONFIG_KEYS = (
    "capacity",
    "cores",
    "chunk_size",
    "min_block",
    "bank_size",
    "alignment",
    "slab_sizes",
    "placement",
    "run_tails",
    "core_reserve",
    "max_capacity",
)


@dataclass(frozen=True)
class ReplayFailure:
    """An allocation that fails in the replay, with the pool's free figures at that moment;
    `recorded_failed`: it failed when recorded too (else it is one the replay would fail)."""

    time_ns: int
    size: int
    tag: str | None
    bytes_free: int
    largest_free_block: int
    recorded_failed: bool = False


@dataclass
class ReplayResult:
    """What a replay did. `allocations` and `frees` count the trace's events, and
    `replayed_allocations` and `replayed_frees` what the replay made of them (its pool's
    counts at the end: recorded failures that succeed are allocated and freed at once, and a
    free of a block the replay could not allocate is skipped). `would_fail` counts allocations
    that succeeded when recorded and fail now; `failed` all allocations that fail in the
    replay (recorded failures included); `same_placements` the allocations placed at their
    recorded offset."""

    config: dict[str, Any]
    events: int
    allocations: int
    frees: int
    moves: int
    recorded_failures: int
    failed: int
    would_fail: int
    rescued: int
    unmatched_frees: int
    skipped_frees: int
    same_placements: int
    peak_bytes_in_use: int
    peak_fragmentation: float
    fragmentation_at_peak: float
    final: npumem.PoolStats
    seconds: float
    first_failures: list[ReplayFailure] = field(default_factory=list)
    replayed_allocations: int = 0
    replayed_frees: int = 0

    @property
    def ok(self) -> bool:
        """Whether every allocation that succeeded when recorded also succeeds now."""
        return self.would_fail == 0


@contextlib.contextmanager
def _one_cpu() -> Iterator[None]:
    """Pin the calling thread to one CPU while replaying (Linux; elsewhere a no-op)."""
    get = getattr(os, "sched_getaffinity", None)
    put = getattr(os, "sched_setaffinity", None)
    if get is None or put is None:
        yield
        return
    before = get(0)
    try:
        put(0, {min(before)})
    except OSError:
        yield
        return
    try:
        yield
    finally:
        put(0, before)


def replay_trace(
    trace: Trace,
    *,
    config: Mapping[str, Any] | None = None,
    sample_every: int = 256,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Replay `trace` on a fresh pool made from the trace's configuration with the entries of
    `config` replacing its own (`capacity`, `cores`, `chunk_size`, `min_block`,
    `bank_size`, `alignment`, `slab_sizes`, `placement`, `run_tails`, `core_reserve`,
    `max_capacity`).

    A `capacity` given without a `max_capacity` is an arena of exactly that many bytes: the
    replay does not grow, even where the recorded pool could. With `max_capacity` too it grows
    up to that, `capacity` bytes at a time (the trace does not record the pool's `grow_by`).

    Fragmentation is sampled every `sample_every` events and at every failure; `progress`
    is called now and then with (events done, events in all). A bad configuration raises
    `npumem.ConfigError`.
    """
    if not isinstance(trace, Trace):
        raise npumem.ArgumentTypeError(f"trace must be a Trace, got {type(trace).__name__}")
    if config is not None and not isinstance(config, Mapping):
        raise npumem.ArgumentTypeError(
            f"config must be a mapping of configuration keys or None, got {type(config).__name__}"
        )
    if progress is not None and not callable(progress):
        raise npumem.ArgumentTypeError(
            f"progress must be a callable or None, got {type(progress).__name__}"
        )
    overrides = dict(config or {})
    unknown = sorted(set(overrides) - set(_CONFIG_KEYS))
    if unknown:
        raise npumem.InvalidArgumentError(
            f"unknown configuration key(s) {', '.join(unknown)}; expected {', '.join(_CONFIG_KEYS)}"
        )
    if isinstance(sample_every, bool) or not isinstance(sample_every, int) or sample_every < 1:
        raise npumem.InvalidArgumentError(
            f"sample_every must be an int >= 1, got {shown(sample_every)}"
        )
    cfg = {k: trace.config[k] for k in _CONFIG_KEYS if k in trace.config}
    if "capacity" in overrides and "max_capacity" not in overrides:
        cfg.pop("max_capacity", None)
    cfg.update(overrides)
    kwargs = {k: v for k, v in cfg.items() if k != "capacity"}
    # Pinned from the pool's making on: the thread's first allocations take the pinned CPU's
    # core pool, not the one of the CPU it ran on before.
    pinned = contextlib.ExitStack()
    pinned.enter_context(_one_cpu())
    try:
        pool = npumem.Pool(
            cfg["capacity"], backing="none", name=f"replay-of-{trace.pool}", **kwargs
        )
    except BaseException:
        pinned.close()
        raise
    live: dict[int, npumem.Block] = {}
    dead: set[int] = set()
    counts = dict.fromkeys(EVENT_KINDS, 0)
    failed = would_fail = rescued = unmatched = skipped = same = made = freed_count = 0
    peak = 0
    peak_frag = frag_at_peak = 0.0
    first_failures: list[ReplayFailure] = []
    events = trace.events
    total = len(events)
    start = time.perf_counter()

    def note_failure(e: Any, err: npumem.OutOfMemoryError | None) -> None:
        recorded_failed = e.kind == "failed"
        if len(first_failures) < 10:
            bytes_free = largest = None
            if err is not None:
                bytes_free, largest = err.bytes_free, err.largest_free_block
            if bytes_free is None or largest is None:
                # A request larger than the whole arena: no error, or one without free figures.
                now = pool.stats()
                bytes_free, largest = now.bytes_free, now.largest_free_block
            first_failures.append(
                ReplayFailure(
                    e.time_ns,
                    e.size,
                    e.tag,
                    bytes_free,
                    largest,
                    recorded_failed,
                )
            )

    # The pool refuses an alignment beyond its arena as a bad argument; for the replay it is a
    # request that fails (`_CannotAlign`).
    arena = pool.max_capacity

    def alloc(e: Any) -> npumem.Block:
        if e.aux > arena:
            raise _CannotAlign
        return pool.alloc(e.size, align=e.aux or None, tag=e.tag)

    with pinned:
        for i, e in enumerate(events):
            counts[e.kind] += 1
            failed_before = failed
            if e.kind == "alloc":
                try:
                    blk = alloc(e)
                except _CannotAlign:
                    failed += 1
                    would_fail += 1
                    dead.add(e.handle)
                    note_failure(e, None)
                except npumem.OutOfMemoryError as err:
                    failed += 1
                    would_fail += 1
                    dead.add(e.handle)
                    note_failure(e, err)
                else:
                    live[e.handle] = blk
                    made += 1
                    same += blk.offset == e.offset
            elif e.kind == "free":
                freed = live.pop(e.handle, None)
                if freed is not None:
                    freed.free()
                    freed_count += 1
                elif e.handle in dead:
                    dead.discard(e.handle)
                    skipped += 1
                else:
                    unmatched += 1
            elif e.kind == "failed":
                try:
                    alloc(e).free()
                    rescued += 1
                except _CannotAlign:
                    failed += 1
                    note_failure(e, None)
                except npumem.OutOfMemoryError as err:
                    failed += 1
                    note_failure(e, err)
            if i % sample_every == 0 or failed > failed_before:
                s = pool.stats()
                peak_frag = max(peak_frag, s.external_fragmentation)
                if s.bytes_in_use > peak:
                    peak, frag_at_peak = s.bytes_in_use, s.external_fragmentation
            if progress is not None and i % 4096 == 0:
                progress(i, total)
        final = pool.stats()
    if progress is not None:
        progress(total, total)
    for blk in live.values():
        blk.free()
    _self_check(pool)
    return ReplayResult(
        config=cfg,
        events=total,
        allocations=counts["alloc"],
        frees=counts["free"],
        moves=counts["move"],
        recorded_failures=counts["failed"],
        failed=failed,
        would_fail=would_fail,
        rescued=rescued,
        unmatched_frees=unmatched,
        skipped_frees=skipped,
        same_placements=same,
        peak_bytes_in_use=max(peak, final.peak_bytes_in_use),
        peak_fragmentation=max(peak_frag, final.external_fragmentation),
        fragmentation_at_peak=frag_at_peak,
        final=final,
        seconds=time.perf_counter() - start,
        first_failures=first_failures,
        replayed_allocations=made + rescued,
        replayed_frees=freed_count + rescued,
    )


class _CannotAlign(Exception):
    """A replayed request whose alignment is larger than the replay's arena."""


def _self_check(pool: npumem.Pool) -> None:
    """Prove the pool, its blocks all freed, consistent: `Pool.check()` for an arena of at most
    `CHECK_CHUNKS` chunks, else that it lists no live block (`Pool.blocks()`, whose cost
    grows with the blocks, not with the arena); `npumem.CorruptionError` otherwise."""
    if pool.max_capacity // pool.chunk_size <= CHECK_CHUNKS:
        pool.check()
        return
    left = len(pool.blocks())
    if left:
        raise npumem.CorruptionError(
            f"the replay's pool still holds {left:,} block(s) once every block is freed"
        )
