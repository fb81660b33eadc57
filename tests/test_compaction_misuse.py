"""Misuse of the compaction API: typed errors that say what was wrong, and the pool exactly as
it was (check() passes, stats and live blocks unchanged)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

import npumem
from compaction_helpers import MIB
from helpers import assert_unchanged, state_of
from npumem.compaction import (
    CompactionPlan,
    Compactor,
    HostMirror,
    PlannedMove,
    Policy,
    StepReport,
)


@pytest.fixture
def pool() -> Iterator[npumem.Pool]:
    p = npumem.Pool(32 * MIB, cores=2)
    held = [p.alloc(1000, tag="keep"), p.alloc(40_000, tag="keep"), p.alloc(3 * MIB)]
    yield p
    del held  # held until here: a dropped block is freed


def blocks_of(pool: npumem.Pool) -> list[npumem.Block]:
    # Blocks made by the fixture are not kept by it: make fresh ones per case.
    return [pool.alloc(40_000), pool.alloc(300)]


CASES: list[tuple[str, Callable[[npumem.Pool, npumem.Pause, list[npumem.Block]], Any], type]] = [
    ("not a pause", lambda p, z, b: p.move_blocks(object(), []), npumem.ArgumentTypeError),
    ("moves not iterable", lambda p, z, b: p.move_blocks(z, 5), npumem.ArgumentTypeError),
    ("move not a pair", lambda p, z, b: p.move_blocks(z, [b[0]]), npumem.ArgumentTypeError),
    ("not a block", lambda p, z, b: p.move_blocks(z, [(1, 0)]), npumem.ArgumentTypeError),
    ("float offset", lambda p, z, b: p.move_blocks(z, [(b[0], 1.5)]), npumem.ArgumentTypeError),
    (
        "negative offset",
        lambda p, z, b: p.move_blocks(z, [(b[0], -64)]),
        npumem.InvalidArgumentError,
    ),
    ("outside the arena", lambda p, z, b: p.move_blocks(z, [(b[0], 32 * MIB)]), npumem.MoveError),
    ("misaligned", lambda p, z, b: p.move_blocks(z, [(b[0], 20 * MIB + 256)]), npumem.MoveError),
    (
        "onto a live block",
        lambda p, z, b: p.move_blocks(z, [(b[0], b[1].offset)]),
        npumem.MoveError,
    ),
    (
        "same destination twice",
        lambda p, z, b: p.move_blocks(z, [(b[0], 20 * MIB), (b[1], 20 * MIB)]),
        npumem.MoveError,
    ),
    (
        "a block twice",
        lambda p, z, b: p.move_blocks(z, [(b[0], 20 * MIB), (b[0], 22 * MIB)]),
        npumem.MoveError,
    ),
    (
        "slab object out of slabs",
        lambda p, z, b: p.move_blocks(z, [(b[1], 20 * MIB)]),
        npumem.MoveError,
    ),
    ("mover not callable", lambda p, z, b: p.move_blocks(z, [], mover=3), npumem.ArgumentTypeError),
    ("bad mode", lambda p, z, b: p.compact_step(z, "tidy"), npumem.InvalidArgumentError),
    (
        "incremental, no budget",
        lambda p, z, b: p.compact_step(z, "incremental"),
        npumem.InvalidArgumentError,
    ),
    (
        "zero budget",
        lambda p, z, b: p.compact_step(z, "incremental", max_bytes=0),
        npumem.InvalidArgumentError,
    ),
    (
        "evacuate, no chunks",
        lambda p, z, b: p.compact_step(z, "evacuate"),
        npumem.InvalidArgumentError,
    ),
    ("no such chunk", lambda p, z, b: p.compact_step(z, "evacuate", chunks=[99]), npumem.MoveError),
    ("a run chunk", lambda p, z, b: p.compact_step(z, "evacuate", chunks=[1]), npumem.MoveError),
    ("pause twice", lambda p, z, b: p.pause(), npumem.PoolBusyError),
    ("bad timeout", lambda p, z, b: p.pause(-1), npumem.InvalidArgumentError),
    ("plan: bad mode", lambda p, z, b: p.plan_compaction("tidy"), npumem.InvalidArgumentError),
    # An argument of another mode, which the call would ignore.
    (
        "full with chunks",
        lambda p, z, b: p.compact_step(z, "full", chunks=[0]),
        npumem.InvalidArgumentError,
    ),
    (
        "full with a budget",
        lambda p, z, b: p.compact_step(z, max_bytes=1.5),
        npumem.InvalidArgumentError,
    ),
    (
        "incremental with chunks",
        lambda p, z, b: p.compact_step(z, "incremental", max_bytes=MIB, chunks=object()),
        npumem.InvalidArgumentError,
    ),
    (
        "evacuate with a budget",
        lambda p, z, b: p.compact_step(z, "evacuate", chunks=[0], max_bytes="lots"),
        npumem.InvalidArgumentError,
    ),
    (
        "stage: full with chunks",
        lambda p, z, b: p.stage_compaction("full", chunks=[0]),
        npumem.InvalidArgumentError,
    ),
    (
        "plan: full with a budget",
        lambda p, z, b: p.plan_compaction("full", max_bytes=MIB),
        npumem.InvalidArgumentError,
    ),
]


@pytest.mark.parametrize(("name", "call", "exc"), CASES, ids=[c[0] for c in CASES])
def test_a_refused_call_changes_nothing(
    pool: npumem.Pool,
    name: str,
    call: Callable[[npumem.Pool, npumem.Pause, list[npumem.Block]], Any],
    exc: type,
) -> None:
    blocks = blocks_of(pool)
    before = state_of(pool)
    with pool.pause() as pause, pytest.raises(exc):
        call(pool, pause, blocks)
    assert_unchanged(pool, before)


def test_a_destination_past_64_bits_is_outside_the_arena(pool: npumem.Pool) -> None:
    # Such an offset was refused as "must be an offset >= 0".
    blk = pool.alloc(40_000)
    before = state_of(pool)
    with pool.pause() as pause:
        for to in (2**64, 2**64 + 4096, 2**200):
            with pytest.raises(
                npumem.MoveError, match=rf"item 0 of the batch.*destination {to} lies outside"
            ) as info:
                pool.move_blocks(pause, [(blk, to)])
            assert ">= 0" not in str(info.value)
        with pytest.raises(npumem.InvalidArgumentError, match=r">= 0, got -18446744073709551616"):
            pool.move_blocks(pause, [(blk, -(2**64))])
    assert_unchanged(pool, before)


def test_blocks_that_cannot_move(pool: npumem.Pool) -> None:
    a, b = blocks_of(pool)
    other = npumem.Pool(8 * MIB, cores=1)
    foreign = other.alloc(40_000)
    freed = pool.alloc(40_000)
    freed.free()
    a.pin()
    before = state_of(pool)
    with pool.pause() as pause:
        with pytest.raises(npumem.PinnedBlockError):
            pool.move_blocks(pause, [(a, 20 * MIB)])
        with pytest.raises(npumem.InvalidHandleError):
            pool.move_blocks(pause, [(foreign, 20 * MIB)])
        with pytest.raises(npumem.InvalidHandleError):
            pool.move_blocks(pause, [(freed, 20 * MIB)])
        with pytest.raises(npumem.InvalidArgumentError, match="another pool"):
            other.move_blocks(pause, [])
    with pytest.raises(npumem.MoveError, match="no longer holds"):
        pool.move_blocks(pause, [(b, 20 * MIB)])  # resumed: no longer holds the pool
    assert_unchanged(pool, before)
    a.unpin()
    with pytest.raises(npumem.InvalidHandleError, match="unpin without a matching pin"):
        a.unpin()
    with a.pinned() as same:
        assert same is a and a.pins == 1
    assert a.pins == 0


def test_a_device_swap_bounces_through_free_space_and_is_refused_without_it() -> None:
    pool = npumem.Pool(16 * MIB, cores=1, backing="none")
    mirror = HostMirror(pool.capacity)
    a, b = pool.alloc(40_000), pool.alloc(40_000)
    mirror.write(a.offset, b"A" * 40_000)
    mirror.write(b.offset, b"B" * 40_000)
    oa, ob = a.offset, b.offset
    with pool.pause() as pause:
        done = pool.move_blocks(pause, [(a, ob), (b, oa)], mover=mirror)
    assert (a.offset, b.offset) == (ob, oa)
    assert len(done) == 3, "one block out to free space, the other across, the first back"
    assert mirror.read(a.offset, 40_000) == b"A" * 40_000
    assert mirror.read(b.offset, 40_000) == b"B" * 40_000
    pool.check()
    # A full arena leaves nowhere to bounce through: refused, nothing changes.
    tight = npumem.Pool(4 * MIB, cores=1, backing="none")
    c, d, rest = tight.alloc(MIB), tight.alloc(MIB), tight.alloc(2 * MIB)
    before = state_of(tight)
    with tight.pause() as pause, pytest.raises(npumem.MoveError, match="cycle"):
        tight.move_blocks(pause, [(c, d.offset), (d, c.offset)], mover=HostMirror(tight.capacity))
    assert_unchanged(tight, before)
    for blk in (c, d, rest):
        blk.free()


def test_the_host_mirror_refuses_ranges_outside_it_and_never_grows() -> None:
    # Offsets were used as slice bounds: a negative one wrote at the end, one past the end
    # grew the mirror, and a read past the end returned fewer bytes.
    mirror = HostMirror(1024)
    mirror.write(1000, b"x" * 24)
    before = bytes(mirror.memory)
    for offset, data in ((-4, b"AB"), (-1, b"QQ"), (2000, b"XYZ"), (1023, b"AB"), (1025, b"")):
        with pytest.raises(npumem.InvalidArgumentError, match="inside the mirror's 1024 bytes"):
            mirror.write(offset, data)
    for offset, nbytes in ((1020, 100), (-2, 2), (0, 1025), (1025, 0)):
        with pytest.raises(npumem.InvalidArgumentError, match="inside the mirror's 1024 bytes"):
            mirror.read(offset, nbytes)
    with pytest.raises(npumem.InvalidArgumentError, match="nbytes must be >= 0, got -1"):
        mirror.read(0, -1)
    for bad in (1.0, "0", True, None):
        with pytest.raises(npumem.ArgumentTypeError, match="offset must be an int"):
            mirror.write(bad, b"A")  # type: ignore[arg-type]
        with pytest.raises(npumem.ArgumentTypeError, match="offset must be an int"):
            mirror.read(bad, 1)  # type: ignore[arg-type]
        with pytest.raises(npumem.ArgumentTypeError, match="nbytes must be an int"):
            mirror.read(0, bad)  # type: ignore[arg-type]
    with pytest.raises(npumem.ArgumentTypeError, match="data must be bytes-like, got str"):
        mirror.write(0, "AB")  # type: ignore[arg-type]
    assert bytes(mirror.memory) == before, "nothing refused was written"
    mirror.write(1022, bytearray(b"ok"))
    mirror.write(0, memoryview(b"abcd")[::2])
    assert mirror.read(1022, 2) == b"ok" and mirror.read(0, 2) == b"ac"
    assert mirror.read(1024, 0) == b"" and len(mirror.memory) == 1024
    # As a mover: a transfer outside the mirror (one smaller than its pool) raises before
    # anything is copied, and the pool undoes the batch.
    before = bytes(mirror.memory)
    for transfers in ([(0, 2, 2), (1000, 1020, 8)], [(0, 2, 2), (-1, 0, 1)], [(0, 1, -1)]):
        with pytest.raises(npumem.InvalidArgumentError, match=r"transfers\[\d\]"):
            mirror(transfers)
    assert bytes(mirror.memory) == before and mirror.batches == 0
    pool = npumem.Pool(16 * MIB, cores=1, backing="none")
    small = HostMirror(64 * 1024)
    blocks = [pool.alloc(40_000) for _ in range(4)]
    high = max(blocks, key=lambda b: b.offset)
    low = min(blocks, key=lambda b: b.offset)
    low_offset = low.offset
    low.free()
    before_pool = state_of(pool)
    with pool.pause() as pause, pytest.raises(npumem.InvalidArgumentError, match="65536 bytes"):
        pool.move_blocks(pause, [(high, low_offset)], mover=small)
    assert_unchanged(pool, before_pool)
    assert small.batches == 0


def test_the_pool_cannot_be_used_from_inside_the_mover() -> None:
    pool = npumem.Pool(16 * MIB, cores=1, backing="none")
    blk = pool.alloc(40_000)
    seen: list[str] = []

    def meddling(transfers: Sequence[tuple[int, int, int]]) -> None:
        for call in (
            lambda: pool.alloc(100),
            blk.free,
            pool.check,
            pool.snapshot,
            pause.resume,
            lambda: pool.move_blocks(pause, []),
        ):
            with pytest.raises(npumem.PoolBusyError) as err:
                call()
            seen.append(type(err.value).__name__)

    with pool.pause() as pause:
        pool.move_blocks(pause, [(blk, 8 * MIB)], mover=meddling)
        assert blk.offset == 8 * MIB
    assert seen == ["PoolBusyError"] * 6
    pool.check()


def test_other_threads_wait_for_the_resume_and_the_pausing_thread_does_not() -> None:
    pool = npumem.Pool(16 * MIB, cores=2)
    got: list[int] = []
    with pool.pause() as pause:
        mine = pool.alloc(1000)  # the pausing thread may allocate
        t = threading.Thread(target=lambda: got.append(pool.alloc(1000).offset))
        t.start()
        t.join(0.2)
        assert t.is_alive() and not got, "another thread allocated while paused"
        assert pause.held
    t.join(5)
    assert len(got) == 1 and not pause.held
    mine.free()
    pool.check()


def test_a_pause_left_open_does_not_hang_other_threads() -> None:
    pool = npumem.Pool(16 * MIB, cores=2)
    blk = pool.alloc(5000)
    before = state_of(pool)
    raised: list[BaseException] = []

    def other() -> None:
        for call in (lambda: pool.alloc(100), blk.free):
            try:
                call()
            except npumem.PoolBusyError as e:
                raised.append(e)

    pause = pool.pause(timeout=0.1)  # and not resumed in time
    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert [type(e) for e in raised] == [npumem.PoolBusyError] * 2
    assert "stayed paused" in str(raised[0])
    pause.resume()
    assert_unchanged(pool, before)
    blk.free()
    pool.check()


def test_compactor_arguments_are_checked(pool: npumem.Pool) -> None:
    before = state_of(pool)
    bad: list[Callable[[], Any]] = [
        lambda: Compactor("pool"),  # type: ignore[arg-type]
        lambda: Compactor(pool, policy={"mode": "full"}),  # type: ignore[arg-type]
        lambda: Compactor(pool, pause_budget=0),
        lambda: Compactor(pool, on_pause=3),  # type: ignore[arg-type]
        lambda: Compactor(pool).compact("tidy"),
        lambda: Compactor(pool).compact("incremental", max_bytes=0),
        lambda: Compactor(pool).plan("tidy"),
        lambda: Compactor(pool).plan("full", max_bytes="x"),  # type: ignore[arg-type]
        lambda: Compactor(pool).plan("full", max_bytes=0),
        lambda: Compactor(pool).plan("incremental", max_bytes=True),
        lambda: Compactor(npumem.Pool(8 * MIB, backing="none")),  # a device pool needs a mover
        lambda: Policy(fragmentation_threshold=1.5),
        lambda: Policy(min_interval=-1),
        lambda: Policy(wait_for_room=-0.5),
        lambda: Policy(wait_for_room=float("inf")),
        lambda: Policy(wait_for_room=True),
        lambda: Policy(wait_for_room="1"),  # type: ignore[arg-type]
        lambda: Policy(mode="tidy"),
        lambda: Policy(max_bytes=0),
        lambda: Policy(on_failure="yes"),  # type: ignore[arg-type]
        lambda: HostMirror(0),
    ]
    for call in bad:
        with pytest.raises(npumem.InvalidArgumentError):
            call()
    assert_unchanged(pool, before)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: PlannedMove("slide", 0, 0, 1, 1), npumem.InvalidArgumentError, "kind must be one"),
        (lambda: PlannedMove(3, 0, 0, 1, 1), npumem.ArgumentTypeError, "kind must be a str"),
        (lambda: PlannedMove("\ud800", 0, 0, 1, 1), npumem.InvalidArgumentError, "surrogate"),
        (
            lambda: PlannedMove("run", -1, 0, 1, 1),
            npumem.InvalidArgumentError,
            "src must be an int",
        ),
        (lambda: PlannedMove("run", 0, 2**70, 1, 1), npumem.InvalidArgumentError, "dst must be"),
        (
            lambda: PlannedMove("run", 0, 0, "1", 1),
            npumem.ArgumentTypeError,
            "nbytes must be an int",
        ),
        (
            lambda: PlannedMove("run", 0, 0, 1, 1.0),
            npumem.ArgumentTypeError,
            "blocks must be an int",
        ),
        (
            lambda: StepReport(-1, 0, 0, 0.0, 0.0, 0.0),
            npumem.InvalidArgumentError,
            r"blocks must be an int from 0 to 18446744073709551615, got -1",
        ),
        (
            lambda: StepReport(0, 2**70, 0, 0.0, 0.0, 0.0),
            npumem.InvalidArgumentError,
            "bytes must be an int from 0 to",
        ),
        (
            lambda: StepReport(0, 0, 0, 0.0, 0.0, 0.0, stale=-2),
            npumem.InvalidArgumentError,
            "stale must be an int from 0 to",
        ),
        (
            lambda: StepReport(0, 0, "1", 0.0, 0.0, 0.0),
            npumem.ArgumentTypeError,
            "chunks_freed must be an int",
        ),
        (
            lambda: StepReport(1, 1, 1, float("nan"), 0.0, 0.0),
            npumem.InvalidArgumentError,
            "pause_seconds must be a finite number of seconds >= 0, got nan",
        ),
        (
            lambda: StepReport(1, 1, 1, 0.0, -5.0, 0.0),
            npumem.InvalidArgumentError,
            "planning_seconds must be a finite number of seconds >= 0, got -5.0",
        ),
        (
            lambda: StepReport(1, 1, 1, 0.0, 0.0, float("inf")),
            npumem.InvalidArgumentError,
            "moving_seconds must be a finite number of seconds >= 0, got inf",
        ),
        (
            lambda: StepReport(1, 1, 1, 0.0, 0.0, True),
            npumem.ArgumentTypeError,
            "moving_seconds must be a number of seconds, got bool",
        ),
        (
            lambda: StepReport(1, 1, 1, 0.0, 0.0, 0.0).with_pause(-1.0),
            npumem.InvalidArgumentError,
            "pause_seconds must be a finite number of seconds >= 0, got -1.0",
        ),
        (lambda: CompactionPlan("tidy", [], 0, 0, 0, 0, 0, 0), npumem.InvalidArgumentError, "mode"),
        (lambda: CompactionPlan("full", 5, 0, 0, 0, 0, 0, 0), npumem.ArgumentTypeError, "iterable"),
        (
            lambda: CompactionPlan("full", "ab", 0, 0, 0, 0, 0, 0),
            npumem.ArgumentTypeError,
            "iterable",
        ),
        (
            lambda: CompactionPlan("full", [1], 0, 0, 0, 0, 0, 0),
            npumem.ArgumentTypeError,
            r"moves\[0\]",
        ),
        (
            lambda: CompactionPlan("full", [], 0, -1, 0, 0, 0, 0),
            npumem.InvalidArgumentError,
            "bytes",
        ),
        (
            lambda: CompactionPlan("full", [], 0, 0, 0, 0, 0, 0, bytes_free_after=-1),
            npumem.InvalidArgumentError,
            "bytes_free_after",
        ),
    ],
)
def test_plans_and_moves_made_by_hand_are_checked(
    make: Callable[[], object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        make()


def test_a_plan_made_by_hand_from_a_real_one_is_equal_to_it() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blocks = [pool.alloc(300 << 10) for _ in range(30)]
    for b in blocks[::2]:
        b.free()
    plan = pool.plan_compaction("full")
    assert plan.moves, "a fragmented pool has moves to plan"
    moves = [PlannedMove(**m.as_dict()) for m in plan.moves]
    assert moves == list(plan.moves)
    again = CompactionPlan(
        plan.mode,
        moves,
        plan.blocks,
        plan.bytes,
        plan.chunks_emptied,
        plan.bytes_free,
        plan.largest_free_before,
        plan.largest_free_after,
        bytes_free_after=plan.bytes_free_after,
    )
    assert again == plan
    assert (again.mode, again.moves, again.bytes) == (plan.mode, plan.moves, plan.bytes)


def test_a_staged_run_and_a_compactor_refuse_arguments_of_the_wrong_kind() -> None:
    pool = npumem.Pool(4 * MIB, cores=1)
    wrong_kind = pytest.raises(npumem.ArgumentTypeError, match="staged must be a StagedCompaction")
    with pool.pause(1.0) as pause, wrong_kind:
        pool.run_staged(pause, "x")  # type: ignore[arg-type]
    # Accepted before, then every compact() failed when it paused the pool.
    with pytest.raises(npumem.InvalidArgumentError, match="pause_timeout must be a finite"):
        Compactor(pool, pause_timeout=float("inf"))
    pool.check()


def test_a_resumed_pause_cannot_be_entered_again() -> None:
    p = npumem.Pool(16 * MIB, cores=1)
    pause = p.pause()
    pause.resume()
    with pytest.raises(npumem.errors.MoveError, match="no longer holds the pool"), pause:
        raise AssertionError("the body ran with the pool running")
    p.alloc(1000).free()  # the pool runs
    with p.pause() as again:
        assert again.held


def test_a_mode_and_a_tag_are_read_without_calling_str() -> None:
    """A mode or a tag that is a `str` is read as its text, without `str()`: `str()` runs the
    signal handlers that are pending, and the binding's conversion through it printed their
    exception (a Ctrl-C) as unraisable and went on with "<unprintable str object>" as the mode
    or the tag. A subclass whose `__str__` raises shows the same path."""

    class Text(str):
        def __str__(self) -> str:
            raise RuntimeError("str() was called")

    pool = npumem.Pool(8 * MIB, cores=1)
    assert pool.plan_compaction(Text("full")).mode == "full"
    blk = pool.alloc(100, tag=Text("weights"))
    assert [b.tag for b in pool.blocks()] == ["weights"]
    assert 'tag="weights"' in repr(blk)
    blk.free()


def _fragmented() -> tuple[npumem.Pool, list[npumem.Block]]:
    pool = npumem.Pool(8 * MIB, cores=1)
    blocks = [pool.alloc(64 << 10) for _ in range(100)]
    for b in blocks[::2]:
        b.free()
    return pool, blocks[1::2]


@pytest.mark.parametrize("hook", ["on_pause", "on_resume"])
@pytest.mark.parametrize("call", ["compact", "maybe_compact"])
def test_a_hook_that_compacts_the_same_compactor_is_refused_at_once(hook: str, call: str) -> None:
    pool, kept = _fragmented()
    refused: list[BaseException] = []
    seen: list[tuple[int, int]] = []

    def compact_again() -> None:
        seen.append((comp.compactions, len(comp.reports)))
        try:
            getattr(comp, call)()
        except npumem.PoolBusyError as exc:
            refused.append(exc)

    comp = Compactor(pool, policy=Policy(fragmentation_threshold=0.01), **{hook: compact_again})
    report = comp.compact()
    assert len(refused) == len(seen) == len(report.steps) == 1
    assert f"{call}() was called from a compaction of this same compactor" in str(refused[0])
    assert comp.compactions == 1 and comp.reports == [report]
    assert seen == [(0, 0)]
    assert report.largest_free_after > report.largest_free_before
    pool.check()
    del kept


def test_a_raising_hook_leaves_the_steps_it_ran_counted_and_reported() -> None:
    pool, kept = _fragmented()
    before = pool.stats().largest_free_block

    def broken() -> None:
        raise RuntimeError("stream restart failed")

    comp = Compactor(pool, on_resume=broken)
    with pytest.raises(RuntimeError, match="stream restart failed"):
        comp.compact()
    assert pool.stats().largest_free_block > before  # the blocks moved
    assert comp.compactions == 1 and len(comp.reports) == 1
    report = comp.reports[0]
    assert len(report.steps) == 1 and report.steps[0].blocks > 0
    assert report.largest_free_after == pool.stats().largest_free_block
    assert "stopped after 1 step(s): RuntimeError 'stream restart failed'" in report.notes
    # Before the stop nothing moved: nothing to count.
    pool2, kept2 = _fragmented()
    comp2 = Compactor(pool2, on_pause=broken)
    with pytest.raises(RuntimeError):
        comp2.compact()
    assert comp2.compactions == 0 and comp2.reports == []
    pool.check()
    pool2.check()
    del kept, kept2
