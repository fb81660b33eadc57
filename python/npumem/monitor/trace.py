"""Event traces: record a pool's alloc, free, move and failed-alloc events, save them as JSON,
load them back (for `npumem replay` and `npumem plot`).

The Rust core keeps the events in bounded rings (`pool.trace_start(capacity)`): one per
writing thread, up to one per core pool, and one shared by the threads beyond that, each of
`capacity / cores` events rounded up to a power of two (at least 16). A
`TraceRecorder` drains and merges them into a `Trace` often enough that the rings do not
overflow (events lost anyway are counted in `Trace.dropped`).

    >>> import npumem
    >>> from npumem.monitor import TraceRecorder
    >>> pool = npumem.Pool(16 << 20, cores=1)
    >>> with TraceRecorder(pool) as rec:
    ...     pool.alloc(1000, tag="x").free()
    >>> [e.kind for e in rec.trace.events]
    ['alloc', 'free']
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from npumem._core import MAX_TAG_BYTES
from npumem._fork_safe import ForkSafeRLock
from npumem._shown import shown
from npumem.monitor._files import MAX_HANDLE, TRACE_FORMAT, Reader, read_json, write_json
from npumem.monitor.snapshot import pool_config
from npumem.monitor.validate import check_config, check_trace, stats_from_dict

if TYPE_CHECKING:
    from npumem import Pool
    from npumem._core import PoolStats

__all__ = ["EVENT_KINDS", "Frame", "Trace", "TraceEvent", "TraceRecorder", "load_trace"]

TRACE_VERSION = 2
"""The version `Trace.save()` writes (handles as decimal text, call stacks); version 1
(handles as numbers, no stacks) is read too."""
_READ_VERSIONS = (1, 2)
OTHER_TAGS = "(other tags)"
"""The row that pools the tags after a pool's first 63 (`PoolStats.by_tag`): no tag's name."""
EVENT_KINDS = ("alloc", "free", "move", "failed")
"""The kinds of event, as `TraceEvent.kind` spells them."""
MAX_TRACE_CAPACITY = 1 << 24
"""The most events the Rust rings hold (as `npumem_core::MAX_TRACE_CAPACITY`)."""
_EVENT_FIELDS = ("time_ns", "kind", "offset", "size", "core", "tag", "handle", "aux", "stack")
_EVENT_FIELDS_V1 = _EVENT_FIELDS[:8]
_KINDS = {kind: kind for kind in EVENT_KINDS}
_HANDLE_DIGITS = len(str(MAX_HANDLE))


def _canonical_handle(value: Any) -> bool:
    """Whether `value` is a version-2 handle that `Reader.handle` takes as it is: decimal
    text without leading zeros, at most `MAX_HANDLE`."""
    return (
        type(value) is str
        and 0 < len(value) < _HANDLE_DIGITS
        and value.isascii()
        and value.isdigit()
        and (value[0] != "0" or value == "0")
    )


class Frame(NamedTuple):
    """One frame of a Python call stack: the file, the line and the function."""

    file: str
    line: int
    function: str


class TraceEvent(NamedTuple):
    """One event. `aux` is the alignment for `alloc` and `failed`, the old offset for
    `move`, 0 for `free`; `handle` pairs a `free` (or `move`) with its `alloc`
    (0 for `failed`). `stack` is the Python call stack of an allocation, most recent call
    first, when the trace records stacks (`TraceRecorder(pool, stacks=True)`), else None."""

    time_ns: int
    kind: str
    offset: int
    size: int
    core: int
    tag: str | None
    handle: int
    aux: int
    stack: tuple[Frame, ...] | None = None


def _stats_obj(stats: PoolStats | None) -> dict[str, Any]:
    """Stats as a trace file keeps them (an empty object when unknown)."""
    return {} if stats is None else stats.as_dict()


def _stats_of(obj: dict[str, Any], where: str) -> PoolStats | None:
    """Stats from a trace file (None for an empty object)."""
    return stats_from_dict(obj, where) if obj else None


@dataclass
class Trace:
    """The events of one pool, oldest first, with the pool's configuration and what was lost.

    `dropped` counts the events the Rust rings overwrote before a drain took them, and those
    the pool made between two sessions of a `TraceRecorder` (while it was stopped);
    `discarded`, the oldest events a `TraceRecorder` let go to keep at most `max_events`
    (both are lost from the trace). `stats_at_start` and `stats_at_stop` are the pool's
    `PoolStats` when recording began and ended (None when unknown): a replay compares its
    outcome with them.
    """

    pool: str
    config: dict[str, Any]
    events: list[TraceEvent] = field(default_factory=list)
    dropped: int = 0
    stats_at_start: PoolStats | None = None
    stats_at_stop: PoolStats | None = None
    discarded: int = 0

    @property
    def complete(self) -> bool:
        """Whether the trace can be replayed faithfully: nothing dropped or discarded, and the
        pool held no block when recording began."""
        start = self.stats_at_start
        return (
            self.dropped == 0
            and self.discarded == 0
            and (start is None or start.blocks_in_use == 0)
        )

    def counts(self) -> dict[str, int]:
        """Events by kind."""
        out = dict.fromkeys(EVENT_KINDS, 0)
        for e in self.events:
            out[e.kind] += 1
        return out

    @property
    def duration_ns(self) -> int:
        """Nanoseconds from the first event to the last."""
        return self.events[-1].time_ns - self.events[0].time_ns if self.events else 0

    # ----- JSON ------------------------------------------------------------------------------

    def to_json_obj(self) -> dict[str, Any]:
        """The trace as a JSON-ready dict (format `npumem-trace`, version 2; the schema is
        `npumem/schemas/trace.schema.json`). Tags and call stacks are stored once, in `tags`
        and `stacks`; events are rows indexing them (-1: none). Handles are decimal text, so
        that readers that hold numbers as doubles keep them exact."""
        tags: dict[str, int] = {}
        stacks: dict[tuple[Frame, ...], int] = {}
        rows = []
        for e in self.events:
            tag = -1 if e.tag is None else tags.setdefault(e.tag, len(tags))
            stack = -1 if e.stack is None else stacks.setdefault(e.stack, len(stacks))
            rows.append(
                [e.time_ns, e.kind, e.offset, e.size, e.core, tag, str(e.handle), e.aux, stack]
            )
        return {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "pool": self.pool,
            "config": self.config,
            "dropped": self.dropped,
            "discarded": self.discarded,
            "stats_at_start": _stats_obj(self.stats_at_start),
            "stats_at_stop": _stats_obj(self.stats_at_stop),
            "tags": list(tags),
            "stacks": [[list(f) for f in stack] for stack in stacks],
            "event_fields": list(_EVENT_FIELDS),
            "events": rows,
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the trace as JSON to `path`; returns the path."""
        return write_json(path, self.to_json_obj())

    @classmethod
    def from_json_obj(
        cls, obj: Mapping[str, Any], *, where: str = "trace", consume: bool = False
    ) -> Trace:
        """Read a dict made by `to_json_obj()`; `FileFormatError` names what is
        wrong. With `consume=True` the rows of `obj["events"]` are replaced by None as they
        are read, so that a large file does not take the memory of its rows and of its events
        at once (for an `obj` nothing else needs afterwards, as `load()` reads it)."""
        r = Reader(where)
        version = r.header(obj, TRACE_FORMAT, _READ_VERSIONS)
        config = r.field(obj, "config", dict)
        for key in ("capacity", "cores", "chunk_size", "min_block", "bank_size", "alignment"):
            value = r.non_negative(r.field(config, key, int), f"config.{key}")
            if value == 0:
                raise r.fail(f"config.{key} must be > 0")
        check_config(config, where)
        # The largest alignment a pool of this configuration takes: it refuses a larger one
        # as a bad argument, and records no event of it.
        arena = config.get("max_capacity", config["capacity"])
        tags = r.field(obj, "tags", list)
        if not all(isinstance(t, str) for t in tags):
            raise r.fail("tags must be a list of strings")
        for i, t in enumerate(tags):
            # What a pool refuses as a tag, which a replay would pass to it.
            if t == "":
                raise r.fail(f"tags[{i}] is empty: an empty tag reads as no tag (index -1)")
            if t == OTHER_TAGS:
                raise r.fail(f"tags[{i}] is {OTHER_TAGS!r}, the row of the pooled tags, no tag")
            if len(t.encode("utf-8", "surrogatepass")) > MAX_TAG_BYTES:
                raise r.fail(
                    f"tags[{i}] is longer than a tag can be ({MAX_TAG_BYTES} bytes of UTF-8)"
                )
        fields = _EVENT_FIELDS if version >= 2 else _EVENT_FIELDS_V1
        if r.field(obj, "event_fields", list) != list(fields):
            raise r.fail(f"event_fields must be {list(fields)}")
        stacks = _read_stacks(r, obj) if version >= 2 else []
        rows = r.field(obj, "events", list)
        events = []
        last = 0
        width = len(fields)
        n_tags, n_stacks = len(tags), len(stacks)
        for i, row in enumerate(rows):
            if consume:
                rows[i] = None  # the row's objects go as its event comes: half the peak memory
            # The common case is checked inline, without a message made for every event; an
            # event that fails it is checked again field by field for the message.
            if type(row) is not list or len(row) != width:
                r.int_row(row, width, "event", i)
            t, kind, offset, size, core, tag, handle, aux = row[:8]
            stack_index = row[8] if version >= 2 else -1
            kind = _KINDS.get(kind) if type(kind) is str else None  # one str per kind
            if kind is None:
                raise r.fail(f"event {i}: kind must be one of {EVENT_KINDS}, got {shown(row[1])}")
            if type(tag) is not int or not -1 <= tag < n_tags:
                raise r.fail(f"event {i}: tag index {shown(tag)} is not in tags (or -1)")
            if type(stack_index) is not int or not -1 <= stack_index < n_stacks:
                raise r.fail(
                    f"event {i}: stack index {shown(stack_index)} is not in stacks (or -1)"
                )
            if not (
                type(t) is int
                and type(offset) is int
                and type(size) is int
                and type(core) is int
                and type(aux) is int
                and min(t, offset, size, core, aux) >= 0
            ):
                for v in (t, offset, size, core, aux):
                    r.non_negative(v, f"event {i}")
            if aux > arena and (kind == "alloc" or kind == "failed"):
                raise r.fail(
                    f"event {i}: alignment {aux} is larger than the arena ({arena} bytes), "
                    "which no pool records"
                )
            if t < last:
                raise r.fail(f"event {i}: time {t} goes back (events are oldest first)")
            last = t
            if not (version >= 2 and _canonical_handle(handle)):
                handle = r.handle(handle, f"event {i}", version)
            events.append(
                TraceEvent(
                    t,
                    kind,
                    offset,
                    size,
                    core,
                    tags[tag] if tag >= 0 else None,
                    int(handle),
                    aux,
                    stacks[stack_index] if stack_index >= 0 else None,
                )
            )
        # Optional: files written before recorders bounded their events have no `discarded`.
        discarded = (
            r.count(r.field(obj, "discarded", int), "discarded") if "discarded" in obj else 0
        )
        trace = cls(
            pool=r.field(obj, "pool", str),
            config=config,
            events=events,
            dropped=r.non_negative(r.field(obj, "dropped", int), "dropped"),
            discarded=discarded,
            stats_at_start=_stats_of(r.field(obj, "stats_at_start", dict), where),
            stats_at_stop=_stats_of(r.field(obj, "stats_at_stop", dict), where),
        )
        check_trace(trace, where)
        return trace

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a trace file written by `save()`."""
        return cls.from_json_obj(read_json(path), where=str(path), consume=True)

    def __repr__(self) -> str:
        discarded = f", {self.discarded} discarded" if self.discarded else ""
        return (
            f"<Trace of {self.pool!r}: {len(self.events)} events, {self.dropped} dropped"
            f"{discarded}>"
        )


def _read_stacks(r: Reader, obj: Mapping[str, Any]) -> list[tuple[Frame, ...]]:
    stacks = []
    for i, stack in enumerate(r.field(obj, "stacks", list)):
        if not isinstance(stack, list):
            raise r.fail(f"stack {i} must be a list of frames, got {shown(stack)}")
        frames = []
        for frame in stack:
            ok = isinstance(frame, list) and len(frame) == 3
            if not ok or not isinstance(frame[0], str) or not isinstance(frame[2], str):
                raise r.fail(
                    f"stack {i}: a frame must be [file, line, function], got {shown(frame)}"
                )
            frames.append(Frame(frame[0], r.non_negative(frame[1], f"stack {i}"), frame[2]))
        stacks.append(tuple(frames))
    return stacks


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file (the same as `Trace.load()`)."""
    return Trace.load(path)


def _event(raw: tuple[Any, ...], stacks: dict[Any, tuple[Frame, ...]]) -> TraceEvent:
    """A drained event tuple as a `TraceEvent`, its stack as `Frame`s (`stacks`: the stacks
    converted so far, so that a stack seen again is the same tuple and costs one lookup)."""
    stack = raw[8]
    if stack is None:
        return TraceEvent._make(raw)
    frames = stacks.get(stack)
    if frames is None:
        frames = stacks[stack] = tuple(Frame._make(f) for f in stack)
    time_ns, kind, offset, size, core, tag, handle, aux = raw[:8]
    return TraceEvent(time_ns, kind, offset, size, core, tag, handle, aux, frames)


class TraceRecorder:
    """Record a pool's events into `trace`: `start()`, `drain()` now and then (a
    `Monitor` can do it on every sample), `stop()`. Also a context
    manager. `capacity` sizes the Rust rings (`Pool.trace_start`): each of the `cores + 1`
    rings holds `capacity / cores` events rounded up to a power of two (at least 16; 64 bytes
    each), and one thread keeps at most one ring's worth between two drains. With
    `stacks=True` every allocation made through Python also records its caller's Python stack
    (`TraceEvent.stack`); that costs a few microseconds per allocation (see the monitoring
    guide). `max_events` (default `None`: every event, as a trace to replay needs) bounds the
    events `trace` keeps: beyond it the oldest go (a trace stays in time order), counted in
    `trace.discarded`, so that a recorder drained for hours holds a bounded memory (about
    250 bytes per event). In a process forked while another thread
    was starting, draining or stopping the recorder, its calls raise `PoolBusyError`: make a
    new one there."""

    def __reduce__(self) -> NoReturn:
        # A copy would record the same live pool (copy.copy, deepcopy and pickle all come
        # here); its `trace` is a value and pickles.
        raise TypeError(
            "cannot copy or pickle a 'TraceRecorder' object: it records a live pool "
            "(pickle its .trace instead)"
        )

    def __init__(
        self,
        pool: Pool,
        *,
        capacity: int = 1 << 16,
        stacks: bool = False,
        max_events: int | None = None,
    ) -> None:
        from npumem import Pool as PoolClass
        from npumem.errors import ArgumentTypeError, InvalidArgumentError

        if not isinstance(pool, PoolClass):
            raise ArgumentTypeError(f"pool must be an npumem.Pool, got {type(pool).__name__}")
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise ArgumentTypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if not 1 <= capacity <= MAX_TRACE_CAPACITY:
            raise InvalidArgumentError(
                f"capacity must be between 1 and {MAX_TRACE_CAPACITY} events, got {capacity}"
            )
        if not isinstance(stacks, bool):
            raise ArgumentTypeError(f"stacks must be True or False, got {type(stacks).__name__}")
        if max_events is not None:
            if isinstance(max_events, bool) or not isinstance(max_events, int):
                raise ArgumentTypeError(
                    f"max_events must be an int or None, got {type(max_events).__name__}"
                )
            if max_events < 1:
                raise InvalidArgumentError(
                    f"max_events must keep at least 1 event (None: no bound), got {max_events}"
                )
        self.pool = pool
        self.capacity = capacity
        self.stacks = stacks
        self.max_events = max_events
        self.trace = Trace(pool=str(pool.name), config=pool_config(pool))
        self._lock = ForkSafeRLock("TraceRecorder")
        self._running = False
        self._stacks: dict[Any, tuple[Frame, ...]] = {}
        # What the rings dropped in this recorder's earlier sessions: the pool counts only
        # its current one.
        self._dropped_before = 0

    @property
    def running(self) -> bool:
        """Whether events are being recorded."""
        return self._running

    def start(self) -> TraceRecorder:
        """Start recording (a fresh trace in the pool). This recorder's events are kept, and so
        is its count of lost events, which a start after a `stop()` raises by the allocations,
        frees and failed allocations the pool made while stopped: a trace of two sessions
        with calls between them is no complete record. A recorder that is running drains
        first. `trace.stats_at_start` is the pool's stats at the first start."""
        with self._lock:
            now = self.pool.stats()
            if self._running:
                self._drain_locked()
            elif (stopped := self.trace.stats_at_stop) is not None:
                self.trace.dropped += max(
                    0,
                    now.alloc_count
                    - stopped.alloc_count
                    + now.free_count
                    - stopped.free_count
                    + now.failed_allocs
                    - stopped.failed_allocs,
                )
            self._dropped_before = self.trace.dropped
            if self.trace.stats_at_start is None:
                self.trace.stats_at_start = now
            self.pool.trace_start(self.capacity, stacks=self.stacks)
            self._running = True
        return self

    def drain(self) -> int:
        """Move the events recorded so far into `trace`; returns how many were drained
        (the oldest of them may go at once to keep `max_events`)."""
        with self._lock:
            return self._drain_locked()

    def _drain_locked(self) -> int:
        raw = self.pool.trace_drain()
        events = self.trace.events
        limit = self.max_events
        # A drain is oldest first: of a batch longer than the bound only the newest events
        # can stay, so the others are not converted at all.
        skip = len(raw) - limit if limit is not None and len(raw) > limit else 0
        late = bool(events) and len(raw) > skip and raw[skip][0] < events[-1].time_ns
        events.extend(_event(e, self._stacks) for e in raw[skip:])
        if late:
            # An event still being written at the last drain came in late: keep time order.
            events.sort(key=lambda e: e.time_ns)
        if limit is not None and len(events) > limit:
            excess = len(events) - limit
            del events[:excess]  # the oldest, at once
            skip += excess
        if skip and len(self._stacks) > 2 * len(events):
            self._prune_stacks()
        self.trace.discarded += skip
        self.trace.dropped = self._dropped_before + self.pool.trace_status().dropped
        return len(raw)

    def _prune_stacks(self) -> None:
        """Keep in the stack cache only the stacks that the kept events hold.

        Each event holds at most one stack, so a cache of more than twice as many entries as
        there are events holds more stacks of discarded events than of kept ones:
        `_drain_locked` prunes it then, after a drain that let events go. That keeps the cache
        within a few times `max_events`, and each prune's walk over the events is paid for by
        the entries the cache gained since the last one (at least as many as there are
        events), so a drain stays linear in the events it takes."""
        kept = {id(e.stack) for e in self.trace.events if e.stack is not None}
        self._stacks = {raw: frames for raw, frames in self._stacks.items() if id(frames) in kept}

    def stop(self) -> Trace:
        """Stop recording, drain the rest, and return `trace`."""
        with self._lock:
            if self._running:
                self.pool.trace_stop()
                self._running = False
                self._drain_locked()
                self.trace.stats_at_stop = self.pool.stats()
        return self.trace

    def __enter__(self) -> TraceRecorder:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
