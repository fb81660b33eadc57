"""The tiered pool: a fast pool per core (SRAM) in front of one shared slow pool (HBM).

Placement of `alloc(nbytes, core=, tier=, hot=)`:

1. an explicit `tier` wins (`"fast"`: the SRAM of `core`, or of the calling core; no room
   raises `OutOfMemoryError`);
2. otherwise a block the policy admits (by default: `hot=True`) and of at most
   `fast_max_block` bytes goes to the fast pool of `core` (or of the calling core);
3. when that pool has no room the block spills to the slow pool and counts as a spill;
4. everything else goes to the slow pool.

Each pool keeps its own bank rule and alignment. Blocks move between tiers through a mover
(`npumem.tiers.movers`): explicitly (`TieredPool.promote`, `TieredPool.demote`)
or by `TieredPool.rebalance`, which asks the policy (`npumem.tiers.policy`) for the
hottest blocks of the slow tier and the coldest of each fast tier, within a byte budget. Pinned
blocks and blocks with live views never move; a move that fails changes nothing. Handles
(`TieredBlock`) stay valid across moves.

Thread safety: allocation runs in the lock-free pools and does not take the tiered pool's
lock (a new block joins the books at the next call that takes it); the tiered pool's bookkeeping
(membership, counters, moves) is guarded by one lock. A move checks that the block has no pins
or views and holds the lock while it copies; a view taken on `tb.block` while a move of the
same block is under way could be taken on the old place, so take views with
`TieredBlock.view`, which takes them under the
lock (a view then keeps the block where it is until it is released). In a process forked while
another thread held that lock, the calls that take it raise `PoolBusyError`: the books may be
half updated there, so make a new tiered pool in the child.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

from npumem._core import Pool
from npumem._fork_safe import ForkSafeRLock
from npumem._shown import shown
from npumem.errors import (
    ArgumentTypeError,
    ConfigError,
    DoubleFreeError,
    InvalidArgumentError,
    InvalidHandleError,
    MoveError,
    OutOfMemoryError,
    PinnedBlockError,
)
from npumem.monitor.validate import MAX_CAPACITY
from npumem.sizes import MAX_BYTES
from npumem.tiers.block import FAST, SLOW, Tier, TieredBlock, TierKind
from npumem.tiers.events import EventKind, TierEvent
from npumem.tiers.movers import TierMover, host_copy
from npumem.tiers.observe import TierSnapshot
from npumem.tiers.policy import FrequencyPolicy, Heat, Policy
from npumem.tiers.report import RebalanceReport, TierMove, TierStats, TierUsage

__all__ = ["TieredPool"]


_FREED_BEHIND = (
    "the tiered block's bytes were freed directly (through its .block), not through the tiered "
    "pool, which no longer lists it"
)

_DETACHED_BEHIND = (
    "the tiered block's npumem.Block was detached directly (tb.block.detach()), not through the "
    "tiered pool: its bytes are still allocated and belong to whoever holds the handle (adopt it "
    "with the pool's adopt() to use or free them), and the tiered pool no longer lists the block"
)


_LEFT_DETACHED = (
    "the tiered block is no longer in its tiered pool: its npumem.Block was detached directly "
    "(tb.block.detach())"
)


def _listed(items: Iterable[Any], name: str) -> list[Any]:
    """`items` as a list; `ArgumentTypeError` when it is not iterable."""
    try:
        return list(items)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be iterable, got {type(items).__name__}") from None


def _count_arg(value: object, name: str) -> int:
    """`value` as an access count: an int (not a bool) >= 0."""
    if value.__class__ is not int:
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise InvalidArgumentError(f"{name} must be an int >= 0, got {value}")
    return value


class _Counters:
    __slots__ = ("allocs", "demotions", "hit_bytes", "hits", "promotions", "spills")

    def __init__(self) -> None:
        self.allocs = 0
        self.hits = 0
        self.hit_bytes = 0
        self.promotions = 0
        self.demotions = 0
        self.spills = 0


def _counted_touch(policy: Policy) -> Callable[[Heat, int, int], None]:
    """`policy.touch_n`, or `count` calls of `policy.touch` for a policy without it."""
    touch_n: Callable[[Heat, int, int], None] | None = getattr(policy, "touch_n", None)
    if touch_n is not None:
        return touch_n
    touch = policy.touch

    def repeated(heat: Heat, now: int, count: int) -> None:
        for k in range(count):
            touch(heat, now + k)

    return repeated


WAIT_PASSES = 32
"""Rebalances of its core that a block waits at most after residents went for it in vain."""

_UNTOUCHED = Heat()
"""The heat of a block never touched, for scoring it (never changed)."""


class _RoundRobinCores:
    """The default `core_of`: each thread gets a core on its first call, in turn."""

    def __init__(self, cores: int) -> None:
        self._cores = cores
        self._next = itertools.count()
        self._local = threading.local()

    def __call__(self) -> int:
        core: int | None = getattr(self._local, "core", None)
        if core is None:
            core = next(self._next) % self._cores
            self._local.core = core
        return core


class TieredPool:
    """Per-core fast pools and one shared slow pool behind one allocation call.

    `fast`: one `npumem.Pool` per core (the SRAM of each core); `slow`: the shared
    `npumem.Pool` (HBM). `movers`: the tier mover (`npumem.tiers.movers`), needed
    when a pool has `backing="none"`; `None` copies host memory. `fast_max_block`: larger
    blocks never go to a fast tier unless asked by name (`None`: no limit). `policy`:
    `FrequencyPolicy` by default. `core_of`: returns the calling
    thread's core (default: each thread gets a core in turn on its first call).
    """

    def __reduce__(self) -> NoReturn:
        # A copy would share the pools and blocks of this one (copy.copy, deepcopy and pickle
        # all come here), as the core's Pool refuses to.
        raise TypeError("cannot copy or pickle a 'TieredPool' object: it owns its pools and blocks")

    def __init__(
        self,
        fast: Sequence[Pool],
        slow: Pool,
        movers: TierMover | None = None,
        fast_max_block: int | None = None,
        *,
        policy: Policy | None = None,
        core_of: Callable[[], int] | None = None,
    ) -> None:
        pools: list[object] = _listed(fast, "fast")
        if not pools:
            raise ConfigError("fast must name at least one pool (one per core)")
        for i, pool in enumerate([*pools, slow]):
            if not isinstance(pool, Pool):
                where = f"fast[{i}]" if i < len(pools) else "slow"
                raise ArgumentTypeError(
                    f"{where} must be an npumem.Pool, got {type(pool).__name__}"
                )
        fast = [p for p in pools if isinstance(p, Pool)]
        if len({id(p) for p in [*fast, slow]}) != len(fast) + 1:
            raise ConfigError("every tier needs its own pool: a pool appears twice")
        if movers is not None and not callable(movers):
            raise ArgumentTypeError(f"movers must be callable, got {type(movers).__name__}")
        if movers is None:
            deviced = [p.name or "pool" for p in [*fast, slow] if p.backing != "host"]
            if deviced:
                raise ConfigError(
                    "a pool with backing='none' has no host bytes to copy: give movers="
                    "(src_tier, src_offset, dst_tier, dst_offset, nbytes) -> None"
                )
        if fast_max_block is not None and (
            isinstance(fast_max_block, bool)
            or not isinstance(fast_max_block, int)
            or fast_max_block < 1
        ):
            raise InvalidArgumentError(
                f"fast_max_block must be an int >= 1 or None, got {shown(fast_max_block)}"
            )
        if policy is None:
            policy = FrequencyPolicy()
        elif not isinstance(policy, Policy):
            raise ArgumentTypeError(
                "policy must have name, moves, per_byte, admit(), touch() and score(), "
                f"got {type(policy).__name__}"
            )
        if core_of is not None and not callable(core_of):
            raise ArgumentTypeError(f"core_of must be callable, got {type(core_of).__name__}")
        self.fast: tuple[Pool, ...] = tuple(fast)
        self.slow = slow
        self.movers = movers
        self.fast_max_block = fast_max_block
        self._policy: Policy = policy
        self._core_of = core_of if core_of is not None else _RoundRobinCores(len(fast))
        self._ncores = len(fast)
        self._admit = policy.admit
        self._touch_n = _counted_touch(policy)
        self._lock = ForkSafeRLock("TieredPool")
        self._clock = 0
        self._resident: list[set[TieredBlock]] = [set() for _ in fast]
        self._slow_blocks: set[TieredBlock] = set()
        self._fast_counts = [_Counters() for _ in fast]
        self._slow_counts = _Counters()
        self._serials = itertools.count()
        self._placed: deque[TieredBlock] = deque()
        self._spills: deque[int] = deque()  # the home cores of the blocks that spilled
        self._next_core = 0
        # Blocks that found no room in their core's fast pool although colder residents were
        # demoted for them, with the core's room count and pass count then: they are not tried
        # again until a block leaves that pool or WAIT_PASSES rebalances of the core went by.
        self._misfits: dict[TieredBlock, tuple[int, int]] = {}
        self._room = [0 for _ in fast]  # per core: blocks that left the fast pool
        self._passes = [0 for _ in fast]  # per core: rebalances that looked at it
        self._bytes_accessed = 0
        self._recording: list[TierEvent] | None = None

    # ----------------------------------------------------------------------------------------
    # Recording

    def record(self) -> None:
        """Start recording every call (see `npumem.tiers.trace`); a running recording
        starts over."""
        with self._lock:
            self._recording = []

    def stop_recording(self) -> list[TierEvent]:
        """Stop recording and return the events (empty when none was running)."""
        with self._lock:
            events, self._recording = self._recording or [], None
            return events

    def _note(self, kind: EventKind, tb: TieredBlock | None = None, **fields: object) -> None:
        """Append an event to the recording; the caller holds the lock."""
        assert self._recording is not None
        serial = -1 if tb is None else tb.serial
        self._recording.append(TierEvent(kind, serial, **fields))  # type: ignore[arg-type]

    # ----------------------------------------------------------------------------------------
    # Allocation

    @property
    def policy(self) -> Policy:
        """The promotion policy; assigning another one takes effect at the next call."""
        return self._policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        if not isinstance(policy, Policy):
            raise ArgumentTypeError(
                "policy must have name, moves, per_byte, admit(), touch() and score(), "
                f"got {type(policy).__name__}"
            )
        with self._lock:
            self._policy = policy
            self._admit = policy.admit
            self._touch_n = _counted_touch(policy)

    @property
    def cores(self) -> int:
        """Number of fast pools (one per core)."""
        return len(self.fast)

    def pool_of(self, tier: Tier) -> Pool:
        """The pool behind a `Tier`."""
        if tier.kind == SLOW:
            return self.slow
        assert tier.core is not None
        return self.fast[tier.core]

    def _calling_core(self) -> int:
        """The home core of the calling thread, from `core_of`."""
        home = self._core_of()
        try:
            return int(home) % self._ncores
        except (TypeError, ValueError):
            raise ArgumentTypeError(
                f"core_of() must return an int, got {type(home).__name__}"
            ) from None

    def _core(self, core: int | None) -> int:
        if core is None:
            return self._calling_core()
        if isinstance(core, bool) or not isinstance(core, int):
            raise ArgumentTypeError(f"core must be an int or None, got {type(core).__name__}")
        if not 0 <= core < len(self.fast):
            raise InvalidArgumentError(f"core must be in [0, {len(self.fast)}), got {core}")
        return core

    def alloc(
        self,
        nbytes: int,
        *,
        core: int | None = None,
        tier: TierKind | None = None,
        hot: bool = False,
        tag: str | None = None,
        align: int | None = None,
    ) -> TieredBlock:
        """A block of `nbytes` placed by the rules in the module docstring."""
        if hot is not False and hot is not True:
            raise ArgumentTypeError(f"hot must be a bool, got {type(hot).__name__}")
        if core is None:
            home = self._calling_core()
        elif core.__class__ is int and 0 <= core < self._ncores:
            home = core
        else:
            home = self._core(core)
        spilled = False
        plain = align is None and tag is None  # a call without keywords costs less
        if tier is None:
            where: int | None = None
            limit = self.fast_max_block
            try:
                small = limit is None or nbytes <= limit
            except TypeError:
                raise ArgumentTypeError(
                    f"nbytes must be an int, got {type(nbytes).__name__}"
                ) from None
            if small and self._admit(nbytes, hot):
                pool = self.fast[home]
                try:
                    block = (
                        pool.alloc(nbytes) if plain else pool.alloc(nbytes, align=align, tag=tag)
                    )
                    where = home
                except OutOfMemoryError:
                    spilled = True
            if where is None:
                pool = self.slow
                block = pool.alloc(nbytes) if plain else pool.alloc(nbytes, align=align, tag=tag)
        elif tier == FAST:
            pool = self.fast[home]
            block = pool.alloc(nbytes) if plain else pool.alloc(nbytes, align=align, tag=tag)
            where = home
        elif tier == SLOW:
            pool = self.slow
            block = pool.alloc(nbytes) if plain else pool.alloc(nbytes, align=align, tag=tag)
            where = None
        else:
            raise InvalidArgumentError(f"tier must be 'fast', 'slow' or None, got {shown(tier)}")
        tb = TieredBlock(self, block, where, home, align, nbytes, next(self._serials))
        if spilled:
            self._spills.append(home)
        if self._recording is None:
            # Without the lock: the placement joins the books at the next call that takes it.
            self._placed.append(tb)
        else:
            with self._lock:
                self._note("alloc", tb, nbytes=nbytes, core=home, tier=tier, hot=hot, tag=tag)
                self._placed.append(tb)
                self._fold()
        return tb

    def _fold(self) -> None:
        """Enter the blocks placed since the last call into the books; the caller holds the
        lock. Blocks freed meanwhile count as allocations and are not listed."""
        placed = self._placed
        fast, slow = self._fast_counts, self._slow_counts
        while placed:
            tb = placed.popleft()
            core = tb._core
            if core is None:
                slow.allocs += 1
                if tb._block is not None:
                    self._slow_blocks.add(tb)
            else:
                fast[core].allocs += 1
                if tb._block is not None:
                    self._resident[core].add(tb)
        spills = self._spills
        while spills:
            fast[spills.popleft()].spills += 1

    def free(self, tb: TieredBlock) -> None:
        """Give `tb`'s bytes back to their tier. A pinned block raises
        `PinnedBlockError` and stays allocated."""
        if type(tb) is not TieredBlock or tb._owner is not self:
            self._check_own(tb)
        lock = self._lock
        lock.acquire()
        try:
            block = tb._block
            if block is None:
                raise tb._gone()
            if self._placed:
                self._fold()
            if not block.alive:
                raise self._forget_gone(tb)
            block.free()
            if self._recording is not None:
                self._note("free", tb)
            self._forget(tb)
        finally:
            lock.release()

    def _forget(self, tb: TieredBlock) -> None:
        """Take `tb`, whose bytes are gone, out of the books; the caller holds the lock and
        folded the blocks placed since the last fold."""
        tb._block = None
        core = tb._core
        if core is None:
            self._slow_blocks.discard(tb)
        elif tb in self._resident[core]:
            self._resident[core].discard(tb)
            self._room[core] += 1
        if self._misfits:
            self._misfits.pop(tb, None)

    def _forget_freed_behind(self) -> None:
        """Take out of the books the tiered blocks whose `npumem.Block` was freed or detached
        directly (through `TieredBlock.block`), not through the tiered pool; the caller holds
        the lock and folded."""
        listed = [*self._slow_blocks, *itertools.chain.from_iterable(self._resident)]
        for tb in listed:
            block = tb._block
            if block is not None and not block.alive:
                self._forget_gone(tb)

    def _forget_gone(self, tb: TieredBlock) -> InvalidHandleError:
        """Take `tb`, whose `npumem.Block` was freed or detached directly (through
        `TieredBlock.block`), out of the books; return the error that says which. The caller
        holds the lock and folded."""
        if tb._block_detached():
            tb._left = _LEFT_DETACHED
            error: InvalidHandleError = InvalidHandleError(_DETACHED_BEHIND)
        else:
            error = DoubleFreeError(_FREED_BEHIND)
        self._forget(tb)
        return error

    def _view(self, tb: TieredBlock) -> memoryview:
        self._check_own(tb)
        with self._lock:  # a move holds the lock from its pin check to its free
            return memoryview(tb.block)

    def _check_own(self, tb: TieredBlock) -> None:
        if not isinstance(tb, TieredBlock):
            raise ArgumentTypeError(f"expected a TieredBlock, got {type(tb).__name__}")
        if tb._owner is not self:
            raise InvalidHandleError("the tiered block belongs to another tiered pool")

    # ----------------------------------------------------------------------------------------
    # Accesses

    def touch(self, tb: TieredBlock, count: int = 1) -> None:
        """Record `count` accesses of `tb`: the policy's heat, and a hit of its tier. A count
        that would take the accesses or the bytes accessed past `2**64 - 1` (the most the
        figures keep) is refused with `InvalidArgumentError`."""
        if type(tb) is not TieredBlock or tb._owner is not self:
            self._check_own(tb)
        if count.__class__ is not int or count < 0:
            _count_arg(count, "count")
        lock = self._lock
        lock.acquire()
        try:
            if tb._block is None:
                raise tb._gone()
            clock = self._clock
            nbytes = count * tb._nbytes
            if count > MAX_BYTES - clock or nbytes > MAX_BYTES - self._bytes_accessed:
                self._check_room(count, nbytes, f"count {count}")
            core = tb._core
            counts = self._slow_counts if core is None else self._fast_counts[core]
            heat = tb._heat
            if heat is None:
                heat = tb._heat = Heat()
            if count == 1:
                self._policy.touch(heat, clock)
            else:
                self._touch_n(heat, clock, count)
            self._clock = clock + count
            counts.hits += count
            counts.hit_bytes += nbytes
            self._bytes_accessed += nbytes
            if self._recording is not None:
                self._note("touch", tb, count=count)
        finally:
            lock.release()

    def touch_many(
        self, blocks: Iterable[TieredBlock], counts: Iterable[int] | None = None
    ) -> None:
        """Record accesses of each block of `blocks`, in order, under one acquisition of the
        lock: one access of each (`counts=None`: the same figures as `touch(tb)` for each), or
        `counts[i]` accesses of `blocks[i]` (the same figures as `touch(tb, count)` for each,
        recorded as one `touch_many` event). A block of another tiered pool, a freed one or a
        bad count raises before anything is recorded."""
        tbs = blocks if isinstance(blocks, list | tuple) else _listed(blocks, "blocks")
        if counts is not None:
            ns = counts if isinstance(counts, list | tuple) else _listed(counts, "counts")
            if len(ns) != len(tbs):
                raise InvalidArgumentError(
                    f"counts has {len(ns)} entries for {len(tbs)} blocks: give one per block"
                )
            accesses = nbytes = 0
            for i, (tb, n) in enumerate(zip(tbs, ns, strict=True)):
                if type(tb) is not TieredBlock or tb._owner is not self:
                    self._check_own(tb)
                if n.__class__ is not int or n < 0:
                    _count_arg(n, f"counts[{i}]")
                accesses += n
                nbytes += n * tb._nbytes
            self._touch_counted(tbs, ns, accesses, nbytes)
            return
        for tb in tbs:
            if type(tb) is not TieredBlock or tb._owner is not self:
                self._check_own(tb)
        with self._lock:
            for tb in tbs:
                if tb._block is None:
                    raise tb._gone()
            n = len(tbs)
            # No block is larger than a pool can be: the sum of the sizes is needed only near
            # the limit.
            if self._clock > MAX_BYTES - n or self._bytes_accessed > MAX_BYTES - n * MAX_CAPACITY:
                self._check_room(n, sum(tb._nbytes for tb in tbs), f"{n} accesses")
            touch = self._policy.touch
            fast, slow = self._fast_counts, self._slow_counts
            clock = self._clock
            accessed = 0
            recording = self._recording
            for tb in tbs:
                heat = tb._heat
                if heat is None:
                    heat = tb._heat = Heat()
                touch(heat, clock)
                clock += 1
                nbytes = tb._nbytes
                core = tb._core
                counts_of = slow if core is None else fast[core]
                counts_of.hits += 1
                counts_of.hit_bytes += nbytes
                accessed += nbytes
                if recording is not None:
                    recording.append(TierEvent("touch", tb.serial, count=1))
            self._clock = clock
            self._bytes_accessed += accessed

    def _check_room(self, accesses: int, nbytes: int, what: str) -> None:
        """Refuse `accesses` more accesses of `nbytes` bytes in all (`what`, for the message)
        when they would take the accesses or the bytes accessed past `2**64 - 1`, the most the
        figures keep (and a tier snapshot holds); the caller holds the lock."""
        if accesses > MAX_BYTES - self._clock:
            figure = f"the accesses recorded ({self._clock:,} so far)"
        elif nbytes > MAX_BYTES - self._bytes_accessed:
            figure = f"the bytes accessed ({self._bytes_accessed:,} so far, {nbytes:,} more)"
        else:
            return
        raise InvalidArgumentError(
            f"{what} would take {figure} past 2**64 - 1, the most the tiered pool's figures "
            "keep: nothing recorded"
        )

    def _touch_counted(
        self, tbs: Sequence[TieredBlock], ns: Sequence[int], accesses: int, nbytes: int
    ) -> None:
        """`touch_many` with counts, the arguments checked; `accesses` and `nbytes`: the
        accesses and their bytes in all."""
        with self._lock:
            for tb in tbs:
                if tb._block is None:
                    raise tb._gone()
            self._check_room(accesses, nbytes, f"counts (adding up to {accesses:,} accesses)")
            touch_n = self._touch_n
            fast, slow = self._fast_counts, self._slow_counts
            clock = self._clock
            accessed = 0
            for tb, n in zip(tbs, ns, strict=True):
                if not n:
                    continue
                heat = tb._heat
                if heat is None:
                    heat = tb._heat = Heat()
                touch_n(heat, clock, n)
                clock += n
                nbytes = n * tb._nbytes
                core = tb._core
                counts_of = slow if core is None else fast[core]
                counts_of.hits += n
                counts_of.hit_bytes += nbytes
                accessed += nbytes
            self._clock = clock
            self._bytes_accessed += accessed
            if self._recording is not None:
                self._recording.append(
                    TierEvent(
                        "touch_many",
                        serials=tuple(tb.serial for tb in tbs),
                        counts=tuple(ns),
                    )
                )

    @property
    def accesses(self) -> int:
        """Every access recorded so far (the policy's clock)."""
        return self._clock

    # ----------------------------------------------------------------------------------------
    # Moves

    def promote(self, tb: TieredBlock, *, core: int | None = None) -> None:
        """Move `tb` into the fast pool of `core` (default: its home core).

        Raises `PinnedBlockError` for a pinned block or one with live
        views, `OutOfMemoryError` when the fast pool has no room, and
        `MoveError` when the mover fails; in each case nothing changed.
        """
        self._check_own(tb)
        with self._lock:
            self._fold()
            target = tb.home if core is None else self._core(core)
            if tb.block is not None and tb._core == target:
                return
            if self._recording is not None:
                self._note("promote", tb, core=target)
            self._move(tb, Tier(FAST, target))

    def demote(self, tb: TieredBlock) -> None:
        """Move `tb` into the slow pool (same errors as `promote`)."""
        self._check_own(tb)
        with self._lock:
            self._fold()
            if tb.block is not None and tb._core is None:
                return
            if self._recording is not None:
                self._note("demote", tb)
            self._move(tb, Tier(SLOW))

    def _move(self, tb: TieredBlock, dst: Tier) -> None:
        """Copy `tb` to a new block in `dst` and re-point it; the caller holds the lock."""
        src_block = tb.block
        if not src_block.alive:
            self._fold()
            raise self._forget_gone(tb)
        if src_block.pins:
            raise PinnedBlockError(
                f"the block ({src_block.nbytes} bytes in {tb.location}) is pinned or has "
                f"{src_block.pins} live view(s): it does not move"
            )
        nbytes = tb._nbytes
        src_core = tb._core
        dst_core = dst.core
        pool = self.slow if dst_core is None else self.fast[dst_core]
        dst_block = pool.alloc(nbytes, align=tb._align, tag=src_block.tag)
        try:
            if self.movers is None:
                host_copy(src_block, dst_block, nbytes)
            else:
                self.movers(tb.location, src_block.offset, dst, dst_block.offset, nbytes)
        except BaseException as exc:
            dst_block.free()
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: as they are (nothing moved)
            raise MoveError(
                f"moving {nbytes} bytes from {tb.location} to {dst} failed ({exc!r}); nothing moved"
            ) from exc
        try:
            src_block.free()
        except PinnedBlockError:
            dst_block.free()  # a view appeared meanwhile: keep the block where it was
            raise
        tb._block = dst_block
        tb._core = dst_core
        if src_core is None:
            self._slow_blocks.discard(tb)
        else:
            self._resident[src_core].discard(tb)
            self._room[src_core] += 1
        if dst_core is None:
            self._slow_blocks.add(tb)
            if src_core is not None:
                self._fast_counts[src_core].demotions += 1
        else:
            self._resident[dst_core].add(tb)
            self._fast_counts[dst_core].promotions += 1

    def rebalance(self, max_bytes: int | None = None) -> RebalanceReport:
        """Promote the hottest blocks of the slow tier (by the policy's score, per byte when
        the policy says so) that fit in their home core's fast pool, demoting colder ones to
        make room, until `max_bytes` bytes have moved (`None`: no limit). A block for which
        residents were demoted and that still found no room waits until a block leaves its
        core's fast pool, or `WAIT_PASSES` rebalances of the core. Pinned blocks and blocks
        with views are skipped; a failed move changes nothing and the rebalance goes on.
        Returns what moved."""
        if max_bytes is not None:
            if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
                raise ArgumentTypeError(
                    f"max_bytes must be an int or None, got {type(max_bytes).__name__}"
                )
            if max_bytes < 0:
                raise InvalidArgumentError(
                    f"max_bytes must be an int >= 0 or None, got {max_bytes}"
                )
        start = time.perf_counter()
        policy = self._policy
        report = RebalanceReport(policy.name, max_bytes)
        if not policy.moves:
            report.seconds = time.perf_counter() - start
            return report
        budget = math.inf if max_bytes is None else max_bytes
        with self._lock:
            self._fold()
            self._forget_freed_behind()
            if self._recording is not None:
                self._note("rebalance", max_bytes=max_bytes)
            now = self._clock
            score = policy.score
            per_byte = policy.per_byte
            limit = self.fast_max_block
            ncores = self._ncores
            # The candidates of every core, in one pass over the slow tier: the blocks touched
            # at least once that may live in a fast tier, with a score above 0.
            candidates: list[list[tuple[float, TieredBlock]]] = [[] for _ in range(ncores)]
            # Over a copy: a policy's score may free or allocate blocks (the lock lets its
            # thread in); a block freed meanwhile has no block left and is skipped.
            for tb in list(self._slow_blocks):
                heat = tb._heat
                if heat is None:
                    continue
                nbytes = tb._nbytes
                if limit is not None and nbytes > limit:
                    continue
                value = score(heat, now)
                if value > 0:
                    candidates[tb.home].append((value / nbytes if per_byte else value, tb))
            # Each rebalance starts at the next core, so that a budget spent early on one core
            # does not leave the others without moves.
            first = self._next_core
            self._next_core = (first + 1) % ncores
            for k in range(ncores):
                core = (first + k) % ncores
                if candidates[core]:
                    budget = self._rebalance_core(core, candidates[core], budget, now, report)
        report.seconds = time.perf_counter() - start
        return report

    def _rebalance_core(
        self,
        core: int,
        candidates: list[tuple[float, TieredBlock]],
        budget: float,
        now: int,
        report: RebalanceReport,
    ) -> float:
        """Promote `candidates` (score and block) into the fast pool of `core`, hottest first,
        demoting colder residents to make room; returns the budget left. The caller holds the
        lock."""
        policy = self._policy
        score = policy.score
        per_byte = policy.per_byte
        candidates.sort(key=lambda c: (-c[0], c[1].serial))  # ties: the oldest first
        residents: list[tuple[float, TieredBlock]] | None = None  # the coldest first, when needed
        cold = 0  # residents[cold:] are the ones not demoted yet
        # The smallest size that found no room once no resident was left to demote: a block at
        # least as large is not tried again in this pass.
        no_room = math.inf
        misfits = self._misfits
        room = self._room
        passes = self._passes[core] = self._passes[core] + 1
        unplaced: list[TieredBlock] = []  # colder residents went for them, in vain
        for hotness, tb in candidates:
            nbytes = tb._nbytes
            if budget < nbytes or nbytes >= no_room:
                continue
            mark = misfits.get(tb) if misfits else None
            if mark is not None and mark[0] == room[core] and passes - mark[1] < WAIT_PASSES:
                continue  # no block left the pool since colder ones went for it in vain
            block = tb._block
            if block is None:
                continue
            if block.pins:
                report.skipped_pinned += 1
                continue
            # Per byte, a block's accesses are its score times its size: the blocks
            # demoted for it must serve fewer accesses in all than it does.
            gain = hotness * nbytes if per_byte else math.inf
            loss = 0.0
            demoted = 0
            while True:
                try:
                    self._move(tb, Tier(FAST, core))
                except OutOfMemoryError:
                    pass
                except (MoveError, PinnedBlockError):
                    report.failed += 1
                    break
                else:
                    budget -= nbytes
                    if misfits:
                        misfits.pop(tb, None)
                    report.moves.append(
                        TierMove(block.tag, nbytes, Tier(SLOW), Tier(FAST, core), hotness)
                    )
                    break
                # No room: demote the coldest resident colder than this block.
                if residents is None:
                    residents = []
                    for r in self._resident[core]:
                        value = score(r._heat or _UNTOUCHED, now)
                        residents.append((value / r._nbytes if per_byte else value, r))
                    residents.sort(key=lambda c: (c[0], c[1].serial))
                victim = None
                while cold < len(residents) and victim is None:
                    vscore, vtb = residents[cold]
                    cold += 1
                    if vscore >= hotness:
                        cold = len(residents)  # the later candidates are colder still
                        break
                    vblock = vtb._block
                    if vblock is None or vtb._core != core:
                        continue
                    if vblock.pins:
                        report.skipped_pinned += 1
                        continue
                    if budget < vtb._nbytes + nbytes:
                        continue
                    if per_byte and loss + vscore * vtb._nbytes >= gain:
                        cold -= 1  # it may still make room for a block of more accesses
                        break
                    victim = (vscore, vtb, vblock.tag)
                if victim is None:
                    if cold >= len(residents):
                        no_room = min(no_room, nbytes)
                    if demoted:
                        unplaced.append(tb)
                    break
                vscore, vtb, vtag = victim
                try:
                    self._move(vtb, Tier(SLOW))
                except (OutOfMemoryError, MoveError, PinnedBlockError):
                    report.failed += 1
                    break
                budget -= vtb._nbytes
                demoted += 1
                loss += vscore * vtb._nbytes
                report.moves.append(
                    TierMove(vtag, vtb._nbytes, Tier(FAST, core), Tier(SLOW), vscore)
                )
        # A block for which colder residents were demoted and that still found no room (its
        # free bytes not in one piece) waits until a block leaves the pool after this pass,
        # with every such block of the core: colder blocks refill the room, and trying it again
        # would only demote them again.
        if unplaced or misfits:
            for tb in misfits:
                if tb.home == core and misfits[tb][0] != room[core]:
                    misfits[tb] = (room[core], misfits[tb][1])
            for tb in unplaced:
                misfits[tb] = (room[core], passes)
        return budget

    # ----------------------------------------------------------------------------------------
    # Figures

    def stats(self) -> TierStats:
        """Per tier and per core: capacity, bytes in use, blocks, hits, allocations,
        promotions, demotions and spills."""
        with self._lock:
            self._fold()
            fast = tuple(
                TierUsage(
                    FAST,
                    core,
                    pool.capacity,
                    pool.stats().bytes_in_use,
                    len(self._resident[core]),
                    c.hits,
                    c.hit_bytes,
                    c.allocs,
                    c.promotions,
                    c.demotions,
                    c.spills,
                )
                for core, (pool, c) in enumerate(zip(self.fast, self._fast_counts, strict=True))
            )
            s = self._slow_counts
            slow = TierUsage(
                SLOW,
                None,
                self.slow.capacity,
                self.slow.stats().bytes_in_use,
                len(self._slow_blocks),
                s.hits,
                s.hit_bytes,
                s.allocs,
                sum(c.promotions for c in self._fast_counts),
                sum(c.demotions for c in self._fast_counts),
                0,
            )
            return TierStats(self.policy.name, fast, slow, self._clock, self._bytes_accessed)

    def snapshot(self, label: str = "") -> TierSnapshot:
        """Every tier at one moment: the stats and one pool snapshot per tier, labelled with
        the tier's name (`TierSnapshot`)."""
        with self._lock:
            stats = self.stats()
            snaps = {
                str(Tier(FAST, core)): pool.snapshot().with_label(str(Tier(FAST, core)))
                for core, pool in enumerate(self.fast)
            }
            snaps[str(Tier(SLOW))] = self.slow.snapshot().with_label(str(Tier(SLOW)))
        return TierSnapshot(stats, snaps, label)

    def check(self) -> int:
        """Check every pool (`Pool.check()`) and the tiered pool's books: every tiered block
        is alive in the pool of the tier that lists it. Returns the number of tiered blocks;
        raises `CorruptionError` naming the first disagreement."""
        from npumem.errors import CorruptionError

        with self._lock:
            self._fold()
            for pool in (*self.fast, self.slow):
                pool.check()
            listed = [(tb, self.fast[c]) for c, r in enumerate(self._resident) for tb in r]
            listed += [(tb, self.slow) for tb in self._slow_blocks]
            for tb, pool in listed:
                block = tb._block
                if block is None or not block.alive or block.pool is not pool:
                    raise CorruptionError(
                        f"{tb!r} is listed in pool {pool.name!r} but is not there"
                    )
            return len(listed)

    def blocks(self) -> list[TieredBlock]:
        """Every live tiered block, fast tiers first."""
        with self._lock:
            self._fold()
            out = [tb for resident in self._resident for tb in resident]
            return out + list(self._slow_blocks)

    def __repr__(self) -> str:
        return (
            f"<TieredPool {len(self.fast)} fast pools, slow {self.slow.capacity} bytes, "
            f"policy {self.policy.name}>"
        )
