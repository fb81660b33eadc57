"""`npumem demo`: the project's main job, an inference service in miniature on a host-backed
pool (no device, no files needed).

Three models (ResNet-50, MobileNetV2, a text generator) have their weights resident in the pool
and their activation arenas planned ahead with `npumem.plan`; the text model keeps its keys
and values in a paged KV cache (`npumem.kv`) with a shared system prompt and beam search;
worker threads on every core serve requests of varying batch size and sequence length (see
`npumem.workloads.service`; the frees an inference's operators make are deferred to the end
of its batch, `Pool.deferred()`),
while a `Monitor` samples the pool, raises alerts, and takes snapshots
when usage reaches a new high. The pool starts smaller than its capacity and grows by regions
when an allocation finds no room (`Pool(max_capacity=...)`), as a runtime that sizes its pool
from a first guess would; the report gives the growths per 1000 requests. At the end the pool
is checked, the weights are freed, and `run_demo()` returns the figures, the monitor's history
and the snapshots; the command prints the report and writes the pictures.

Compaction plugs in through the `compactor` argument: an object with a
`compact()` method. The workers call it when an allocation fails (then retry once), and the
monitor calls it when fragmentation passes its threshold (then a before/after snapshot pair is
kept). Without one (the default) nothing is compacted and `compactions` is 0.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import npumem
from npumem.monitor import Alert, Monitor, Sample, Snapshot, Thresholds, Trace, TraceRecorder
from npumem.workloads.kv_summary import KVSummary
from npumem.workloads.models import Model, build_models
from npumem.workloads.service import Service, SupportsCompact, make_kv_cache, make_requests

if TYPE_CHECKING:
    from npumem.tiers.block import TieredBlock
    from npumem.workloads.demo_tiers import DemoTiers
    from npumem.workloads.tiered import TieredDemoResult

__all__ = [
    "MAX_CAPACITY",
    "MAX_REQUESTS",
    "MAX_WORKERS",
    "OUTPUT_NAMES",
    "DemoResult",
    "KVSummary",
    "default_capacity",
    "default_workers",
    "run_demo",
    "write_outputs",
]

MIB = 1 << 20

OUTPUT_NAMES = (
    "snapshot.json",
    "snapshot-end.json",
    "trace.json",
    "timeline.png",
    "address-map.png",
    "address-map-by-core.png",
    "compaction.png",
    "highest-vs-end.png",
    "plan-resnet50-1.png",
    "plan-text-1-128.png",
    "trace.png",
    "tiers.json",
    "tiers.png",
)
"""Every file the demo may write into its folder (`write_outputs()` and
`npumem.workloads.tiered.write_tier_outputs()`), so that a command can check them all before
it writes any."""

MAX_WORKERS = 1024
"""The most worker threads a demo runs: a thread per core on the largest machine a pool
serves (1024 core pools). Thousands of threads on a few cores only wait for each other: the
monitor's pauses then time out."""
MAX_REQUESTS = 1_000_000
"""The most requests a demo serves (about 17 times the command's default): the requests are
made before serving starts, about 130 bytes each."""
MAX_CAPACITY = 1 << 47
"""The largest arena the demo's pool may grow to (128 TiB, `Pool(max_capacity=...)`'s limit)."""


GROW_BY = 64 * MIB
"""The least a growth of the demo's pool adds: more than its largest request (a batch-8
activation arena of 55 MiB), since no block spans two regions and a smaller region could not
serve that request however empty it was."""
CHUNK = 2 * MIB
"""The pool's chunk size (the default): a pool that grows starts with whole chunks."""


def start_capacity(capacity: int, weights: int) -> int:
    """The demo pool's first region for a pool that may grow to `capacity` bytes and holds
    `weights` bytes of weights: the weights and half of the rest, in whole chunks (the weights
    are placed first, in one region, as a runtime loads its models before serving); `capacity`
    itself when less than a growth would be left over."""
    start = -(-(weights + (capacity - weights) // 2) // CHUNK) * CHUNK
    return start if start + CHUNK <= capacity else capacity


def growing_pool(capacity: int, weights: int) -> npumem.Pool:
    """The demo's pool: it starts with `start_capacity(capacity, weights)` bytes and grows by at
    least `GROW_BY` up to `capacity` rounded down to whole chunks (a pool grows by whole
    chunks); one of `capacity` bytes that does not grow when no whole chunk is left to grow by."""
    start = start_capacity(capacity, weights)
    top = capacity - capacity % CHUNK
    if start >= top:
        return npumem.Pool(capacity, name="demo")
    return npumem.Pool(start, max_capacity=top, grow_by=GROW_BY, name="demo")


def default_workers() -> int:
    """The worker threads the demo runs by default: one per CPU, at most `MAX_WORKERS`."""
    return min(MAX_WORKERS, os.cpu_count() or 1)


def default_capacity(workers: int) -> int:
    """The arena the demo uses by default: the weights (about 155 MiB) plus 128 MiB per worker
    (a worker's peak is about 70 MiB: a batch-8 arena, KV caches, and a KV cache while it
    grows; the rest is headroom for fragmentation)."""
    return (160 + 128 * workers) * MIB


@dataclass
class DemoResult:
    """What a demo run did and what the pool looked like."""

    workers: int
    capacity: int
    requests: int
    served: dict[str, int]
    rejected: int
    allocations: int
    frees: int
    seconds: float
    peak_bytes_in_use: int
    usable_capacity: int
    peak_fragmentation: float
    final_fragmentation: float
    failed_allocations: int
    overflow_allocations: int
    kv: KVSummary
    compactions: int
    alerts: list[Alert]
    checked_blocks: int
    history: list[Sample]
    models: list[Model]
    peak_snapshot: Snapshot
    end_snapshot: Snapshot
    compactor: bool = False
    compaction_snapshots: tuple[Snapshot, Snapshot] | None = None
    trace: Trace | None = None
    final: npumem.PoolStats | None = None
    tiers: TieredDemoResult | None = None
    """With `run_demo(tiers=True)`: the tiers' figures and the policies compared."""
    files: dict[str, str] = field(default_factory=dict)
    deferred_frees: int = 0
    """Frees of kernel arguments queued until the end of their inference batch."""
    deferred_batches: int = 0
    """Inference batches whose frees were made together at their end."""
    start_capacity: int = 0
    """The pool's first region: it grew from there up to `capacity` at most."""
    grow_events: int = 0
    """Times the pool grew (added a region) while serving."""
    regions: int = 1
    """Regions of the pool at the end of serving."""
    room_waits: int = 0
    """Failed allocations that waited for another worker to free room (a compactor with
    `Policy.wait_for_room`), and `room_waits_failed` of them in vain."""
    room_waits_failed: int = 0
    room_waited_seconds: float = 0.0
    """The seconds those waits took in all."""

    @property
    def growths_per_1000_requests(self) -> float:
        """Growths of the pool per 1000 requests served (the target is at most 1)."""
        served = self.requests_served
        return 1000 * self.grow_events / served if served else 0.0

    @property
    def requests_served(self) -> int:
        """Requests served, all models together."""
        return sum(self.served.values())

    @property
    def allocations_per_second(self) -> float:
        """Allocations per second of serving (pool calls from all workers together)."""
        return self.allocations / self.seconds if self.seconds > 0 else 0.0

    @property
    def peak_usage(self) -> float:
        """Peak bytes in use / usable capacity."""
        return self.peak_bytes_in_use / self.usable_capacity if self.usable_capacity else 0.0

    @property
    def ok(self) -> bool:
        """The demo's goal: no failed allocation, no rejected request."""
        return self.failed_allocations == 0 and self.rejected == 0


def run_demo(
    *,
    requests: int = 3000,
    workers: int | None = None,
    capacity: int | None = None,
    seed: int = 0,
    interval: float = 0.1,
    trace: bool = False,
    compactor: SupportsCompact | Callable[[npumem.Pool], SupportsCompact] | None = None,
    on_request: Callable[[], object] | None = None,
    tiers: bool = False,
) -> DemoResult:
    """Serve `requests` requests with `workers` threads (default `default_workers()`) on a pool
    of `capacity` bytes (default `default_capacity()`) with `os.cpu_count()` core pools.

    `requests`, `workers` and `capacity` are ints from 1 to `MAX_REQUESTS`, `MAX_WORKERS` and
    `MAX_CAPACITY`; anything else raises `ArgumentTypeError` or `InvalidArgumentError` before
    anything is made. An arena too small for the models' weights raises `InvalidArgumentError`.

    `interval` is the monitor's sampling period; `trace` records every event (returned in
    `DemoResult.trace`); `compactor` is the compaction integration point (an object
    with `compact()`, or a factory called with the pool); `on_request` is called after every
    request (progress bars); `tiers` puts a fast pool (SRAM) per worker in front of the
    pool and allocates the weights through a `TieredPool` (`npumem.workloads.demo_tiers`).
    """
    _check_count("requests", requests, MAX_REQUESTS)
    workers = workers if workers is not None else default_workers()
    _check_count("workers", workers, MAX_WORKERS)
    capacity = capacity if capacity is not None else default_capacity(workers)
    _check_count("capacity", capacity, MAX_CAPACITY)
    models = build_models()
    weight_bytes = sum(m.weight_bytes for m in models)
    pool = growing_pool(capacity, weight_bytes)
    compact_with: SupportsCompact | None = None
    if compactor is not None:
        compact_with = compactor if isinstance(compactor, SupportsCompact) else compactor(pool)
    recorder = TraceRecorder(pool, capacity=1 << 18) if trace else None
    if recorder is not None:
        recorder.start()  # before the weights: the trace then replays from an empty pool
    tiered = _demo_tiers(pool, workers) if tiers else None
    try:
        if tiered is not None:
            weights: list[npumem.Block] | list[TieredBlock] = tiered.alloc_weights(models)
        else:
            weights = [pool.alloc(m.weight_bytes, tag=f"{m.name}.weights") for m in models]
    except npumem.OutOfMemoryError:
        need = sum(m.weight_bytes for m in models)
        raise npumem.InvalidArgumentError(
            f"the arena ({capacity:,} bytes) is too small for the models' weights alone "
            f"({need:,} bytes); the default for {workers} worker(s) is "
            f"{default_capacity(workers):,}"
        ) from None

    kv = make_kv_cache(pool)
    kv_summary = KVSummary(kv.page_bytes)  # sampled by the monitor and by the workers
    lock = threading.Lock()
    peak: list[Snapshot] = []
    compaction_pair: list[Snapshot] = []
    last_snap = [0.0]
    alert_compactions = [0]

    def on_sample(s: Sample) -> None:
        if recorder is not None:
            recorder.drain()
        kv_summary.sample(kv)
        best = peak[0].stats.bytes_in_use if peak else 0
        if s.bytes_in_use > best and time.monotonic() - last_snap[0] > 0.2:
            snap = pool.snapshot().with_kv(kv)
            last_snap[0] = time.monotonic()
            with lock:
                if not peak or snap.stats.bytes_in_use > peak[0].stats.bytes_in_use:
                    peak[:] = [snap.with_label("at the highest usage sampled")]

    def on_alert(alert: Alert) -> None:
        # Integration point of the compaction policy: compact when fragmentation
        # passes its threshold, keeping the first before/after pair for the pictures.
        if compact_with is not None and alert.kind == "fragmentation" and alert.firing:
            before = pool.snapshot().with_label("before compaction")
            compact_with.compact()
            alert_compactions[0] += 1
            after = pool.snapshot().with_label("after compaction")
            with lock:
                if not compaction_pair:
                    compaction_pair[:] = [before, after]

    monitor = Monitor(pool, interval=interval, on_sample=[on_sample], callbacks=[on_alert])
    service = (Service if tiered is None else tiered.service)(
        pool,
        models,
        make_requests(requests, models, seed),
        workers=workers,
        seed=seed,
        compactor=compact_with,
        on_request=on_request,
        kv=kv,
        kv_summary=kv_summary,
    )
    before = pool.stats()
    started = time.perf_counter()
    with monitor:
        service.run()
    seconds = time.perf_counter() - started
    kv_summary.sample(kv)
    kv_summary.beam_forks = service.beam_forks
    kv.close()
    after = pool.stats()
    end_snapshot = pool.snapshot().with_label("end of run (weights resident)")
    tier_result = tiered.result(requests) if tiered is not None else None
    checked = pool.check()
    for w in weights:
        w.free()
    recorded = recorder.stop() if recorder is not None else None
    final = pool.stats()
    history = monitor.history
    # Compaction: a compactor that counts its own compactions (those it ran for
    # failed allocations inside pool.alloc too) gives the real figure.
    compactions = service.compactions + alert_compactions[0]
    compactions = getattr(compact_with, "compactions", compactions)
    return DemoResult(
        workers=workers,
        capacity=capacity,
        requests=requests,
        served=service.served,
        rejected=service.rejected,
        allocations=after.alloc_count - before.alloc_count,
        frees=after.free_count - before.free_count,
        seconds=seconds,
        peak_bytes_in_use=final.peak_bytes_in_use,
        usable_capacity=final.usable_capacity,
        peak_fragmentation=max((s.external_fragmentation for s in history), default=0.0),
        final_fragmentation=after.external_fragmentation,
        failed_allocations=final.failed_allocs,
        overflow_allocations=final.overflow_allocs,
        kv=kv_summary,
        compactions=compactions,
        compactor=compact_with is not None,
        alerts=monitor.alerts,
        checked_blocks=checked,
        history=history,
        models=models,
        peak_snapshot=peak[0] if peak else end_snapshot,
        end_snapshot=end_snapshot,
        compaction_snapshots=(compaction_pair[0], compaction_pair[1]) if compaction_pair else None,
        trace=recorded,
        final=final,
        deferred_frees=service.deferred_frees,
        deferred_batches=service.deferred_batches,
        tiers=tier_result,
        start_capacity=start_capacity(capacity, weight_bytes),
        grow_events=after.grow_events,
        regions=after.regions,
        room_waits=getattr(compact_with, "waits", 0),
        room_waits_failed=getattr(compact_with, "waits_failed", 0),
        room_waited_seconds=getattr(compact_with, "waited_seconds", 0.0),
    )


def _check_count(name: str, value: object, most: int) -> None:
    """Refuse `value` unless it is an int from 1 to `most`: `ArgumentTypeError` for another
    type, `InvalidArgumentError` out of range (the message quotes the value given)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise npumem.ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= most:
        raise npumem.InvalidArgumentError(f"{name} must be from 1 to {most:,}, got {value:,}")


def _demo_tiers(pool: npumem.Pool, workers: int) -> DemoTiers:
    """The tiers of `run_demo(tiers=True)`: 8 MiB of SRAM per worker, the pool as HBM."""
    from npumem.workloads.demo_tiers import DemoTiers

    return DemoTiers(pool, workers)


def write_outputs(
    result: DemoResult, directory: str | os.PathLike[str], *, pictures: bool = True
) -> dict[str, Path]:
    """Write the demo's snapshots, trace and (with `pictures`; needs matplotlib) pictures
    into `directory` (made if missing); returns `what -> path`."""
    from npumem.monitor import (
        plot_address_map,
        plot_before_after,
        plot_plan,
        plot_timeline,
        plot_trace,
    )

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    peak = result.peak_snapshot
    files["snapshot"] = peak.save(out / "snapshot.json")
    files["end snapshot"] = result.end_snapshot.save(out / "snapshot-end.json")
    if result.trace is not None:
        files["trace"] = result.trace.save(out / "trace.json")
    if not pictures:
        result.files = {k: str(v) for k, v in files.items()}
        return files
    if result.history:
        files["timeline"] = plot_timeline(
            result.history,
            out / "timeline.png",
            thresholds=Thresholds(),  # the monitor's (the defaults)
            title=f"npumem demo: {result.requests_served:,} requests, {result.workers} workers",
        )
    files["address map"] = plot_address_map(peak, out / "address-map.png")
    files["address map by core"] = plot_address_map(
        peak, out / "address-map-by-core.png", color_by="core"
    )
    if result.compaction_snapshots is not None:
        before, after = result.compaction_snapshots
        files["before/after compaction"] = plot_before_after(
            before, after, out / "compaction.png", titles=("before compaction", "after compaction")
        )
    files["highest vs end"] = plot_before_after(
        peak,
        result.end_snapshot,
        out / "highest-vs-end.png",
        titles=("at the highest usage sampled", "end of run (weights resident)"),
    )
    for model, key in (("resnet50", (1,)), ("text", (1, 128))):
        m = next((x for x in result.models if x.name == model), None)
        if m is not None and key in m.plans:
            name = f"plan-{model}-{'-'.join(map(str, key))}.png"
            what = f"{model}, batch {key[0]}" + (f", sequence {key[1]}" if len(key) > 1 else "")
            files[f"plan {model} {key}"] = plot_plan(m.plans[key].solution, out / name, name=what)
    if result.trace is not None and result.trace.events:
        files["trace picture"] = plot_trace(result.trace, out / "trace.png")
    result.files = {k: str(v) for k, v in files.items()}
    return files
