"""The event trace from Python: what it records, the recorder, JSON round trips, and replay
(reproducing a recorded outcome exactly, and what-if configurations)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

import npumem
from npumem.monitor import FileFormatError, Trace, TraceEvent, TraceRecorder, load_trace
from npumem.monitor import trace as trace_module
from npumem.workloads import replay_trace
from schema_helpers import assert_valid

MIB = 1 << 20


def test_pool_trace_api() -> None:
    pool = npumem.Pool(8 * MIB, cores=1, name="tr")
    assert pool.trace_drain() == []
    assert pool.trace_status().as_dict() == {
        "enabled": False,
        "capacity": 0,
        "recorded": 0,
        "drained": 0,
        "dropped": 0,
    }
    pool.trace_start(capacity=100)
    a = pool.alloc(3000, align=256, tag="act")
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(8 * MIB, tag="huge")
    offset, handle = a.offset, a.handle
    a.free()
    pool.trace_stop()
    pool.alloc(10).free()  # not recorded
    events = [TraceEvent._make(e) for e in pool.trace_drain()]
    assert [e.kind for e in events] == ["alloc", "failed", "free"]
    alloc, failed, free = events
    assert (alloc.offset, alloc.size, alloc.tag, alloc.handle, alloc.aux) == (
        offset,
        3000,
        "act",
        handle,
        256,
    )
    assert (failed.size, failed.tag, failed.handle, failed.aux) == (8 * MIB, "huge", 0, 64)
    assert (free.offset, free.handle, free.tag) == (offset, handle, "act")
    assert alloc.time_ns <= failed.time_ns <= free.time_ns
    st = pool.trace_status()
    assert (st.enabled, st.recorded, st.drained, st.dropped) == (False, 3, 3, 0)
    assert st.capacity >= 100


@pytest.mark.parametrize(
    ("capacity", "error", "text"),
    [
        (0, npumem.InvalidArgumentError, "between 1 and"),
        (1 << 40, npumem.InvalidArgumentError, "between 1 and"),
        (-5, npumem.InvalidArgumentError, "got -5"),
        (2.5, npumem.ArgumentTypeError, "capacity must be an int"),
        ("10", npumem.ArgumentTypeError, "capacity must be an int"),
    ],
)
def test_bad_trace_capacity(capacity: object, error: type, text: str) -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    with pytest.raises(error, match=text):
        pool.trace_start(capacity)  # type: ignore[arg-type]
    assert not pool.trace_status().enabled
    with pytest.raises(error, match=text):
        TraceRecorder(pool, capacity=capacity).start()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cores", "capacity", "per_ring"),
    [(1, 4, 16), (1, 100, 128), (2, 100, 64), (4, 4, 16), (4, 100, 32), (4, 1000, 256)],
)
def test_trace_capacity_is_per_ring_as_documented(cores: int, capacity: int, per_ring: int) -> None:
    # Every ring holds capacity / cores events rounded up to a power of two (at least 16);
    # there are cores + 1 rings; one thread keeps one ring's worth.
    pool = npumem.Pool(8 * MIB, cores=cores)
    pool.trace_start(capacity)
    for _ in range(2000):
        pool.alloc(64).free()
    pool.trace_stop()
    assert len(pool.trace_drain()) == per_ring
    status = pool.trace_status()
    assert status.capacity == per_ring * (cores + 1)
    assert status.dropped == 4000 - per_ring


def test_trace_start_docstring_states_the_ring_sizes() -> None:
    for doc in (npumem.Pool.trace_start.__doc__, stub_doc("Pool", "trace_start")):
        text = " ".join((doc or "").split())
        assert "up to `capacity` events (all cores together" not in text
        assert "`capacity / cores` events rounded up to a power of two, at least 16" in text
        assert "`cores + 1` times that in all (`trace_status().capacity`)" in text
        assert "one thread keeps at most one ring's worth" in text


def stub_doc(cls: str, name: str) -> str | None:
    """The docstring of `cls.name` in `npumem/_core.pyi`."""
    import ast

    stub = Path(npumem.__file__).with_name("_core.pyi")
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return ast.get_docstring(item)
    return None


def test_overflow_is_counted_not_hidden() -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    with TraceRecorder(pool, capacity=16) as rec:
        for _ in range(100):
            pool.alloc(100).free()
    trace = rec.trace
    assert len(trace.events) == 16 and trace.dropped == 184
    assert not trace.complete


def workload(pool: npumem.Pool, seed: int, steps: int = 3000) -> None:
    """Allocations of mixed sizes, some failing for lack of memory, frees in random order."""
    rng = random.Random(seed)
    held: list[npumem.Block] = []
    for _ in range(steps):
        if held and rng.random() < 0.45:
            held.pop(rng.randrange(len(held))).free()
            continue
        size = rng.choice([rng.randint(1, 5000), rng.randint(5000, 600_000), 3 * MIB])
        with contextlib.suppress(npumem.OutOfMemoryError):
            held.append(pool.alloc(size, tag=rng.choice(["a", "b", None])))
    for b in held:
        b.free()


def _allocating_function(name: str) -> Callable[[npumem.Pool], npumem.Block]:
    """A function compiled at run time (a code object of its own) that allocates a block."""
    namespace: dict[str, Any] = {}
    exec(f"def {name}(pool):\n    return pool.alloc(256)\n", namespace)
    return cast("Callable[[npumem.Pool], npumem.Block]", namespace[name])


def test_stacks_of_overwritten_events_are_let_go() -> None:
    # A pending stack holds its frames' code objects: the reference count tells whether the
    # pool still keeps the stack (counted outside the asserts, which hold values of their own).
    pool = npumem.Pool(16 << 20, cores=1)
    early = _allocating_function("early")
    code = early.__code__
    before = sys.getrefcount(code)
    pool.trace_start(64, stacks=True)
    early(pool).free()
    waiting = sys.getrefcount(code)
    assert waiting == before + 1, "the stack waits for its event"
    for _ in range(2 * pool.trace_status().capacity):
        pool.alloc(256).free()
    after = sys.getrefcount(code)
    assert after == before, "its event was overwritten: the stack goes"
    allocs = [e for e in pool.trace_drain() if e[1] == "alloc"]
    assert allocs and all(e[8] for e in allocs), "the latest allocations keep their stacks"
    pool.trace_stop()


def test_frames_looked_up_are_forgotten_when_a_trace_starts() -> None:
    pool = npumem.Pool(16 << 20, cores=1)
    pool.trace_start(1024, stacks=True)
    made = _allocating_function("made_at_run_time")
    code = made.__code__
    before = sys.getrefcount(code)
    made(pool).free()
    (alloc,) = [e for e in pool.trace_drain() if e[1] == "alloc"]
    stack = alloc[8]
    assert stack is not None and stack[0][2] == "made_at_run_time"
    cached = sys.getrefcount(code)
    assert cached == before + 1, "the drain looked it up and keeps it"
    pool.trace_stop()
    pool.trace_start(1024, stacks=True)
    after = sys.getrefcount(code)
    assert after == before, "a new trace forgets the frames"
    pool.trace_stop()


def test_recorder_drains_concurrently_and_keeps_time_order() -> None:
    pool = npumem.Pool(64 * MIB, cores=2, name="threads")
    rec = TraceRecorder(pool, capacity=1 << 16).start()
    threads = [threading.Thread(target=workload, args=(pool, s, 2000)) for s in (1, 2)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        rec.drain()
    for t in threads:
        t.join()
    trace = rec.stop()
    assert trace.dropped == 0 and trace.complete
    times = [e.time_ns for e in trace.events]
    assert times == sorted(times)
    live: dict[int, int] = {}
    for e in trace.events:
        if e.kind == "alloc":
            assert e.handle not in live
            live[e.handle] = e.size
        elif e.kind == "free":
            assert live.pop(e.handle) == e.size, "a free before its alloc, or lost"
    assert live == {}
    c = trace.counts()
    s = trace.stats_at_stop
    assert s is not None
    assert (c["alloc"], c["free"], c["failed"]) == (
        s.alloc_count,
        s.free_count,
        s.failed_allocs,
    )


def test_json_round_trip_is_exact(tmp_path: Path) -> None:
    pool = npumem.Pool(8 * MIB, cores=1, name="rt")
    with TraceRecorder(pool) as rec:
        workload(pool, 5, 500)
    trace = rec.trace
    assert trace.counts()["failed"] > 0 and any(e.tag is None for e in trace.events)
    back = load_trace(trace.save(tmp_path / "t.json"))
    assert back == trace
    assert Trace.from_json_obj(json.loads((tmp_path / "t.json").read_text())) == trace


# ----- the bound on the events a recorder keeps ----------------------------------------------


@pytest.mark.parametrize("pairs_per_drain", [1, 3, 4, 25])
def test_max_events_keeps_the_newest_in_time_order_and_counts_the_rest(
    pairs_per_drain: int,
) -> None:
    # 25 alloc/free pairs are 50 events; drains of 2, 6 and 8 events trim what the trace holds,
    # one drain of all 50 is itself longer than the bound.
    pool = npumem.Pool(8 * MIB, cores=1, name="bounded")
    rec = TraceRecorder(pool, max_events=7).start()
    sizes = []
    for i in range(25):
        size = 100 + i
        sizes.append(size)
        pool.alloc(size).free()
        if (i + 1) % pairs_per_drain == 0:
            rec.drain()
    trace = rec.stop()
    events = trace.events
    assert len(events) == 7
    assert [e.kind for e in events] == ["free", *["alloc", "free"] * 3]
    assert [e.size for e in events if e.kind == "alloc"] == sizes[-3:]
    handles = [e.handle for e in events]
    assert handles[1] == handles[2] and handles[3] == handles[4] and handles[5] == handles[6]
    times = [e.time_ns for e in events]
    assert times == sorted(times)
    assert trace.discarded == 43 and trace.dropped == 0
    assert not trace.complete, "the oldest events are gone"
    assert "43 discarded" in repr(trace)


def test_max_events_bounds_the_stacks_a_recorder_keeps() -> None:
    # Every allocation comes from a function of its own: a stack never seen before. The
    # recorder converts each stack once and keeps the conversion for the stacks seen again;
    # the stacks of the events it let go must go too, or a bounded recorder drained for
    # hours would grow without bound all the same.
    pool = npumem.Pool(8 * MIB, cores=1)
    rec = TraceRecorder(pool, max_events=10, stacks=True).start()
    functions = [_allocating_function(f"caller_{i}") for i in range(300)]
    for i, fn in enumerate(functions):
        fn(pool).free()
        if i % 20 == 19:
            rec.drain()
            assert len(rec._stacks) <= 2 * 10, "only a bounded number of stacks is kept"
    trace = rec.stop()
    assert len(trace.events) == 10 and trace.discarded == 590
    callers = [e.stack[0].function for e in trace.events if e.stack is not None]
    assert callers == [f"caller_{i}" for i in range(295, 300)], "the kept events keep theirs"
    assert len(rec._stacks) <= 2 * 10


def test_a_stack_seen_again_after_the_cache_let_it_go_is_converted_again() -> None:
    # Drains of 4 events with a bound of 4: each drain's events replace the last drain's.
    # The first drain brings a stack that comes back only in the last one, the others two
    # stacks never seen before; every drain ends with one stack twice. The cache keeps a
    # bounded number of stacks, a stack it let go is converted again when it comes back, and
    # events of one stack in one drain share one tuple.
    early = (("early.py", 1, "early"),)
    last = (("last.py", 2, "last"),)

    class Rings:
        def __init__(self) -> None:
            self.t = 0
            self.drains = 0

        def trace_drain(self) -> list[tuple[Any, ...]]:
            self.drains += 1
            fresh = [((f"fresh{self.drains}.py", i, "fresh"),) for i in range(2)]
            first = [early, fresh[0]] if self.drains in (1, 8) else fresh
            batch = []
            for stack in (*first, last, last):
                self.t += 1
                batch.append((self.t, "alloc", 0, 64, 0, None, self.t, 64, stack))
            return batch

        def trace_status(self) -> types.SimpleNamespace:
            return types.SimpleNamespace(dropped=0)

    pool = npumem.Pool(8 * MIB, cores=1)
    rec = TraceRecorder(pool, max_events=4, stacks=True)
    rec.pool = cast("npumem.Pool", Rings())
    for _ in range(8):
        rec.drain()
        events = rec.trace.events
        assert len(events) == 4
        assert events[2].stack == (trace_module.Frame("last.py", 2, "last"),)
        assert events[2].stack is events[3].stack
        assert len(rec._stacks) <= 2 * len(events), "only a bounded number of stacks is kept"
    assert rec.trace.events[0].stack == (trace_module.Frame("early.py", 1, "early"),)
    assert rec.trace.discarded == 7 * 4


class _FakeRings:
    """Stands in for a pool's trace rings: each drain returns the next batch given."""

    def __init__(self, *batches: list[int]) -> None:
        self.batches = list(batches)

    def trace_drain(self) -> list[tuple[Any, ...]]:
        times = self.batches.pop(0)
        return [(t, "alloc", 0, 64, 0, None, t, 64, None) for t in times]

    def trace_status(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(dropped=0)


@pytest.mark.parametrize(
    ("batches", "max_events", "kept", "discarded"),
    [
        # A late event (25) sorts in among those kept; the oldest go.
        (([10, 20, 30], [25, 40, 50]), 4, [25, 30, 40, 50], 2),
        # A late event in a batch longer than the bound goes with the oldest of the batch.
        (([10, 20], [5, 15, 60, 70, 80]), 3, [60, 70, 80], 4),
        # Within the bound nothing goes.
        (([10, 20], [15, 30]), 4, [10, 15, 20, 30], 0),
        (([10, 20], [15, 30]), None, [10, 15, 20, 30], 0),
    ],
)
def test_max_events_keeps_time_order_when_an_event_comes_in_late(
    batches: tuple[list[int], ...], max_events: int | None, kept: list[int], discarded: int
) -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    rec = TraceRecorder(pool, max_events=max_events)
    rec.pool = cast("npumem.Pool", _FakeRings(*batches))
    drained = [rec.drain() for _ in batches]
    assert drained == [len(b) for b in batches]
    assert [e.time_ns for e in rec.trace.events] == kept
    assert rec.trace.discarded == discarded


@pytest.mark.parametrize(
    ("max_events", "error", "text"),
    [
        (0, npumem.InvalidArgumentError, r"max_events must keep at least 1 event .*got 0"),
        (-5, npumem.InvalidArgumentError, "got -5"),
        (True, npumem.ArgumentTypeError, "max_events must be an int or None, got bool"),
        (2.5, npumem.ArgumentTypeError, "max_events must be an int or None, got float"),
        ("10", npumem.ArgumentTypeError, "max_events must be an int or None, got str"),
    ],
)
def test_bad_max_events(max_events: object, error: type, text: str) -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    with pytest.raises(error, match=text) as info:
        TraceRecorder(pool, max_events=max_events)  # type: ignore[arg-type]
    assert isinstance(info.value, npumem.NpumemError)
    assert not pool.trace_status().enabled
    with TraceRecorder(pool, max_events=2) as rec:  # the pool records as before
        pool.alloc(100).free()
        pool.alloc(200).free()
    assert [e.size for e in rec.trace.events] == [200, 200]
    assert rec.trace.discarded == 2


def test_by_default_a_recorder_keeps_every_event() -> None:
    """A trace to replay must be complete: no bound unless one is asked for."""
    pool = npumem.Pool(8 * MIB, cores=1)
    rec = TraceRecorder(pool)
    assert rec.max_events is None
    with rec:
        for _ in range(300):
            pool.alloc(100).free()
    assert len(rec.trace.events) == 600
    assert rec.trace.discarded == 0 and rec.trace.complete
    assert "discarded" not in repr(rec.trace)
    with TraceRecorder(pool, max_events=None) as unbounded:
        for _ in range(300):
            pool.alloc(100).free()
    assert len(unbounded.trace.events) == 600 and unbounded.trace.discarded == 0


def test_discarded_survives_a_round_trip_and_old_files_read_as_zero(tmp_path: Path) -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    with TraceRecorder(pool, max_events=3) as rec:
        for _ in range(4):
            pool.alloc(100).free()
    obj = rec.trace.to_json_obj()
    assert obj["discarded"] == 5
    assert_valid(obj)
    back = load_trace(rec.trace.save(tmp_path / "bounded.json"))
    assert back == rec.trace and back.discarded == 5 and not back.complete
    del obj["discarded"]  # as written before recorders had the bound
    assert_valid(obj)
    old = Trace.from_json_obj(obj)
    assert old.discarded == 0 and old.events == rec.trace.events


@pytest.mark.parametrize(
    ("mutate", "text"),
    [
        (lambda o: o.update(format="npumem-snapshot"), "format is 'npumem-snapshot'"),
        (lambda o: o.update(discarded=-1), "discarded must be an integer between 0 and"),
        (lambda o: o.update(discarded="3"), "field 'discarded' must be int, got str"),
        (lambda o: o.update(version=3), "version 3 is not supported"),
        (lambda o: o["events"][0].__setitem__(1, "malloc"), "kind must be one of"),
        (lambda o: o["events"][0].__setitem__(5, 99), "tag index 99 is not in tags"),
        (lambda o: o["events"][1].__setitem__(0, 0), "time 0 goes back"),
        (lambda o: o["events"].append([1, 2, 3]), "must be a list of 9 values"),
        (lambda o: o["config"].__setitem__("cores", 0), "config.cores must be > 0"),
        (lambda o: o.update(dropped=-1), "dropped must be an integer >= 0"),
        (
            lambda o: o["events"].insert(1, list(o["events"][0])),
            "event 1: handle {handle} is allocated again without a free since event 0",
        ),
    ],
)
def test_damaged_traces_are_refused(tmp_path: Path, mutate: object, text: str) -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    with TraceRecorder(pool) as rec:
        pool.alloc(100, tag="x").free()
        pool.alloc(200).free()
    obj = rec.trace.to_json_obj()
    assert callable(mutate)
    mutate(obj)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(FileFormatError) as info:
        load_trace(path)
    text = text.format(handle=obj["events"][0][6])
    assert str(path) in str(info.value) and text in str(info.value)


def test_a_handle_freed_then_allocated_again_is_read(tmp_path: Path) -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    with TraceRecorder(pool) as rec:
        pool.alloc(100, tag="x").free()
        pool.alloc(200).free()
    obj = rec.trace.to_json_obj()
    obj["events"][2][6] = obj["events"][0][6]  # alloc, free, alloc of the same handle
    trace = Trace.from_json_obj(obj)
    assert trace.events[0].handle == trace.events[2].handle


def test_a_move_past_the_end_of_the_arena_is_refused(tmp_path: Path) -> None:
    pool = npumem.Pool(8 * MIB, cores=1)
    with TraceRecorder(pool) as rec:
        pool.alloc(1000).free()
    obj = rec.trace.to_json_obj()
    alloc, free = obj["events"]
    end = 8 * MIB - 512  # the block would end 488 bytes past the arena
    move = [alloc[0] + 1, "move", end, 1000, 0, alloc[5], alloc[6], alloc[2], -1]
    obj["events"] = [alloc, move, free]
    path = tmp_path / "moved.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(FileFormatError) as info:
        load_trace(path)
    assert str(info.value) == (
        f"{path}: event 1: block [{end}, {end + 1000}) ends beyond the capacity {8 * MIB}"
    )
    move[2] = 8 * MIB - 1024  # inside the arena: read
    assert [e.kind for e in Trace.from_json_obj(obj).events] == ["alloc", "move", "free"]


def recorded(capacity: int, seed: int) -> tuple[npumem.Pool, Trace]:
    pool = npumem.Pool(capacity, cores=1, name="rec")
    with TraceRecorder(pool) as rec:
        workload(pool, seed)
    return pool, rec.trace


def test_replay_reproduces_the_recorded_outcome() -> None:
    _pool, trace = recorded(12 * MIB, 7)
    counts = trace.counts()
    assert counts["failed"] > 0, "the workload must run out of memory sometimes"
    r = replay_trace(trace)
    stats = trace.stats_at_stop
    assert stats is not None
    assert r.failed == counts["failed"] == stats.failed_allocs
    assert r.would_fail == 0 and r.rescued == 0 and r.ok
    assert r.peak_bytes_in_use == stats.peak_bytes_in_use
    assert r.same_placements == r.allocations == counts["alloc"], "same pool, same offsets"
    assert r.unmatched_frees == 0 and r.skipped_frees == 0
    assert r.final.bytes_in_use == 0 and r.final.alloc_count == counts["alloc"]


def test_replay_what_if() -> None:
    _, trace = recorded(12 * MIB, 7)
    bigger = replay_trace(trace, config={"capacity": 64 * MIB})
    assert bigger.failed == 0 and bigger.rescued == trace.counts()["failed"]
    smaller = replay_trace(trace, config={"capacity": 6 * MIB})
    assert smaller.would_fail > 0 and not smaller.ok
    assert smaller.skipped_frees == smaller.would_fail
    assert smaller.first_failures and smaller.first_failures[0].size > 0
    assert smaller.peak_bytes_in_use <= 6 * MIB


def test_replay_refuses_bad_configurations() -> None:
    _, trace = recorded(8 * MIB, 1)
    with pytest.raises(npumem.InvalidArgumentError, match="unknown configuration key"):
        replay_trace(trace, config={"colour": 1})
    with pytest.raises(npumem.ConfigError, match="power of two"):
        replay_trace(trace, config={"chunk_size": 3 << 20})
    with pytest.raises(npumem.InvalidArgumentError, match="sample_every"):
        replay_trace(trace, sample_every=0)


TRACE_CALLS_WHILE_A_START_WAITS = """
import threading, time
import npumem

pool = npumem.Pool(8 << 20, cores=1)
paused, done = threading.Event(), threading.Event()

def holder():
    with pool.pause(10.0):
        paused.set()
        done.wait(20)

threading.Thread(target=holder).start()
paused.wait()
starter = threading.Thread(target=pool.trace_start, args=(1024,))
starter.start()
time.sleep(0.2)  # the start now waits for the held pause, checking for signals meanwhile
status = pool.trace_status()  # with the GIL held
done.set()
starter.join()
print("enabled" if pool.trace_status().enabled else "disabled", status.enabled, flush=True)
"""


def test_trace_calls_with_the_gil_while_another_threads_start_waits_for_a_pause() -> None:
    """A `trace_start` that waits for another thread's pause (checking for signals, with the
    GIL, meanwhile) holds nothing that a thread holding the GIL waits for: `trace_status()`
    answers at once. When the start held the trace's lock while it waited, the two threads
    waited for each other for ever."""
    import subprocess

    try:
        done = subprocess.run(
            [sys.executable, "-c", TRACE_CALLS_WHILE_A_START_WAITS],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("trace_status() and trace_start() waited for each other")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["enabled", "False"]


def test_a_restarted_recorder_keeps_counting_what_it_lost() -> None:
    pool = npumem.Pool(64 * MIB, cores=1)
    rec = TraceRecorder(pool, capacity=16)
    rec.start()
    for _ in range(100):
        pool.alloc(1000).free()
    first = rec.stop()
    assert first.dropped == 200 - len(first.events) > 0 and not first.complete
    rec.start()  # right after the stop: nothing happened in between
    pool.alloc(1000).free()
    again = rec.stop()
    assert again.dropped == first.dropped, "the second session lost nothing of its own"
    assert not again.complete


def test_calls_between_two_sessions_count_as_lost() -> None:
    pool = npumem.Pool(64 * MIB, cores=1)
    rec = TraceRecorder(pool)
    with rec:
        pool.alloc(1000).free()
    assert rec.trace.complete
    pool.alloc(2000).free()  # not recorded
    with contextlib.suppress(npumem.OutOfMemoryError):
        pool.alloc(128 * MIB)
    with rec:
        pool.alloc(3000).free()
    trace = rec.trace
    assert [e.size for e in trace.events if e.kind == "alloc"] == [1000, 3000]
    assert trace.dropped == 3 and not trace.complete, "an alloc, a free and a failure"
    start = trace.stats_at_start
    assert start is not None and start.alloc_count == 0, "the first session's start"


def test_starting_a_running_recorder_keeps_its_events() -> None:
    pool = npumem.Pool(64 * MIB, cores=1)
    rec = TraceRecorder(pool, capacity=1 << 10)
    rec.start()
    for _ in range(10):
        pool.alloc(1000).free()
    rec.start()
    pool.alloc(1000).free()
    trace = rec.stop()
    assert len(trace.events) == 22 and trace.dropped == 0 and trace.complete


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs to move the thread between (Linux)",
)
def test_replay_takes_the_pinned_cpu_core_whatever_cpu_the_thread_used_before() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    try:
        os.sched_setaffinity(0, {cpus[0]})  # the CPU a replay pins the thread to
        pool = npumem.Pool(12 * MIB, cores=2, backing="none", name="rec")
        with TraceRecorder(pool) as rec:
            workload(pool, 11)
        os.sched_setaffinity(0, {cpus[1]})
        other = npumem.Pool(4 * MIB, cores=2, backing="none")
        kept = [other.alloc(64) for _ in range(8)]  # the thread's cached CPU: the other one
    finally:
        os.sched_setaffinity(0, set(cpus))
    r = replay_trace(rec.trace)
    assert r.would_fail == 0 and r.ok
    assert r.same_placements == r.allocations, "pinned as when recorded: the same offsets"
    for b in kept:
        b.free()


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (lambda: TraceRecorder(cast("npumem.Pool", None)), "pool must be an npumem.Pool"),
        (lambda: replay_trace(cast("Trace", {})), "trace must be a Trace, got dict"),
        (lambda: replay_trace(Trace("p", {}), config=cast("dict[str, Any]", "abc")), "config"),
        (
            lambda: replay_trace(Trace("p", {}), progress=cast("Callable[[int, int], None]", 5)),
            "progress must be a callable",
        ),
    ],
)
def test_recorder_and_replay_refuse_arguments_of_the_wrong_type(
    call: Callable[[], object], text: str
) -> None:
    with pytest.raises(npumem.ArgumentTypeError, match=text):
        call()


@pytest.mark.parametrize(
    ("tag", "text"),
    [
        ("", "is empty"),
        ("(other tags)", "is .*the row of the pooled tags"),
        ("\u00e9" * (npumem.MAX_TAG_BYTES // 2) + "x", "is longer than a tag can be"),
    ],
)
def test_a_trace_with_a_tag_no_pool_takes_is_refused_where_it_is_read(
    tmp_path: Path, tag: str, text: str
) -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    with TraceRecorder(pool) as rec:
        pool.alloc(1000, tag="x").free()
    obj = rec.trace.to_json_obj()
    obj["tags"] = [tag]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(FileFormatError, match=rf"t\.json.*tags\[0\] {text}"):
        load_trace(path)
