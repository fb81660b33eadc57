"""A hypothesis state machine drives a pool against a simple model: live blocks never overlap,
stay in bounds, honour alignment and the bank rule, keep their bytes, and the stats equal the
model. It also asserts the promise behind `largest_free_block`: any request of at most that many
bytes (default alignment) succeeds, and an out-of-memory error only happens above it. Full and
incremental compactions run in between (with some blocks pinned): blocks move, packed where
their buddy node would not start, and every promise above still holds afterwards."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

import npumem
from helpers import assert_block_rules
from npumem.compaction import Compactor

KIB, MIB = 1 << 10, 1 << 20


@dataclass
class Live:
    block: npumem.Block
    offset: int
    nbytes: int
    block_bytes: int
    pattern: int
    align: int | None = None


class PoolMachine(RuleBasedStateMachine):
    blocks = Bundle("blocks")
    freed = Bundle("freed")

    def __init__(self) -> None:
        super().__init__()
        # One CPU for the whole example: the core pool a call uses follows the CPU the thread
        # runs on, so on several CPUs a replay of the same steps could place (and fail)
        # differently, and Hypothesis would see its own example change under it.
        self.affinity = os.sched_getaffinity(0)  # Linux, as the CI
        os.sched_setaffinity(0, {min(self.affinity)})
        self.pool: npumem.Pool | None = None
        self.live: dict[int, Live] = {}
        self.allocs = 0
        self.frees = 0
        self.failed = 0
        self.counter = 0

    @initialize(
        chunk_size=st.sampled_from([64 * KIB, 256 * KIB, 2 * MIB]),
        chunks=st.integers(1, 12),
        tail=st.sampled_from([0, 0, 100, 4096, 30_000]),
        cores=st.integers(1, 3),
        bank_size=st.sampled_from([4096, 8192]),
        min_block=st.sampled_from([64, 256]),
        reserve=st.integers(0, 2),
    )
    def make_pool(
        self,
        chunk_size: int,
        chunks: int,
        tail: int,
        cores: int,
        bank_size: int,
        min_block: int,
        reserve: int,
    ) -> None:
        capacity = chunks * chunk_size + min(tail, chunk_size - 1)
        self.pool = npumem.Pool(
            capacity,
            cores=cores,
            chunk_size=chunk_size,
            bank_size=bank_size,
            min_block=min_block,
            core_reserve=reserve,
        )

    @property
    def p(self) -> npumem.Pool:
        assert self.pool is not None
        return self.pool

    def sizes(self) -> st.SearchStrategy[int]:
        return st.one_of(
            st.integers(1, 4096),  # slab classes
            st.integers(1, 5000),
            st.integers(1, 300 * KIB),
            st.integers(1, 5 * MIB),
        )

    @rule(
        target=blocks,
        data=st.data(),
        align=st.sampled_from([None, None, 1, 256, 4096, 64 * KIB]),
        tag=st.sampled_from([None, "a", "b"]),
    )
    def alloc(self, data: st.DataObject, align: int | None, tag: str | None) -> object:
        size = min(data.draw(self.sizes(), label="size"), self.p.capacity)
        largest = self.p.stats().largest_free_block
        try:
            blk = self.p.alloc(size, align=align, tag=tag)
        except npumem.RequestTooLargeError:
            # Within the capacity, but past the bytes its chunks hold (a short last chunk).
            self.failed += 1
            assert self.p.stats().usable_capacity < size <= self.p.capacity
            return multiple()
        except npumem.OutOfMemoryError as e:
            self.failed += 1
            if align is None or align <= self.p.alignment:
                # The figure is of a block: a request's block may be larger by its rounding
                # (at most a sixteenth) and the bank rule's slack.
                fits = largest - largest // 16 - self.p.bank_size
                assert size > fits, f"{size} bytes refused, {largest} free in one block"
            assert e.requested == size
            return multiple()
        assert_block_rules(self.p, blk, align)
        assert blk.nbytes == size and blk.tag == tag
        end = blk.offset + blk.block_bytes
        for other in self.live.values():
            assert end <= other.offset or other.offset + other.block_bytes <= blk.offset, "overlap"
        self.counter += 1
        pattern = self.counter % 251 + 1
        view = memoryview(blk)
        view[:] = bytes([pattern]) * size
        view.release()
        self.live[id(blk)] = Live(blk, blk.offset, size, blk.block_bytes, pattern, align)
        self.allocs += 1
        return blk

    @rule(target=blocks, data=st.data(), count=st.integers(1, 6))
    def alloc_batch(self, data: st.DataObject, count: int) -> object:
        sizes = [min(data.draw(self.sizes(), label="size"), self.p.capacity) for _ in range(count)]
        before = self.p.stats()
        try:
            made = self.p.alloc_many(sizes, tag="batch")
        except npumem.OutOfMemoryError:
            self.failed += 1
            after = self.p.stats()
            assert after.bytes_in_use == before.bytes_in_use, "a failed batch kept blocks"
            assert after.blocks_in_use == before.blocks_in_use
            # The blocks made before the failure were allocated and freed again.
            self.allocs += after.alloc_count - before.alloc_count
            self.frees += after.free_count - before.free_count
            return multiple()
        for blk in made:
            assert_block_rules(self.p, blk)
            end = blk.offset + blk.block_bytes
            for other in self.live.values():
                assert end <= other.offset or other.offset + other.block_bytes <= blk.offset, (
                    "overlap"
                )
            self.counter += 1
            pattern = self.counter % 251 + 1
            view = memoryview(blk)
            view[:] = bytes([pattern]) * blk.nbytes
            view.release()
            self.live[id(blk)] = Live(blk, blk.offset, blk.nbytes, blk.block_bytes, pattern)
            self.allocs += 1
        return multiple(*made)

    @rule(target=freed, blk=consumes(blocks))
    def free(self, blk: npumem.Block) -> npumem.Block:
        live = self.live.pop(id(blk))
        assert bytes(memoryview(blk)) == bytes([live.pattern]) * live.nbytes, "bytes changed"
        blk.free()
        self.frees += 1
        return blk

    @rule(blk=freed)
    def double_free_is_refused(self, blk: npumem.Block) -> None:
        before = self.p.stats().as_dict()
        try:
            blk.free()
        except npumem.DoubleFreeError:
            pass
        else:
            raise AssertionError("double free accepted")
        assert self.p.stats().as_dict() == before

    @rule(
        data=st.data(),
        mode=st.sampled_from(["full", "incremental"]),
        max_bytes=st.sampled_from([64 * KIB, MIB, 16 * MIB]),
    )
    def compact(self, data: st.DataObject, mode: str, max_bytes: int) -> None:
        lives = sorted(self.live.values(), key=lambda live: live.offset)
        pinned = (
            data.draw(st.lists(st.sampled_from(lives), max_size=2, unique_by=id), label="pinned")
            if lives
            else []
        )
        for live in pinned:
            live.block.pin()
        before = self.p.stats()
        report = Compactor(self.p).compact(mode, max_bytes=max_bytes)
        for live in pinned:
            live.block.unpin()
            assert live.block.offset == live.offset, "a pinned block moved"
        after = self.p.stats()
        assert after.bytes_in_use == before.bytes_in_use
        assert report.bytes_moved >= 0 and report.blocks_moved >= 0
        for live in lives:
            blk = live.block
            assert blk.nbytes == live.nbytes and blk.block_bytes == live.block_bytes
            assert_block_rules(self.p, blk, live.align)
            assert bytes(memoryview(blk)) == bytes([live.pattern]) * live.nbytes, "bytes changed"
            live.offset = blk.offset
        ordered = sorted(lives, key=lambda live: live.offset)
        for a, b in itertools.pairwise(ordered):
            assert a.offset + a.block_bytes <= b.offset, "blocks overlap after a compaction"
        assert self.p.check() == len(self.live)

    @rule()
    def check(self) -> None:
        assert self.p.check() == len(self.live)

    @invariant()
    def stats_match_the_model(self) -> None:
        if self.pool is None:
            return
        s = self.p.stats()
        assert s.bytes_in_use == sum(b.block_bytes for b in self.live.values())
        assert s.requested_bytes_in_use == sum(b.nbytes for b in self.live.values())
        assert s.blocks_in_use == len(self.live)
        assert (s.alloc_count, s.free_count, s.failed_allocs) == (
            self.allocs,
            self.frees,
            self.failed,
        )
        assert s.bytes_in_use + s.bytes_free + s.slab_cached_bytes == s.usable_capacity
        assert s.largest_free_block <= s.bytes_free
        assert 0.0 <= s.external_fragmentation <= 1.0
        assert s.peak_bytes_in_use >= s.bytes_in_use
        for live in self.live.values():
            assert live.block.offset == live.offset

    def teardown(self) -> None:
        try:
            self.free_everything()
        finally:
            os.sched_setaffinity(0, self.affinity)

    def free_everything(self) -> None:
        if self.pool is None:
            return
        for live in list(self.live.values()):
            live.block.free()
        self.live.clear()
        s = self.p.stats()
        assert s.bytes_in_use == 0
        assert s.largest_free_block == s.usable_capacity, "everything merges back"
        self.p.check()


PoolMachine.TestCase.settings = settings(stateful_step_count=40)
TestPool = PoolMachine.TestCase
