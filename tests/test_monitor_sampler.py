"""npumem.monitor.Monitor: samples, bounded history, threshold alerts that fire on crossing and
re-arm below, logging, callbacks, the background thread, and argument checks."""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable

import pytest

import npumem
from npumem.monitor import Alert, Monitor, Sample, Thresholds
from npumem.monitor import sampler as sampler_module

MIB = 1 << 20


def make_pool(capacity: int = 16 * MIB) -> npumem.Pool:
    return npumem.Pool(capacity, cores=1, name="mon")


def kinds(alerts: list[Alert]) -> list[tuple[str, bool]]:
    return [(a.kind, a.firing) for a in alerts]


def test_sample_reads_the_stats_now() -> None:
    pool = npumem.Pool(16 * MIB, cores=1, name="mon", run_tails=False)  # whole-chunk runs
    mon = Monitor(pool)
    blk = pool.alloc(3 * MIB)
    s = mon.sample()
    stats = pool.stats()
    assert isinstance(s, Sample)
    assert s.bytes_in_use == stats.bytes_in_use == 4 * MIB  # 3 MiB rounds up to whole chunks
    assert s.usage == pytest.approx(0.25)
    assert (s.alloc_count, s.free_count, s.blocks_in_use) == (1, 0, 1)
    assert s.largest_free_block == stats.largest_free_block
    assert s.as_dict()["usage"] == s.usage
    blk.free()
    assert mon.sample().bytes_in_use == 0
    assert len(mon.history) == 2 and mon.samples_taken == 2


def test_usage_alert_fires_once_on_crossing_and_rearms_below() -> None:
    pool = make_pool()
    got: list[Alert] = []
    mon = Monitor(pool, thresholds={"usage": 0.5, "fragmentation": None}, callbacks=[got.append])
    mon.sample()
    assert got == []
    big = pool.alloc(10 * MIB)  # 62.5%
    for _ in range(5):
        mon.sample()
    assert kinds(got) == [("usage", True)], "one alert while above, not one per sample"
    assert mon.firing == ["usage"]
    assert got[0].value == pytest.approx(10 / 16) and got[0].threshold == 0.5
    assert "62.5%" in got[0].message and "50%" in got[0].message
    big.free()
    mon.sample()
    mon.sample()
    assert kinds(got) == [("usage", True), ("usage", False)]
    assert mon.firing == []
    again = pool.alloc(9 * MIB)
    mon.sample()
    assert kinds(got)[-1] == ("usage", True), "re-armed after going below"
    again.free()
    assert kinds(mon.alerts) == kinds(got)
    assert len(got) == 3


def test_fragmentation_alert_fires_and_clears() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, core_reserve=0, name="frag")
    got: list[Alert] = []
    mon = Monitor(pool, thresholds={"usage": None, "fragmentation": 0.3}, callbacks=[got.append])
    # Four 2 MiB chunks as runs; free every other one: free space split in two.
    blocks = [pool.alloc(2 * MIB) for _ in range(4)]
    blocks[0].free()
    blocks[2].free()
    s = mon.sample()
    assert s.external_fragmentation == pytest.approx(0.5)
    assert kinds(got) == [("fragmentation", True)]
    mon.sample()
    assert len(got) == 1
    blocks[1].free()  # 0..6 MiB free in one run: 6/8 largest, 1 - 6/6 = 0
    s = mon.sample()
    assert s.external_fragmentation == 0.0
    assert kinds(got) == [("fragmentation", True), ("fragmentation", False)]
    blocks[3].free()


def test_failed_allocations_alert_and_logging(caplog: pytest.LogCaptureFixture) -> None:
    pool = make_pool()
    mon = Monitor(pool, thresholds={"usage": None, "fragmentation": None})
    mon.sample()
    with caplog.at_level(logging.INFO, logger="npumem.monitor"):
        held = pool.alloc(10 * MIB)
        with pytest.raises(npumem.OutOfMemoryError):
            pool.alloc(8 * MIB)
        mon.sample()
        mon.sample()
    assert kinds(mon.alerts) == [("failed_allocs", True), ("failed_allocs", False)]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(warnings) == 1 and "allocation(s) failed" in warnings[0].getMessage()
    assert len(infos) == 1 and "no new failed allocations" in infos[0].getMessage()
    assert mon.alerts[0].value == 1
    held.free()


def test_history_is_bounded_and_hooks_see_every_sample() -> None:
    pool = make_pool()
    seen: list[Sample] = []
    mon = Monitor(pool, history=3, on_sample=[seen.append])
    for _ in range(7):
        mon.sample()
    assert len(seen) == 7
    assert mon.history == seen[-3:]
    assert mon.samples_taken == 7
    times = [s.time for s in seen]
    assert times == sorted(times)


def test_a_raising_callback_is_logged_and_sampling_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = make_pool()

    def broken(_: object) -> None:
        raise RuntimeError("boom")

    mon = Monitor(pool, thresholds={"usage": 0.1}, callbacks=[broken], on_sample=[broken])
    blk = pool.alloc(4 * MIB)
    with caplog.at_level(logging.ERROR, logger="npumem.monitor"):
        mon.sample()
    assert sum("raised" in r.getMessage() for r in caplog.records) == 2
    assert kinds(mon.alerts) == [("usage", True)]
    blk.free()


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt])
def test_a_hook_raising_a_base_exception_in_the_sampling_thread_does_not_end_it(
    raised: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    pool = make_pool()

    def broken(_: object) -> None:
        # The last sample, taken by `stop()` in this thread, lets its exception through.
        if threading.current_thread() is not threading.main_thread():
            raise raised(2)

    with caplog.at_level(logging.ERROR, logger="npumem.monitor"):
        mon = Monitor(pool, interval=0.01, on_sample=[broken]).start()
        deadline = time.monotonic() + 5
        while mon.samples_taken < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert mon.running and mon.samples_taken >= 5
        mon.stop()
    assert any(r.getMessage() == "npumem.monitor: sampling failed" for r in caplog.records)


def test_a_hook_that_stops_its_monitor_ends_the_sampling_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = make_pool()
    mon: Monitor | None = None
    stopped_in: list[threading.Thread] = []
    stopped = threading.Event()

    def stop_it(_: object) -> None:
        assert mon is not None
        if not stopped_in:
            stopped_in.append(threading.current_thread())
            mon.stop()
            stopped.set()

    with caplog.at_level(logging.ERROR, logger="npumem.monitor"):
        mon = Monitor(pool, interval=0.01, on_sample=[stop_it])
        mon.start()
        assert stopped.wait(5)
        stopped_in[0].join(5)
        assert not stopped_in[0].is_alive() and not mon.running
    assert caplog.records == []


def test_a_hook_that_stops_and_starts_its_monitor_leaves_one_sampling_thread() -> None:
    # The hook's stop() cannot wait for the thread it runs in; the start() after it makes a
    # new thread at once, and the old one must still end after its sample.
    pool = npumem.Pool(16 * MIB, cores=1, name="restarted")
    mon: Monitor | None = None
    restarted = threading.Event()

    def restart(_: object) -> None:
        assert mon is not None
        if not restarted.is_set() and threading.current_thread() is not threading.main_thread():
            restarted.set()
            mon.stop()
            mon.start()

    def threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "npumem-monitor-restarted"]

    interval = 0.05
    mon = Monitor(pool, interval=interval, on_sample=[restart]).start()
    try:
        assert restarted.wait(5)
        deadline = time.monotonic() + 5
        while len(threads()) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(3 * interval)
        assert len(threads()) == 1 and mon.running, "one thread samples after the restart"
        # One thread takes a sample every interval: about 10 in 0.5 s, two would take 20.
        before = mon.samples_taken
        time.sleep(10 * interval)
        assert mon.samples_taken - before <= 13
        assert len(threads()) == 1
    finally:
        mon.stop()
    assert threads() == [] and not mon.running


def test_background_thread_samples_until_stopped() -> None:
    pool = make_pool()
    with Monitor(pool, interval=0.01) as mon:
        assert mon.running
        deadline = time.monotonic() + 5
        while mon.samples_taken < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert not mon.running
    taken = mon.samples_taken
    assert taken >= 5
    time.sleep(0.05)
    assert mon.samples_taken == taken, "no sample after stop"
    assert "stopped" in repr(mon)


def vm_size() -> int:
    """This process's virtual memory in bytes (a pool's arena counts in it as soon as made)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/statm is Linux")
def test_an_unstopped_monitor_and_its_pool_go_with_their_last_reference() -> None:
    # A pool does not take weak references: its arena leaving the address space shows that
    # it was freed (half of it is enough, whatever else maps or unmaps meanwhile).
    arena = 512 * MIB
    pool = npumem.Pool(arena, cores=1, backing="host", name="dropped")
    mon = Monitor(pool, interval=0.01).start()
    (thread,) = [t for t in threading.enumerate() if t.name == "npumem-monitor-dropped"]
    deadline = time.monotonic() + 5
    while mon.samples_taken < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mon.running and mon.samples_taken >= 3
    watched = weakref.ref(mon)
    with_pool = vm_size()
    del mon, pool
    gc.collect()
    thread.join(10)
    assert not thread.is_alive(), "the sampling thread outlived every reference to its monitor"
    gc.collect()
    assert watched() is None
    assert with_pool - vm_size() >= arena // 2, "the pool's arena was not released"


def test_thresholds_accept_dicts_and_objects() -> None:
    assert Thresholds.of(None) == Thresholds(0.9, 0.3, True)
    assert Thresholds.of({"usage": 0.8}) == Thresholds(0.8, 0.3, True)
    t = Thresholds(usage=None, fragmentation=1)
    assert Thresholds.of(t) is t and t.fragmentation == 1.0


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"interval": 0}, npumem.InvalidArgumentError, "interval must be > 0"),
        ({"interval": float("inf")}, npumem.InvalidArgumentError, "finite"),
        ({"interval": "1"}, npumem.ArgumentTypeError, "interval must be a number"),
        ({"history": 0}, npumem.InvalidArgumentError, "at least 1 sample"),
        ({"history": 2.5}, npumem.ArgumentTypeError, "history must be an int"),
        ({"thresholds": {"usage": 1.5}}, npumem.InvalidArgumentError, "fraction in (0, 1]"),
        ({"thresholds": {"usage": 0}}, npumem.InvalidArgumentError, "fraction in (0, 1]"),
        ({"thresholds": {"usage": "high"}}, npumem.ArgumentTypeError, "must be a number"),
        ({"thresholds": {"memory": 0.5}}, npumem.InvalidArgumentError, "unknown key(s) 'memory'"),
        ({"thresholds": 0.9}, npumem.ArgumentTypeError, "thresholds must be"),
        ({"callbacks": [1]}, npumem.ArgumentTypeError, "callables"),
        # A thread cannot wait that long: its first wait raised and the monitor stopped.
        ({"interval": 1e300}, npumem.InvalidArgumentError, "at most"),
        ({"callbacks": 5}, npumem.ArgumentTypeError, "iterable of callables, got int"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], error: type, text: str) -> None:
    pool = make_pool()
    with pytest.raises(error) as info:
        Monitor(pool, **kwargs)  # type: ignore[arg-type]
    assert text in str(info.value)
    assert isinstance(info.value, npumem.NpumemError)


def test_callbacks_given_as_a_generator_are_kept() -> None:
    # The check that they are callables used to read the generator up, leaving none to call.
    pool = npumem.Pool(1 << 20, cores=1)
    got: list[object] = []
    mon = Monitor(pool, thresholds={"usage": 0.01}, callbacks=(f for f in [got.append]))
    held = pool.alloc(64 << 10)
    mon.sample()
    assert len(got) == 1
    held.free()
    with pytest.raises(npumem.ArgumentTypeError, match=r"pool must be an npumem\.Pool"):
        Monitor(None)  # type: ignore[arg-type]


class _ReportingLock:
    """A reentrant lock that calls `on_contended` when a thread finds it held by another."""

    def __init__(self, on_contended: Callable[[], object]) -> None:
        self._lock = threading.RLock()
        self._on_contended = on_contended

    def __enter__(self) -> bool:
        if not self._lock.acquire(blocking=False):
            self._on_contended()
            self._lock.acquire()
        return True

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_concurrent_samples_are_recorded_in_time_order_and_count_failures_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Thread A (this test) samples; right after it has read the stats (when it reads the
    # clock) an allocation fails and thread B samples. B either finishes its sample (a
    # sample taken later is recorded first) or has to wait for A (found the monitor's lock
    # held): either way A goes on then, and the history must come out in time order.
    pool = npumem.Pool(1 * MIB, cores=1, name="race")
    got: list[Alert] = []
    mon = Monitor(pool, thresholds={"usage": None, "fragmentation": None}, callbacks=[got.append])
    mon.sample()
    go_on = threading.Event()
    monkeypatch.setattr(mon, "_lock", _ReportingLock(go_on.set))
    a_thread = threading.current_thread()
    b_threads: list[threading.Thread] = []

    def sample_b() -> None:
        mon.sample()
        go_on.set()

    def monotonic() -> float:
        if threading.current_thread() is a_thread and not b_threads:
            with pytest.raises(npumem.OutOfMemoryError):
                pool.alloc(2 * MIB)
            b_threads.append(threading.Thread(target=sample_b))
            b_threads[0].start()
            assert go_on.wait(60), "thread B neither finished nor waited for the lock"
        return time.monotonic()

    monkeypatch.setattr(
        sampler_module, "time", types.SimpleNamespace(monotonic=monotonic, time=time.time)
    )
    mon.sample()
    b_threads[0].join()
    monkeypatch.undo()
    mon.sample()
    history = mon.history
    assert len(history) == 4
    assert [s.time for s in history] == sorted(s.time for s in history)
    assert [s.failed_allocs for s in history] == [0, 0, 1, 1]
    assert kinds(got) == [("failed_allocs", True), ("failed_allocs", False)]
    assert got[0].value == 1
