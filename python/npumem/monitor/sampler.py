"""The monitor: samples a pool's stats (in a background thread or on demand), keeps a bounded
history, and raises alerts when usage or fragmentation pass thresholds.

An alert fires when a value crosses its threshold upwards and fires again only after a sample
has seen the value back below the threshold (re-armed): a pool that stays above 90% gives one
alert, not one per sample. Alerts go to the `npumem.monitor` logger (`WARNING` when they
fire, `INFO` when they clear) and to the callbacks given.

    >>> import npumem
    >>> from npumem.monitor import Monitor
    >>> pool = npumem.Pool(16 << 20, cores=1, name="example")
    >>> seen = []
    >>> mon = Monitor(pool, thresholds={"usage": 0.5}, callbacks=[seen.append])
    >>> big = pool.alloc(12 << 20)
    >>> mon.sample().usage
    0.75
    >>> [(a.kind, a.firing) for a in seen]
    [('usage', True)]
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from npumem._core import Pool
from npumem._fork_safe import ForkSafeRLock
from npumem._shown import shown
from npumem.errors import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:
    from npumem import PoolStats

__all__ = ["Alert", "AlertCallback", "Monitor", "Sample", "SampleHook", "Thresholds"]

logger = logging.getLogger("npumem.monitor")


@dataclass(frozen=True, slots=True)
class Sample:
    """The figures of one `stats()` call. `time` is seconds since the monitor was made
    (monotonic clock), `wall_time` the Unix time."""

    time: float
    wall_time: float
    usable_capacity: int
    bytes_in_use: int
    bytes_free: int
    peak_bytes_in_use: int
    largest_free_block: int
    external_fragmentation: float
    alloc_count: int
    free_count: int
    failed_allocs: int
    overflow_allocs: int
    blocks_in_use: int

    @classmethod
    def from_stats(cls, stats: PoolStats, t: float, wall: float) -> Sample:
        """A sample of `stats` taken at `t` (monitor clock) and `wall` (Unix time)."""
        return cls(
            time=t,
            wall_time=wall,
            usable_capacity=stats.usable_capacity,
            bytes_in_use=stats.bytes_in_use,
            bytes_free=stats.bytes_free,
            peak_bytes_in_use=stats.peak_bytes_in_use,
            largest_free_block=stats.largest_free_block,
            external_fragmentation=stats.external_fragmentation,
            alloc_count=stats.alloc_count,
            free_count=stats.free_count,
            failed_allocs=stats.failed_allocs,
            overflow_allocs=stats.overflow_allocs,
            blocks_in_use=stats.blocks_in_use,
        )

    @property
    def usage(self) -> float:
        """`bytes_in_use / usable_capacity` (0.0 for an empty arena)."""
        return self.bytes_in_use / self.usable_capacity if self.usable_capacity else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict (with `usage`)."""
        d = {name: getattr(self, name) for name in self.__slots__}
        d["usage"] = self.usage
        return d


def _fraction(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentTypeError(
            f"thresholds: {name} must be a number or None, got {type(value).__name__}"
        )
    v = float(value)
    if not 0.0 < v <= 1.0:
        raise InvalidArgumentError(
            f"thresholds: {name} must be a fraction in (0, 1] (0.9 is 90%), got {shown(value)}"
        )
    return v


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When to alert: `usage` (bytes in use / usable capacity) and `fragmentation`
    (`external_fragmentation`) are fractions in (0, 1], `None` to switch one off;
    `failed_allocs` alerts when a sample sees new failed allocations."""

    usage: float | None = 0.90
    fragmentation: float | None = 0.30
    failed_allocs: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "usage", _fraction(self.usage, "usage"))
        object.__setattr__(self, "fragmentation", _fraction(self.fragmentation, "fragmentation"))
        if not isinstance(self.failed_allocs, bool):
            raise ArgumentTypeError(
                f"thresholds: failed_allocs must be a bool, got {type(self.failed_allocs).__name__}"
            )

    @classmethod
    def of(cls, value: Thresholds | Mapping[str, Any] | None) -> Thresholds:
        """`value` as thresholds: a `Thresholds`, a dict of its fields (others keep
        their defaults), or `None` for the defaults."""
        if value is None:
            return cls()
        if isinstance(value, Thresholds):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"usage", "fragmentation", "failed_allocs"})
            if unknown:
                raise InvalidArgumentError(
                    f"thresholds: unknown key(s) {', '.join(map(repr, unknown))}; expected "
                    "'usage', 'fragmentation', 'failed_allocs'"
                )
            return cls(**value)
        raise ArgumentTypeError(
            f"thresholds must be a Thresholds, a dict or None, got {type(value).__name__}"
        )


@dataclass(frozen=True, slots=True)
class Alert:
    """A threshold crossed (`firing`) or cleared (back below). `kind` is `"usage"`,
    `"fragmentation"` or `"failed_allocs"`; `value` is the sampled figure (new failures
    for `failed_allocs`)."""

    pool: str
    kind: str
    firing: bool
    value: float
    threshold: float
    sample: Sample

    @property
    def message(self) -> str:
        """A one-line description."""
        if self.kind == "failed_allocs":
            if self.firing:
                return (
                    f"pool {self.pool!r}: {self.value:.0f} allocation(s) failed since the last "
                    f"sample (largest free block {self.sample.largest_free_block:,} bytes, "
                    f"{self.sample.bytes_free:,} bytes free)"
                )
            return f"pool {self.pool!r}: no new failed allocations"
        what = "usage" if self.kind == "usage" else "fragmentation"
        if self.firing:
            return (
                f"pool {self.pool!r}: {what} {self.value:.1%} passed the "
                f"{self.threshold:.0%} threshold"
            )
        return f"pool {self.pool!r}: {what} {self.value:.1%} back below {self.threshold:.0%}"


AlertCallback = Callable[[Alert], object]
"""Called with every alert, firing or clearing."""
SampleHook = Callable[[Sample], object]
"""Called with every sample, after the alerts of that sample."""


class Monitor:
    """Watch `pool`: `sample()` takes one sample now; `start()` samples every
    `interval` seconds in a daemon thread until `stop()` (also a context manager).

    `history` bounds the samples kept (the oldest go first); `thresholds` is a
    `Thresholds` or a dict such as `{"usage": 0.8}` (defaults: 90% usage, 30%
    fragmentation, any failed allocation); `callbacks` receive every `Alert`;
    `on_sample` hooks receive every `Sample`. A callback or hook that raises is
    logged and does not stop the monitor. In a process forked while another thread was
    recording a sample, the monitor's calls raise `PoolBusyError`: make a new one there.

    The sampling thread holds the monitor only while it takes a sample, so keep a reference
    to a started monitor for as long as it should sample: once the program drops its last
    one, the monitor is freed even if `stop()` was never called (and the pool with it, unless
    something else holds the pool), and the thread ends within one `interval`.
    """

    def __reduce__(self) -> NoReturn:
        # A copy would share this monitor's history, lock and sampling thread, and watch the
        # same live pool (copy.copy, deepcopy and pickle all come here).
        raise TypeError(
            "cannot copy or pickle a 'Monitor' object: it watches a live pool from its own "
            "thread (make a new Monitor; its samples and alerts are values and pickle)"
        )

    def __init__(
        self,
        pool: Pool,
        *,
        interval: float = 1.0,
        thresholds: Thresholds | Mapping[str, Any] | None = None,
        history: int = 3600,
        callbacks: Iterable[AlertCallback] = (),
        on_sample: Iterable[SampleHook] = (),
    ) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int | float):
            raise ArgumentTypeError(f"interval must be a number, got {type(interval).__name__}")
        if not 0 < interval <= threading.TIMEOUT_MAX:  # NaN and infinity too
            raise InvalidArgumentError(
                f"interval must be > 0 seconds, finite and at most {threading.TIMEOUT_MAX:g} "
                f"(the longest a thread can wait), got {interval}"
            )
        if isinstance(history, bool) or not isinstance(history, int):
            raise ArgumentTypeError(f"history must be an int, got {type(history).__name__}")
        if history < 1:
            raise InvalidArgumentError(f"history must keep at least 1 sample, got {history}")
        if not isinstance(pool, Pool):
            raise ArgumentTypeError(f"pool must be an npumem.Pool, got {type(pool).__name__}")
        given = {"callbacks": callbacks, "on_sample": on_sample}
        functions: dict[str, list[Any]] = {}
        for name, fns in given.items():
            try:
                functions[name] = list(fns)  # once: an iterator is read here only
            except TypeError:
                raise ArgumentTypeError(
                    f"{name} must be an iterable of callables, got {type(fns).__name__}"
                ) from None
            if not all(callable(f) for f in functions[name]):
                raise ArgumentTypeError(f"{name} must be callables")
        self.pool = pool
        self.interval = float(interval)
        self.thresholds = Thresholds.of(thresholds)
        self._history: deque[Sample] = deque(maxlen=history)
        self._alerts: deque[Alert] = deque(maxlen=history)
        self._callbacks = functions["callbacks"]
        self._hooks = functions["on_sample"]
        self._armed = {"usage": True, "fragmentation": True, "failed_allocs": True}
        self._last_failed: int | None = None
        self._lock = ForkSafeRLock("Monitor")
        self._clock0 = time.monotonic()
        # The running thread's stop signal: each `start()` makes its thread a new one.
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples_taken = 0
        """Samples taken since the monitor was made (the history keeps the last ones)."""

    # ----- sampling --------------------------------------------------------------------------

    def sample(self) -> Sample:
        """Take one sample now: read `stats()`, record it, raise the alerts it causes, run the
        hooks. Thread-safe (the background thread calls this too): the stats and the clock are
        read under the monitor's lock, so samples are recorded in the order they were taken,
        the history stays in time order and each failed allocation is counted once."""
        with self._lock:
            stats = self.pool.stats()
            s = Sample.from_stats(stats, time.monotonic() - self._clock0, time.time())
            self._history.append(s)
            self.samples_taken += 1
            alerts = self._evaluate(s)
            self._alerts.extend(alerts)
        for alert in alerts:
            (logger.warning if alert.firing else logger.info)("%s", alert.message)
            for cb in self._callbacks:
                self._call(cb, alert, "alert callback")
        for hook in self._hooks:
            self._call(hook, s, "sample hook")
        return s

    @staticmethod
    def _call(fn: Callable[[Any], object], arg: object, what: str) -> None:
        try:
            fn(arg)
        except Exception:
            logger.exception("npumem.monitor: %s %r raised", what, fn)

    def _evaluate(self, s: Sample) -> list[Alert]:
        alerts: list[Alert] = []
        name = str(self.pool.name)
        th = self.thresholds
        for kind, value, limit in (
            ("usage", s.usage, th.usage),
            ("fragmentation", s.external_fragmentation, th.fragmentation),
        ):
            if limit is None:
                continue
            if value >= limit and self._armed[kind]:
                self._armed[kind] = False
                alerts.append(Alert(name, kind, True, value, limit, s))
            elif value < limit and not self._armed[kind]:
                self._armed[kind] = True
                alerts.append(Alert(name, kind, False, value, limit, s))
        new_failures = 0 if self._last_failed is None else s.failed_allocs - self._last_failed
        self._last_failed = s.failed_allocs
        if th.failed_allocs:
            if new_failures > 0 and self._armed["failed_allocs"]:
                self._armed["failed_allocs"] = False
                alerts.append(Alert(name, "failed_allocs", True, new_failures, 0, s))
            elif new_failures == 0 and not self._armed["failed_allocs"]:
                self._armed["failed_allocs"] = True
                alerts.append(Alert(name, "failed_allocs", False, 0, 0, s))
        return alerts

    # ----- background thread -----------------------------------------------------------------

    def start(self) -> Monitor:
        """Sample every `interval` seconds in a daemon thread (the first sample at once)."""
        if self._thread is not None and self._thread.is_alive():
            return self
        # A new event for each thread: a thread stopped from its own callback or hook is still
        # running its sample when a `start()` there makes its successor, and must still find
        # its own event set, not one cleared for the new thread. (In a forked child, a new
        # event also holds no lock that a thread of the parent held at the fork.)
        self._stop = threading.Event()
        # The thread holds the monitor only weakly between samples (see `_sample_until_stopped`).
        self._thread = threading.Thread(
            target=_sample_until_stopped,
            args=(weakref.ref(self), self._stop),
            name=f"npumem-monitor-{self.pool.name}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the background thread (waits for it, unless called from it: a callback or hook)
        and take one last sample. A `start()` after it, even from a callback or hook of the
        thread stopped, starts a new thread: the stopped one ends after its sample all the
        same."""
        thread, stop = self._thread, self._stop
        self._thread = None
        if thread is not None:
            stop.set()
            # From a callback or hook, in the sampling thread itself: it ends after this sample.
            if thread is not threading.current_thread():
                thread.join()
            self.sample()

    @property
    def running(self) -> bool:
        """Whether the background thread is sampling."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----- results ---------------------------------------------------------------------------

    @property
    def history(self) -> list[Sample]:
        """The samples kept, oldest first."""
        with self._lock:
            return list(self._history)

    @property
    def alerts(self) -> list[Alert]:
        """The alerts raised so far (bounded like the history), oldest first."""
        with self._lock:
            return list(self._alerts)

    @property
    def firing(self) -> list[str]:
        """The kinds of alert that are firing now (not yet cleared)."""
        with self._lock:
            return [k for k, armed in self._armed.items() if not armed]

    def add_callback(self, callback: AlertCallback) -> None:
        """Call `callback` with every later alert."""
        if not callable(callback):
            raise ArgumentTypeError("callback must be callable")
        self._callbacks.append(callback)

    def add_sample_hook(self, hook: SampleHook) -> None:
        """Call `hook` with every later sample."""
        if not callable(hook):
            raise ArgumentTypeError("hook must be callable")
        self._hooks.append(hook)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"<Monitor of {self.pool.name!r} ({state}): {self.samples_taken} samples, "
            f"every {self.interval:g} s>"
        )


def _sample_until_stopped(ref: weakref.ref[Monitor], stop: threading.Event) -> None:
    """The sampling thread of a started monitor: sample, then wait `interval` seconds or until
    `stop` is set. The thread holds the monitor (and through it the pool) only while it takes
    a sample: once the program drops its last reference to a monitor it never stopped, the
    monitor is freed (its pool too, unless something else holds it), and the thread ends
    when it next wakes."""
    while True:
        monitor = ref()
        if monitor is None:
            return
        interval = monitor.interval
        try:
            monitor.sample()
        except BaseException:
            # Nothing but `stop()` (or the monitor's end) ends the sampling: a callback or
            # hook that raises even `SystemExit` or `KeyboardInterrupt` in this thread
            # (signals go to the main thread) is logged, and the next sample comes on time.
            logger.exception("npumem.monitor: sampling failed")
        monitor = None  # not held while waiting
        if stop.wait(interval):
            return
