"""The compaction coordinator: when to compact, what mode, with what pause budget.

The Rust core does the moving (`Pool.pause`, `Pool.compact_step`); this module decides when,
wraps every stop of the pool in the runtime's pause and resume hooks, keeps a full compaction
within the pause budget (splitting it into incremental steps when one stop would be too long),
and reports what happened.

Threads: one compaction at a time per compactor (a lock); the pool is stopped only inside a
step; the hooks run in the compacting thread before the pool stops and after it runs again.
The out-of-memory handler (`Compactor.attach()`) runs in the thread whose allocation failed,
with no pool lock held, so it may compact. In a process forked while another thread held the
compactor's lock (was compacting), the compactor's calls raise `PoolBusyError`: make a new one.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import NoReturn, Self

import npumem
from npumem._core import (
    CompactionPlan,
    StepReport,
    oom_handler_may_wait,
    oom_request_sizes,
    oom_retry_may_grow,
)
from npumem._fork_safe import ForkSafeRLock
from npumem._shown import shown
from npumem.compaction.movers import Mover
from npumem.compaction.policy import Mode, Policy, check_mode
from npumem.compaction.report import CompactionReport
from npumem.errors import InvalidArgumentError, PoolBusyError
from npumem.sizes import format_bytes as human_bytes

__all__ = ["Compactor"]

#: A first guess at moving throughput (bytes/s) before any step was measured: what a shared
#: machine's memmove reaches at least; a pause budget uses it until steps measure better.
INITIAL_THROUGHPUT = 1e9


def _seconds(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise InvalidArgumentError(
            f"{name} must be a finite number of seconds > 0 or None, got {shown(value)}"
        )
    return float(value)


def _room(stats: npumem.PoolStats) -> int:
    """The bytes a full compaction can join for an allocation: the free bytes and the unused
    room of partly used slabs (`slab_cached_bytes`, not free, but a compaction packs the slab
    objects and gives the slabs it empties back)."""
    return stats.bytes_free + stats.slab_cached_bytes


def _check_max_bytes(value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidArgumentError(f"max_bytes must be an int >= 1 or None, got {shown(value)}")


def _callable(value: object, name: str) -> Callable[..., object] | None:
    if value is None or callable(value):
        return value
    raise InvalidArgumentError(f"{name} must be callable or None, got {type(value).__name__}")


class Compactor:
    """Compacts `pool`: on demand (`compact()`), when fragmentation passes the policy's
    threshold (`maybe_compact()`, `on_sample()`), and, once `attach()` ed, when an
    allocation fails although enough bytes are free or unused in partly used slabs (then the
    allocation is retried once).

    Every compaction starts from its own plan (what a full compaction would reach) and moves
    nothing when that plan predicts no larger free block.

    `mover` copies the bytes of a `backing="none"` pool (see `npumem.compaction.movers`);
    `pause_budget` (seconds) is the longest one stop of the pool should last: a full compaction
    expected to take longer runs as incremental steps sized to it, and its report says what
    they could not move and why (`unmoved_blocks`, `notes`); a rescue of a failed allocation
    ends once the room is made, and takes one full compaction over the budget when steps
    within it cannot make the room; `on_pause` and
    `on_resume` are called around every stop (a runtime stops and restarts its streams there);
    `pause_timeout` is how long a stop waits for allocations in flight.

    A hook or mover that raises stops the compaction: the steps made until then (the step
    whose `on_resume` raised included) are counted and reported, then the exception
    propagates. A hook or mover that calls `compact()` or `maybe_compact()` of the same
    compactor gets `PoolBusyError` at once (the call would wait for the compaction it runs in).
    """

    def __reduce__(self) -> NoReturn:
        # A copy would work on the same live pool (copy.copy, deepcopy and pickle all come
        # here), and the pool itself cannot be copied.
        raise TypeError("cannot copy or pickle a 'Compactor' object: it works on a live pool")

    def __init__(
        self,
        pool: npumem.Pool,
        *,
        policy: Policy | None = None,
        mover: Mover | None = None,
        pause_budget: float | None = None,
        on_pause: Callable[[], object] | None = None,
        on_resume: Callable[[], object] | None = None,
        pause_timeout: float = 10.0,
    ) -> None:
        if not isinstance(pool, npumem.Pool):
            raise InvalidArgumentError(f"pool must be an npumem.Pool, got {type(pool).__name__}")
        if policy is not None and not isinstance(policy, Policy):
            raise InvalidArgumentError(
                f"policy must be an npumem.compaction.Policy, got {type(policy).__name__}"
            )
        if mover is None and pool.backing == "none":
            raise InvalidArgumentError(
                'a pool with backing="none" keeps its bytes on a device: give the Compactor a mover'
            )
        self.pool = pool
        self.policy = policy if policy is not None else Policy()
        self.mover = _callable(mover, "mover")
        self.pause_budget = _seconds(pause_budget, "pause_budget")
        self.on_pause = _callable(on_pause, "on_pause")
        self.on_resume = _callable(on_resume, "on_resume")
        timeout = _seconds(pause_timeout, "pause_timeout")
        self.pause_timeout = 10.0 if timeout is None else timeout
        self.reports: list[CompactionReport] = []
        self.compactions = 0
        #: Failed allocations that waited for room (`Policy.wait_for_room`), those of them that
        #: waited in vain, and the seconds they waited in all.
        self.waits = 0
        self.waits_failed = 0
        self.waited_seconds = 0.0
        self._lock = ForkSafeRLock("Compactor")
        self._busy = threading.local()
        self._last_auto = -float("inf")
        self._waiting = False  # a thread waits for room (one at a time)
        self._no_wait_until = -float("inf")  # after a wait in vain, none until then
        self._throughput = INITIAL_THROUGHPUT
        self._attached = False

    # ----- compaction ----------------------------------------------------------------------

    def compact(
        self, mode: Mode | None = None, *, max_bytes: int | None = None, reason: str = "manual"
    ) -> CompactionReport:
        """Compact now. `mode`: `"full"` (default: the policy's mode) stops the pool once:
        slab objects are packed, then every block above a boundary chunk is packed into the holes
        below it, so free space becomes one run but for what pinned blocks and the bank rule
        leave (see `docs/compaction.md`); `"incremental"` evacuates the chunks above the
        boundary sparsest first, in steps of at most `max_bytes` of moves (default: the
        policy's), the pool stopped only during each step, until a step finds nothing to move.
        Returns the report (also kept in `reports`). Called from this compactor's own
        compaction (a hook, the mover), it raises `PoolBusyError` and does nothing."""
        checked = check_mode(self.policy.mode if mode is None else mode)
        _check_max_bytes(max_bytes)
        self._refuse_reentry("compact")
        with self._lock:
            self._busy.active = True
            try:
                return self._compact(checked, max_bytes, reason)
            finally:
                self._busy.active = False

    def _refuse_reentry(self, call: str) -> None:
        """`PoolBusyError` when the calling thread runs a compaction of this compactor (a hook
        or the mover calls `call`): the call would wait for that compaction, which waits for
        the hook."""
        if getattr(self._busy, "active", False):
            raise PoolBusyError(
                f"{call}() was called from a compaction of this same compactor (its on_pause or "
                "on_resume hook, or its mover): it would wait for itself; nothing was done"
            )

    def _compact(
        self,
        mode: Mode,
        max_bytes: int | None,
        reason: str,
        need: int | None = None,
        apart: bool = False,
    ) -> CompactionReport:
        """One compaction. `need`: a rescue for an allocation of that many bytes, which ends
        as soon as the largest free block holds it and may exceed the pause budget when
        only that makes the room. `apart`: the rescue of a batch whose items may fit apart,
        which compacts whenever the plan moves a block, even when it predicts no block of
        `need` bytes."""
        started = time.perf_counter()
        before = self.pool.stats()
        steps: list[StepReport] = []
        notes: list[str] = []
        ran: Mode = mode
        unmoved = (0, 0)
        # The compaction's own plan: what a full compaction would reach. When it predicts no
        # larger free block (or, for a rescue, no room for the request), nothing moves.
        plan = self.plan("full")
        goal = before.largest_free_block + 1 if need is None else need
        if (plan.largest_free_after < goal and not apart) or plan.blocks == 0:
            notes.append(
                f"the plan predicts a largest free block of {human_bytes(plan.largest_free_after)}"
                f" (now {human_bytes(before.largest_free_block)})"
                + ("" if need is None else f", {human_bytes(need)} needed")
                + ": nothing moved"
            )
            return self._report(ran, reason, steps, before, started, notes, unmoved)
        if mode == "full" and self.pause_budget is not None:
            expected = plan.bytes / self._throughput
            if expected > self.pause_budget:
                ran = "incremental"
                notes.append(
                    f"a full compaction would move {plan.bytes:,} bytes, about "
                    f"{expected * 1e3:.1f} ms at {self._throughput / 1e9:.2f} GB/s: over the "
                    f"pause budget of {self.pause_budget * 1e3:.1f} ms, so incremental steps"
                )
        try:
            if ran == "full":
                self._step("full", None, steps)
            else:
                budget = max_bytes if max_bytes is not None else self.policy.max_bytes
                if self.pause_budget is not None:
                    budget = max(1 << 16, min(budget, int(self.pause_budget * self._throughput)))
                # Every step empties chunks into denser ones or slides runs down, so steps run
                # out: stop at the first that moves nothing (or after max_steps), or once a
                # rescue has its room.
                for _ in range(self.policy.max_steps):
                    if need is not None and self.pool.stats().largest_free_block >= need:
                        break
                    step = self._step("incremental", budget, steps)
                    if step.blocks == 0:
                        break
                    if self.pause_budget is not None:
                        budget = max(
                            1 << 16, min(budget, int(self.pause_budget * self._throughput))
                        )
                if need is not None and self.pool.stats().largest_free_block < need:
                    # Steps within the budget cannot make the room (a block larger than a step
                    # must move): the rescue takes one full compaction, over the budget.
                    self._step("full", None, steps)
                    ran = "full"
                    notes.append(
                        f"steps within the pause budget left no room for {human_bytes(need)}: "
                        "a full compaction made it, over the budget"
                    )
                elif self.pause_budget is not None:
                    unmoved = self._unmoved(budget, notes)
        except BaseException as exc:
            # A hook, the mover or an interrupt stopped the compaction: the steps made until
            # then moved blocks, so they are counted and reported before the error goes on.
            if steps:
                notes.append(
                    f"stopped after {len(steps)} step(s): {type(exc).__name__} {shown(str(exc))}"
                )
                self._report(ran, reason, steps, before, started, notes, unmoved)
            raise
        return self._report(ran, reason, steps, before, started, notes, unmoved)

    def _unmoved(self, step_bytes: int, notes: list[str]) -> tuple[int, int]:
        """What a full compaction would still move after the steps of a compaction under a
        pause budget, with a note saying why the steps left it: (blocks, bytes)."""
        rest = self.plan("full")
        if rest.blocks == 0 or rest.largest_free_after <= self.pool.stats().largest_free_block:
            return (0, 0)
        big = [m for m in rest.moves if m.nbytes > step_bytes]
        if big:
            largest = max(m.nbytes for m in big)
            notes.append(
                f"not moved: {sum(m.blocks for m in big):,} block(s) of "
                f"{human_bytes(sum(m.nbytes for m in big))} larger than a step of "
                f"{human_bytes(step_bytes)} (the largest {human_bytes(largest)}, about "
                f"{largest / self._throughput * 1e3:.1f} ms to move: over the pause budget of "
                f"{self.pause_budget_ms:.1f} ms)"
            )
        small = rest.blocks - sum(m.blocks for m in big)
        if small:
            notes.append(
                f"not moved: {small:,} block(s) that a full compaction would move into holes "
                "that the incremental steps (chunks above the boundary, each into a place below "
                "its own chunk) do not use, or beyond the policy's max_steps"
            )
        return (rest.blocks, rest.bytes)

    @property
    def pause_budget_ms(self) -> float:
        """The pause budget in milliseconds (0.0 without one)."""
        return 0.0 if self.pause_budget is None else self.pause_budget * 1e3

    def _report(
        self,
        ran: Mode,
        reason: str,
        steps: list[StepReport],
        before: npumem.PoolStats,
        started: float,
        notes: list[str],
        unmoved: tuple[int, int],
    ) -> CompactionReport:
        after = self.pool.stats()
        report = CompactionReport(
            mode=ran,
            reason=reason,
            steps=tuple(steps),
            fragmentation_before=before.external_fragmentation,
            fragmentation_after=after.external_fragmentation,
            largest_free_before=before.largest_free_block,
            largest_free_after=after.largest_free_block,
            bytes_free_before=before.bytes_free,
            bytes_free_after=after.bytes_free,
            seconds=time.perf_counter() - started,
            notes=tuple(notes),
            unmoved_blocks=unmoved[0],
            unmoved_bytes=unmoved[1],
        )
        self.reports.append(report)
        del self.reports[:-100]  # a bounded history
        self.compactions += 1
        return report

    def _step(self, mode: Mode, max_bytes: int | None, steps: list[StepReport]) -> StepReport:
        """One stop of the pool: the step planned (the pool running), hooks, pause, the step
        checked and made, resume, hooks. The step made is appended to `steps` before the
        `on_resume` hook runs, so that a hook that raises leaves it listed."""
        # Planned while the pool runs; under the pause only the moves are checked and made.
        staged = self.pool.stage_compaction(mode, max_bytes=max_bytes, mover=self.mover)
        if self.on_pause is not None:
            self.on_pause()
        listed = False
        t0 = time.perf_counter()
        try:
            with self.pool.pause(self.pause_timeout) as pause:
                done = self.pool.run_staged(pause, staged, mover=self.mover)
            step = self._made(done, time.perf_counter() - t0)
            steps.append(step)
            listed = True
        except BaseException:
            # The step was made, but an exception came before it was listed: Ctrl-C during a
            # long step is handled as `run_staged` returns. It moved blocks: it is listed.
            made = staged.report
            if made is not None and not listed:
                steps.append(made.with_pause(time.perf_counter() - t0, over_budget=False))
            if self.on_resume is not None:
                self.on_resume()
            raise
        if self.on_resume is not None:
            self.on_resume()
        return step

    def _made(self, done: StepReport, paused: float) -> StepReport:
        """A step made, with its pause; its copy speed joins the throughput estimate."""
        if done.bytes >= 1 << 20 and done.moving_seconds > 0:
            measured = done.bytes / done.moving_seconds
            self._throughput = 0.5 * self._throughput + 0.5 * measured
        over = self.pause_budget is not None and paused > self.pause_budget
        return done.with_pause(paused, over_budget=over)

    def plan(self, mode: Mode = "full", *, max_bytes: int | None = None) -> CompactionPlan:
        """What `compact()` would move now (for `"incremental"`: its first step), moving
        nothing; the pool is stopped only for the look. A plan may list moves that leave the
        largest free block as it is (`largest_free_after` equal to `largest_free_before`):
        `compact()` then moves nothing, as its note says."""
        checked = check_mode(mode)
        _check_max_bytes(max_bytes)
        limit = max_bytes if max_bytes is not None else self.policy.max_bytes
        # The look stops the pool as a step does: waiting at most `pause_timeout`.
        with self.pool.pause(self.pause_timeout) as pause:
            plan = self.pool.plan_compaction(
                checked,
                max_bytes=limit if checked == "incremental" else None,
                pause=pause,
                mover=self.mover,
            )
        return plan

    # ----- policies --------------------------------------------------------------------------

    def _interval_passed(self) -> bool:
        return time.monotonic() - self._last_auto >= self.policy.min_interval

    def maybe_compact(self) -> CompactionReport | None:
        """Compact (the policy's mode) if fragmentation is above the policy's threshold and the
        last automatic compaction is at least `min_interval` ago; else `None`. Called from this
        compactor's own compaction (a hook, the mover), it raises `PoolBusyError`."""
        self._refuse_reentry("maybe_compact")
        threshold = self.policy.fragmentation_threshold
        if threshold is None:
            return None
        if self.pool.stats().external_fragmentation <= threshold:
            return None
        with self._lock:
            if not self._interval_passed():
                return None
            stats = self.pool.stats()
            if stats.external_fragmentation <= threshold:
                return None
            self._last_auto = time.monotonic()
            return self.compact(reason=f"fragmentation {stats.external_fragmentation:.1%}")

    def on_sample(self, sample: object) -> None:
        """A `Monitor` `on_sample` callback: the threshold policy."""
        frag = getattr(sample, "external_fragmentation", None)
        threshold = self.policy.fragmentation_threshold
        if threshold is not None and isinstance(frag, float) and frag > threshold:
            self.maybe_compact()

    def _on_out_of_memory(self, nbytes: int) -> bool:
        """The pool's out-of-memory handler: compact if that can help, else (with the policy's
        `wait_for_room`) wait for room; whether to retry. `nbytes` is a batch's total
        (`alloc_many`); its items need not fit in one block."""
        if not self.policy.on_failure or getattr(self._busy, "active", False):
            return False
        if self.pool.paused_by_caller():
            # A compaction stops the pool itself, between the runtime's hooks; this thread's
            # own pause forbids that, and no other thread can free until it resumes.
            return False
        sizes = oom_request_sizes() or [nbytes]
        stats = self.pool.stats()
        if stats.largest_free_block >= nbytes:
            return True  # room appeared meanwhile (another thread freed, or a race): retry
        if _room(stats) >= nbytes and self._rescue(nbytes, len(sizes) > 1):
            return True
        return self._wait_for_room(nbytes, sizes)

    def _rescue(self, nbytes: int, batch: bool) -> bool:
        """Compact for an allocation of `nbytes` (the policy's mode: incremental steps of its
        `max_bytes` stop once the room is there, and end with one full compaction when they
        did not make it) unless another automatic compaction ran less than `min_interval`
        ago; whether to retry: the room is there now or, for a batch (`batch`: its items may
        fit apart where their total does not), the compaction moved blocks.

        A thread that holds what other threads need (the pool's pause, a KV cache's lock:
        `oom_handler_may_wait()` is false) does not wait for another thread's compaction,
        which may itself wait for that pause or lock: it declines at once."""
        may_wait = oom_handler_may_wait()
        held_before = self._lock.held_here()
        got = False
        try:
            # A KeyboardInterrupt may land after the lock is taken and before `got` is set:
            # the `finally` below then finds the lock this thread's and gives it back.
            got = self._lock.acquire(blocking=may_wait)
            if not got:
                return False
            moved = False
            if self._interval_passed():
                self._last_auto = time.monotonic()
                self._busy.active = True
                try:
                    reason = f"{'batch ' if batch else ''}allocation of {nbytes:,} bytes failed"
                    report = self._compact(self.policy.mode, None, reason, need=nbytes, apart=batch)
                    moved = any(step.blocks for step in report.steps)
                finally:
                    self._busy.active = False
            return self.pool.stats().largest_free_block >= nbytes or (batch and moved)
        finally:
            if got or (not held_before and self._lock.held_here()):
                self._lock.release()

    def _wait_for_room(self, nbytes: int, sizes: list[int]) -> bool:
        """Wait up to the policy's `wait_for_room` for room for a request of `sizes` (`nbytes`
        in all), compacting again when the interval allows and the bytes are free; whether
        it came. Room for one block is a free block of `nbytes`; for a batch, whose items may
        fit apart, also more free bytes than when the wait began, at least `nbytes` of them,
        with a free block that holds the largest item (the retry then tells).

        It does not wait when the retry may grow the pool (`oom_retry_may_grow()`: a pool that
        can grow asks its handler before it grows, and asks again if the growth fails, its
        `on_grow` refusing or no region having room), when the allocation holds what other
        threads need to free (a KV cache's lock, or the pool's pause), when another thread
        waits already (one waiter at a time, so that the others raise, go on and free), or when
        a wait ended in vain less than `wait_for_room` ago (a pool too small for its load then
        fails fast rather than slowly)."""
        wait = self.policy.wait_for_room
        if wait <= 0 or oom_retry_may_grow() or not oom_handler_may_wait():
            return False
        found = waiting = False
        started = time.monotonic()
        try:
            with self._lock:
                if self._waiting or time.monotonic() < self._no_wait_until:
                    return False
                self._waiting = waiting = True  # one store: no interrupt between the two
            batch = len(sizes) > 1
            free_at_start = self.pool.stats().bytes_free
            while not found and time.monotonic() - started < wait:
                time.sleep(0.001)
                stats = self.pool.stats()
                found = (
                    stats.largest_free_block >= nbytes
                    or (
                        batch
                        and stats.bytes_free > free_at_start
                        and stats.bytes_free >= nbytes
                        and stats.largest_free_block >= max(sizes)
                    )
                    or (
                        _room(stats) >= nbytes
                        and self._interval_passed()
                        and self._rescue(nbytes, batch)
                    )
                )
        finally:
            if waiting:
                self._end_wait(found, started, wait)
        return found

    def _end_wait(self, found: bool, started: float, wait: float) -> None:
        """The wait of `_wait_for_room` that began at `started` ended (`found`: the room came)."""
        with self._lock:
            now = time.monotonic()
            self._waiting = False
            if not found:
                self._no_wait_until = now + wait
            self.waits += 1
            self.waits_failed += not found
            self.waited_seconds += now - started

    # ----- attaching -------------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        """Whether the pool calls this compactor when an allocation fails."""
        return self._attached and self.pool.oom_handler == self._on_out_of_memory

    def attach(self) -> Self:
        """Hook into the pool: from now on an allocation (`alloc`, `alloc_many`) that fails
        although enough bytes are free (or unused in partly used slabs, which a compaction
        empties) compacts and is retried once before it raises `OutOfMemoryError`. Replaces
        any other handler; returns `self`."""
        self.pool.set_oom_handler(self._on_out_of_memory)
        self._attached = True
        return self

    def detach(self) -> None:
        """Undo `attach()` (leaves another compactor's handler alone)."""
        if self.pool.oom_handler == self._on_out_of_memory:
            self.pool.set_oom_handler(None)
        self._attached = False

    def __enter__(self) -> Self:
        return self.attach()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.detach()

    def __repr__(self) -> str:
        return (
            f"<npumem.compaction.Compactor pool={self.pool.name!r} mode={self.policy.mode!r} "
            f"attached={self.attached} compactions={self.compactions}>"
        )
