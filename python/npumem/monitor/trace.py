"""Event traces: record a pool's alloc, free, move and failed-alloc events, save them as JSON,
load them back (for ``npumem replay`` and ``npumem plot``).

The Rust core keeps the events in bounded per-core rings (``pool.trace_start(capacity)``); a
:class:`TraceRecorder` drains them into a :class:`Trace` often enough that the rings do not
overflow (events lost anyway are counted in :attr:`Trace.dropped`).

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
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from npumem.monitor._files import TRACE_FORMAT, Reader, read_json, write_json
from npumem.monitor.snapshot import pool_config
from npumem.monitor.validate import check_trace

if TYPE_CHECKING:
    from npumem import Pool

__all__ = ["EVENT_KINDS", "Trace", "TraceEvent", "TraceRecorder", "load_trace"]

TRACE_VERSION = 1
EVENT_KINDS = ("alloc", "free", "move", "failed")
"""The kinds of event, as ``TraceEvent.kind`` spells them."""
MAX_TRACE_CAPACITY = 1 << 24
"""The most events the Rust rings hold (as ``npumem_core::MAX_TRACE_CAPACITY``)."""
_EVENT_FIELDS = ("time_ns", "kind", "offset", "size", "core", "tag", "handle", "aux")


class TraceEvent(NamedTuple):
    """One event. ``aux`` is the alignment for ``alloc`` and ``failed``, the old offset for
    ``move``, 0 for ``free``; ``handle`` pairs a ``free`` (or ``move``) with its ``alloc``
    (0 for ``failed``)."""

    time_ns: int
    kind: str
    offset: int
    size: int
    core: int
    tag: str | None
    handle: int
    aux: int


@dataclass
class Trace:
    """The events of one pool, oldest first, with the pool's configuration and what was lost.

    ``stats_at_start`` and ``stats_at_stop`` are ``PoolStats.as_dict()`` when recording began
    and ended (empty when unknown): a replay compares its outcome with them.
    """

    pool: str
    config: dict[str, Any]
    events: list[TraceEvent] = field(default_factory=list)
    dropped: int = 0
    stats_at_start: dict[str, Any] = field(default_factory=dict)
    stats_at_stop: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether the trace can be replayed faithfully: nothing dropped, and the pool held no
        block when recording began."""
        return self.dropped == 0 and self.stats_at_start.get("blocks_in_use", 0) == 0

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
        """The trace as a JSON-ready dict (format ``npumem-trace``, version 1). Tags are stored
        once, in ``tags``; events are rows indexing them (-1: no tag)."""
        tags: dict[str, int] = {}
        rows = []
        for e in self.events:
            tag = -1 if e.tag is None else tags.setdefault(e.tag, len(tags))
            rows.append([e.time_ns, e.kind, e.offset, e.size, e.core, tag, e.handle, e.aux])
        return {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "pool": self.pool,
            "config": self.config,
            "dropped": self.dropped,
            "stats_at_start": self.stats_at_start,
            "stats_at_stop": self.stats_at_stop,
            "tags": list(tags),
            "event_fields": list(_EVENT_FIELDS),
            "events": rows,
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the trace as JSON to ``path``; returns the path."""
        return write_json(path, self.to_json_obj())

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any], *, where: str = "trace") -> Trace:
        """Read a dict made by :meth:`to_json_obj`; :class:`FileFormatError` names what is
        wrong."""
        r = Reader(where)
        r.header(obj, TRACE_FORMAT, TRACE_VERSION)
        config = r.field(obj, "config", dict)
        for key in ("capacity", "cores", "chunk_size", "min_block", "bank_size", "alignment"):
            value = r.non_negative(r.field(config, key, int), f"config.{key}")
            if value == 0:
                raise r.fail(f"config.{key} must be > 0")
        tags = r.field(obj, "tags", list)
        if not all(isinstance(t, str) for t in tags):
            raise r.fail("tags must be a list of strings")
        if r.field(obj, "event_fields", list) != list(_EVENT_FIELDS):
            raise r.fail(f"event_fields must be {list(_EVENT_FIELDS)}")
        events = []
        last = 0
        for i, row in enumerate(r.field(obj, "events", list)):
            row = r.int_row(row, len(_EVENT_FIELDS), "event", i)
            t, kind, offset, size, core, tag, handle, aux = row
            if kind not in EVENT_KINDS:
                raise r.fail(f"event {i}: kind must be one of {EVENT_KINDS}, got {kind!r}")
            if isinstance(tag, bool) or not isinstance(tag, int) or not -1 <= tag < len(tags):
                raise r.fail(f"event {i}: tag index {tag!r} is not in tags (or -1)")
            nums = [r.non_negative(v, f"event {i}") for v in (t, offset, size, core, handle, aux)]
            if nums[0] < last:
                raise r.fail(f"event {i}: time {nums[0]} goes back (events are oldest first)")
            last = nums[0]
            name = tags[tag] if tag >= 0 else None
            events.append(TraceEvent(nums[0], kind, nums[1], nums[2], nums[3], name, *nums[4:]))
        trace = cls(
            pool=r.field(obj, "pool", str),
            config=config,
            events=events,
            dropped=r.non_negative(r.field(obj, "dropped", int), "dropped"),
            stats_at_start=r.field(obj, "stats_at_start", dict),
            stats_at_stop=r.field(obj, "stats_at_stop", dict),
        )
        check_trace(trace, where)
        return trace

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a trace file written by :meth:`save`."""
        return cls.from_json_obj(read_json(path), where=str(path))

    def __repr__(self) -> str:
        return f"<Trace of {self.pool!r}: {len(self.events)} events, {self.dropped} dropped>"


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file (the same as :meth:`Trace.load`)."""
    return Trace.load(path)


class TraceRecorder:
    """Record a pool's events into :attr:`trace`: :meth:`start`, :meth:`drain` now and then (a
    :class:`~npumem.monitor.Monitor` can do it on every sample), :meth:`stop`. Also a context
    manager. ``capacity`` is the size of the Rust rings (events kept between two drains, all
    cores together, 64 bytes each)."""

    def __init__(self, pool: Pool, *, capacity: int = 1 << 16) -> None:
        from npumem.errors import ArgumentTypeError, InvalidArgumentError

        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise ArgumentTypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if not 1 <= capacity <= MAX_TRACE_CAPACITY:
            raise InvalidArgumentError(
                f"capacity must be between 1 and {MAX_TRACE_CAPACITY} events, got {capacity}"
            )
        self.pool = pool
        self.capacity = capacity
        self.trace = Trace(pool=str(pool.name), config=pool_config(pool))
        self._lock = threading.Lock()
        self._running = False

    @property
    def running(self) -> bool:
        """Whether events are being recorded."""
        return self._running

    def start(self) -> TraceRecorder:
        """Start recording (a fresh trace in the pool; this recorder's events are kept)."""
        with self._lock:
            self.trace.stats_at_start = self.pool.stats().as_dict()
            self.pool.trace_start(self.capacity)
            self._running = True
        return self

    def drain(self) -> int:
        """Move the events recorded so far into :attr:`trace`; returns how many."""
        with self._lock:
            return self._drain_locked()

    def _drain_locked(self) -> int:
        raw = self.pool.trace_drain()
        events = self.trace.events
        if raw and events and raw[0][0] < events[-1].time_ns:
            # An event still being written at the last drain came in late: keep time order.
            events.extend(TraceEvent._make(e) for e in raw)
            events.sort(key=lambda e: e.time_ns)
        else:
            events.extend(TraceEvent._make(e) for e in raw)
        self.trace.dropped = self.pool.trace_status().dropped
        return len(raw)

    def stop(self) -> Trace:
        """Stop recording, drain the rest, and return :attr:`trace`."""
        with self._lock:
            if self._running:
                self.pool.trace_stop()
                self._running = False
                self._drain_locked()
                self.trace.stats_at_stop = self.pool.stats().as_dict()
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
