"""A solved plan: an offset per buffer, the bound it is measured against, checks and exports."""

from __future__ import annotations

import contextlib
import csv
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import add, attrgetter
from typing import Any, Protocol, cast

from npumem._shown import shown
from npumem.fileio import json_text, write_text
from npumem.plan.buffers import Buffer
from npumem.plan.c_header import c_comment, c_identifier, c_string
from npumem.plan.errors import (
    PlanArgumentError,
    PlanArgumentTypeError,
    PlanError,
    PlanValidationError,
)
from npumem.plan.json_rows import buffer_rows, rows_json, tensor_rows
from npumem.plan.problem import (
    MAX_PLAN_BYTES,
    PLAN_FORMAT,
    PLAN_VERSION,
    Problem,
    check_problem,
    csv_id,
)
from npumem.sizes import MAX_BYTES

__all__ = [
    "FEASIBLE",
    "INFEASIBLE",
    "NOT_MET",
    "OPTIMAL",
    "BlockLike",
    "SearchStats",
    "Solution",
]

_ID = attrgetter("id")
_SIZE = attrgetter("size")


def check_offsets(buffers: Sequence[Buffer], offsets: Sequence[object]) -> None:
    """Raise `PlanValidationError` naming the first buffer whose offset (`offsets[i]` for
    `buffers[i]`) is not an integer >= 0, or whose end (offset plus size) lies beyond
    `MAX_PLAN_BYTES`, the most bytes a plan can address: no plan with such an offset is
    written, and the core's checks take offsets and ends in 64 bits."""
    # The common case in C: every offset an int (bools are not), none negative, no end too far.
    if set(map(type, offsets)) <= {int}:
        ints = cast("Sequence[int]", offsets)
        if not ints or (
            min(ints) >= 0 and max(map(add, ints, map(_SIZE, buffers))) <= MAX_PLAN_BYTES
        ):
            return
    for b, o in zip(buffers, offsets, strict=True):
        if isinstance(o, bool) or not isinstance(o, int) or o < 0:
            raise PlanValidationError(
                f"buffer {shown(b.id)}: offset {shown(o)} is not an integer >= 0"
            )
        if o + b.size > MAX_PLAN_BYTES:
            raise PlanValidationError(
                f"buffer {shown(b.id)}: offset {o} + size {b.size} ends at {o + b.size}, "
                f"beyond the {MAX_PLAN_BYTES} bytes (2^63 - 1) a plan can address"
            )


OPTIMAL = "optimal"
"""The arena equals a proven lower bound: no packing is smaller."""
FEASIBLE = "feasible"
"""A valid packing (within the capacity, when one was asked), optimality not proven."""
NOT_MET = "capacity-not-met"
"""A capacity was asked and no packing within it was found in time (the best one is kept)."""
INFEASIBLE = "infeasible"
"""A capacity was asked and it is proven too small (below a lower bound, or search exhausted)."""


def check_count(name: str, value: object, unit: str = "bytes") -> None:
    """Refuse an optional count of `unit` that is not a whole number from 0 to 2**64 - 1, what
    the plan files hold (`PlanArgumentTypeError` for a float, a bool or text;
    `PlanArgumentError` for one out of that range)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanArgumentTypeError(
            f"{name} must be a whole number of {unit} or None, got {shown(value)}"
        )
    if value < 0:
        raise PlanArgumentError(f"{name} must be >= 0, got {value}")
    if value > MAX_BYTES:
        raise PlanArgumentError(f"{name} must be at most 2**64 - 1, got {value}")


class BlockLike(Protocol):
    """What `Solution.bind()` needs of a block: where it starts and how long it is
    (`npumem.Block` has both)."""

    @property
    def offset(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


class BoundOffsets(dict[str, int]):
    """The table `Solution.bind()` returns: tensor name -> absolute offset, a `dict`. While it
    lives (until `release()` or the end of a `with` statement) it holds a pin on the block, so
    that a compaction cannot move the block and the offsets stay true."""

    __slots__ = ("_block",)

    def __init__(self, offsets: dict[str, int], block: object | None) -> None:
        super().__init__(offsets)
        self._block = block

    @property
    def pinned(self) -> bool:
        """Whether the table still holds its pin on the block."""
        return self._block is not None

    def release(self) -> None:
        """Drop the pin on the block (the offsets may then change with a compaction). A second
        call does nothing."""
        block, self._block = self._block, None
        if block is not None:
            block.unpin()  # type: ignore[attr-defined]

    def __enter__(self) -> BoundOffsets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        # The block may be freed or detached meanwhile: then there is nothing left to unpin.
        with contextlib.suppress(Exception):
            self.release()


@dataclass(slots=True)
class SearchStats:
    """How a solution was found."""

    greedy_rule: str = ""
    """The greedy rule the search started from."""
    greedy_arena: int = 0
    """The arena of that rule's packing."""
    greedy_seconds: float = 0.0
    """Time the greedy phase took (the scan and the rules run until one met the goal or the
    deadline passed): the first answer."""
    seconds: float = 0.0
    """Total time of `npumem.plan.solve()`."""
    time_to_fit: float | None = None
    """Seconds until the first packing within the capacity (`None`: no capacity, or none)."""
    nodes: int = 0
    """Search nodes expanded."""
    runs: int = 0
    """Search restarts."""
    improvements: list[tuple[float, int]] = field(default_factory=list)
    """`(seconds, arena)` each time a smaller packing was found."""


class Solution:
    """Offsets for every buffer of `problem`.

    `offsets` maps buffer id to offset (a sequence in problem order is accepted too). Solutions
    from `npumem.plan.solve()` carry the lower bound, the status and search statistics; one
    built by hand (to check an external plan) gets the problem's static lower bound.
    A `problem` that is not a `Problem`, `offsets` that are neither a mapping nor a sequence,
    or a `lower_bound` or `capacity` that is not a whole number of bytes raises
    `PlanArgumentTypeError`; an offset that is not an integer >= 0, or one at which its
    buffer would end beyond `MAX_PLAN_BYTES` (2^63 - 1, the most bytes a plan can address),
    raises `PlanValidationError` (`check_offsets`). The writers (`to_csv`, `to_json`,
    `to_c_header`) check the offsets again, so no file gets an offset a plan cannot hold.
    """

    def __init__(
        self,
        problem: Problem,
        offsets: Mapping[str, int] | Sequence[int],
        *,
        lower_bound: int | None = None,
        capacity: int | None = None,
        status: str | None = None,
        stats: SearchStats | None = None,
    ) -> None:
        check_problem(problem, "Solution()")
        if isinstance(offsets, str | bytes) or not isinstance(offsets, Mapping | Sequence):
            raise PlanArgumentTypeError(
                "offsets must map buffer ids to offsets or list them in problem order, got "
                f"{type(offsets).__name__}"
            )
        check_count("lower_bound", lower_bound)
        check_count("capacity", capacity)
        self.problem = problem
        if isinstance(offsets, Mapping):
            unknown = [str(k) for k in offsets if k not in problem._index]
            if unknown:
                raise PlanError(f"offsets given for unknown buffer(s): {', '.join(unknown[:5])}")
            missing = [b.id for b in problem.buffers if b.id not in offsets]
            if missing:
                raise PlanValidationError(f"buffer {shown(missing[0])} has no offset")
            given = [offsets[b.id] for b in problem.buffers]
        else:
            if len(offsets) != len(problem.buffers):
                raise PlanError(f"{len(offsets)} offsets given for {len(problem.buffers)} buffers")
            given = list(offsets)
        check_offsets(problem.buffers, given)
        self.offsets: dict[str, int] = dict(zip(map(_ID, problem.buffers), given, strict=True))
        if lower_bound is None:
            from npumem.plan.bounds import lower_bound as static_bound

            lower_bound = static_bound(problem)
        self.lower_bound: int = lower_bound
        """The bound the arena is measured against (never above the optimum)."""
        self.capacity = capacity
        """The capacity that was asked for, if any."""
        # From the list (checked integers): the dict's lookups cost more at many buffers.
        arena = max(map(add, given, map(_SIZE, problem.buffers)), default=0)
        if arena < lower_bound:
            # No valid plan is smaller than the bound: say which rule these offsets break.
            self.validate()
            raise PlanValidationError(
                f"the offsets need {arena:,} bytes, less than the lower bound "
                f"{lower_bound:,}, which no valid plan goes below"
            )
        self.stats = stats if stats is not None else SearchStats()
        if status is None:
            status = OPTIMAL if arena <= lower_bound else FEASIBLE
            if capacity is not None and arena > capacity:
                status = NOT_MET
        self.status = status
        """One of `optimal`, `feasible`, `capacity-not-met`, `infeasible`."""

    @property
    def arena_size(self) -> int:
        """Bytes the packing needs: the highest end of any buffer."""
        buffers = self.problem.buffers
        offsets = self.offsets
        if len(offsets) == len(buffers):
            # Every buffer has its offset (the common case): one pass in C, no test per id.
            with contextlib.suppress(KeyError):
                ends = map(add, map(offsets.__getitem__, map(_ID, buffers)), map(_SIZE, buffers))
                return max(ends, default=0)
        return max((offsets[b.id] + b.size for b in buffers if b.id in offsets), default=0)

    @property
    def gap(self) -> float:
        """How far above the lower bound the arena is, as a fraction (0.05 is 5% above)."""
        if self.lower_bound <= 0:
            return 0.0
        return (self.arena_size - self.lower_bound) / self.lower_bound

    @property
    def fits(self) -> bool | None:
        """Whether the arena is within the capacity asked for (`None` when none was asked)."""
        if self.capacity is None:
            return None
        return self.arena_size <= self.capacity

    @property
    def naive_size(self) -> int:
        """Bytes without any reuse: the arena of the buffers placed one after the other, in
        problem order, each at the first offset after the one before that is a multiple of
        its alignment (the sum of the sizes plus the padding alignment needs). Pinned buffers
        are stacked like the others: this is the memory the buffers take with no plan."""
        end = 0
        for b in self.problem.buffers:
            end = -(-end // b.alignment) * b.alignment + b.size
        return end

    def __repr__(self) -> str:
        return (
            f"<Solution {self.status}: arena {self.arena_size} bytes, lower bound "
            f"{self.lower_bound}, gap {self.gap:.2%}>"
        )

    def summary(self) -> str:
        """One line: arena, lower bound, gap, status, time."""
        text = (
            f"arena {self.arena_size:,} bytes, lower bound {self.lower_bound:,}, "
            f"gap {self.gap:.2%}, {self.status}"
        )
        if self.capacity is not None:
            text += f" (capacity {self.capacity:,}: {'fits' if self.fits else 'does not fit'})"
        return text + f", {self.stats.seconds:.3f} s"

    # ----------------------------------------------------------------------------------------
    # Checks

    def _placed(self) -> list[int]:
        """The offsets in problem order, each checked (`check_offsets`): an integer >= 0
        whose buffer ends within `MAX_PLAN_BYTES`. `offsets` is a plain dict that may have
        changed since the solution was made, so every writer and `validate` check it again;
        anything else raises `PlanValidationError`."""
        buffers = self.problem.buffers
        try:
            placed: list[int] = list(map(self.offsets.__getitem__, map(_ID, buffers)))
        except KeyError:
            missing = next(b for b in buffers if b.id not in self.offsets)
            raise PlanValidationError(f"buffer {shown(missing.id)} has no offset") from None
        check_offsets(buffers, placed)
        return placed

    def validate(self, capacity: int | None = None) -> None:
        """Raise `PlanValidationError` unless every buffer is placed at a
        non-negative offset that is a multiple of its alignment and ends within
        `MAX_PLAN_BYTES` (2^63 - 1, the most bytes a plan can address), pinned buffers are
        where they are pinned, no two buffers live at the same time share a byte, and, when
        `capacity` is given, the arena is within it (`fits` tells whether the asked capacity
        was met). A `capacity` that is not a whole number of bytes raises
        `PlanArgumentTypeError`, one negative or above 2**64 - 1 `PlanArgumentError`, as
        `solve` does."""
        check_count("capacity", capacity)
        buffers = self.problem.buffers
        offsets = self._placed()
        for b, o in zip(buffers, offsets, strict=True):
            if o % b.alignment:
                raise PlanValidationError(
                    f"buffer {shown(b.id)}: offset {o} is not a multiple of its alignment "
                    f"{b.alignment}"
                )
            if b.offset is not None and o != b.offset:
                raise PlanValidationError(
                    f"buffer {shown(b.id)} is pinned at {b.offset}, placed at {o}"
                )
        clash = self.problem.timeline.first_overlap(offsets)
        if clash is not None:
            i, j = clash
            a, b = buffers[i], buffers[j]
            raise PlanValidationError(
                f"buffers {shown(a.id)} (live [{a.lower}, {a.upper}), bytes [{offsets[i]}, "
                f"{offsets[i] + a.size})) and {shown(b.id)} (live [{b.lower}, {b.upper}), bytes "
                f"[{offsets[j]}, {offsets[j] + b.size})) are live at the same time and share "
                "bytes"
            )
        if capacity is not None and self.arena_size > capacity:
            raise PlanValidationError(
                f"the arena needs {self.arena_size} bytes, above the capacity of {capacity}"
            )

    # ----------------------------------------------------------------------------------------
    # Exports

    def tensor_offsets(self) -> dict[str, tuple[int, int]]:
        """`name -> (offset, size)` for every tensor: the buffers, then the aliases (views and
        in-place outputs) at their base's offset plus their own, then the tensors of 0 bytes
        that lie in no buffer (`Problem.empty`) at offset 0 with size 0."""
        table = {b.id: (self.offsets[b.id], b.size) for b in self.problem.buffers}
        table.update(self._other_tensors())
        return table

    def _other_tensors(self) -> dict[str, tuple[int, int]]:
        """The entries of `tensor_offsets()` after the buffers': aliases, then empty
        tensors (the problem keeps every name distinct)."""
        table = {
            alias.name: (self.offsets[alias.base] + alias.offset, alias.size)
            for alias in self.problem.aliases
        }
        for name in self.problem.empty:
            table[name] = (0, 0)
        return table

    def slot_offsets(self, name: str) -> list[int]:
        """The offset of each slot of a pipelined buffer (see
        `pipelined()`), slot 0 first."""
        if name not in self.problem.slots:
            raise KeyError(f"{shown(name)} is not a pipelined buffer of this problem")
        return [self.offsets[i] for i in self.problem.slots[name]]

    def iteration_offsets(self, iteration: int) -> dict[str, int]:
        """Where each pipelined buffer of iteration `iteration` (counted from 0) lives: its
        slot `iteration % in_flight`. An `iteration` that is not an `int` raises
        `PlanArgumentTypeError`, one negative or above 2**64 - 1 `PlanArgumentError`."""
        if isinstance(iteration, bool) or not isinstance(iteration, int):
            raise PlanArgumentTypeError(f"iteration must be an int >= 0, got {shown(iteration)}")
        if iteration < 0:
            raise PlanArgumentError(f"iteration must be >= 0, got {iteration}")
        return {
            name: self.offsets[ids[iteration % len(ids)]]
            for name, ids in self.problem.slots.items()
        }

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The solution in MiniMalloc CSV (`id,lower,upper,size[,alignment],offset`); written
        to `path` when given. Aliases are not buffers and do not appear (see
        `to_json()` or `to_c_header()`). Raises `PlanError` for an id a CSV file cannot keep
        (`npumem.plan.problem.csv_id`), `PlanValidationError` for offsets that break
        `check_offsets`."""
        placed = self._placed()
        with_align = any(b.alignment != 1 for b in self.problem.buffers)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(
            ["id", "lower", "upper", "size", *(["alignment"] if with_align else []), "offset"]
        )
        for b, offset in zip(self.problem.buffers, placed, strict=True):
            row: list[object] = [csv_id(b.id), b.lower, b.upper, b.size]
            if with_align:
                row.append(b.alignment)
            row.append(offset)
            writer.writerow(row)
        text = out.getvalue()
        if path is not None:
            write_text(path, text)
        return text

    def to_json_obj(self) -> dict[str, Any]:
        """The solution as a JSON-ready dict (format `npumem-plan`, version 1; the schema is
        `npumem/schemas/plan.schema.json`): summary figures, buffers with offsets, aliases.
        Offsets that break `check_offsets` (changed in `offsets` since) raise
        `PlanValidationError`."""
        placed = self._placed()
        obj = self._json_frame(self.problem.to_json_obj())
        for entry, offset in zip(obj["buffers"], placed, strict=True):
            entry["offset"] = offset
        obj["tensors"] = [
            {"name": name, "offset": off, "size": size}
            for name, (off, size) in self.tensor_offsets().items()
        ]
        return obj

    def _json_frame(self, problem_obj: dict[str, Any]) -> dict[str, Any]:
        """The plan's JSON object around the problem's (`problem_obj`), with an empty
        `tensors` list."""
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "arena_size": self.arena_size,
            "lower_bound": self.lower_bound,
            "gap": self.gap,
            "status": self.status,
            "capacity": self.capacity,
            "naive_size": self.naive_size,
            "seconds": self.stats.seconds,
            "greedy": {"rule": self.stats.greedy_rule, "arena_size": self.stats.greedy_arena},
            **problem_obj,
            **(
                {"slots": {name: list(ids) for name, ids in self.problem.slots.items()}}
                if self.problem.slots
                else {}
            ),
            "tensors": [],
        }

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The solution as JSON text (written to `path` when given): `to_json_obj()` as
        `npumem.fileio.json_text` writes it with an indent of 1, one buffer or tensor a line
        (the rows formatted directly, `npumem.plan.json_rows`). Offsets that break
        `check_offsets` raise `PlanValidationError`."""
        placed = self._placed()
        text = rows_json(
            self._json_frame(self.problem.json_frame()),
            {
                "buffers": buffer_rows(self.problem.buffers, placed),
                "tensors": tensor_rows(self.problem.buffers, placed, self._other_tensors()),
            },
        )
        if text is None:
            text = json_text(self.to_json_obj(), indent=1)
        if path is not None:
            write_text(path, text)
        return text

    def to_c_header(
        self, path: str | os.PathLike[str] | None = None, *, prefix: str = "npumem_plan"
    ) -> str:
        """A C header with the static offset table: one `{name, offset, size}` entry per
        tensor (aliases included), the arena size and the entry count; written to `path` when
        given. `prefix` names the table and the macros. A plan without tensors has the macros
        (both 0) and no table. A `prefix` that is not a str raises `PlanArgumentTypeError`;
        offsets that break `check_offsets` raise `PlanValidationError`, so every offset, size
        and the arena fit a 64-bit `size_t`."""
        if not isinstance(prefix, str):
            raise PlanArgumentTypeError(f"prefix must be a str, got {shown(prefix)}")
        self._placed()  # every offset and end within MAX_PLAN_BYTES: each fits a size_t
        ident = c_identifier(prefix)
        macro = ident.upper()
        table = self.tensor_offsets()
        lines = [
            "/* Generated by npumem.plan: static offsets of a planned arena.",
            f" * problem: {c_comment(self.problem.name) or '(unnamed)'}; arena "
            f"{self.arena_size} bytes, "
            f"lower bound {self.lower_bound}, gap {self.gap:.4%}. */",
            f"#ifndef {macro}_H",
            f"#define {macro}_H",
            "",
            "#include <stddef.h>",
            "",
            f"#define {macro}_ARENA_SIZE {self.arena_size}u",
            f"#define {macro}_NUM_TENSORS {len(table)}u",
            "",
            f"typedef struct {ident}_entry {{",
            "    const char *name;",
            "    size_t offset;",
            "    size_t size;",
            f"}} {ident}_entry;",
            "",
        ]
        if table:  # ISO C has no array of zero entries: a plan without tensors has no table
            lines.append(f"static const {ident}_entry {ident}_table[{macro}_NUM_TENSORS] = {{")
            lines += [f"    {{{c_string(n)}, {o}u, {s}u}}," for n, (o, s) in table.items()]
            lines += ["};", ""]
        lines += [f"#endif /* {macro}_H */", ""]
        text = "\n".join(lines)
        if path is not None:
            write_text(path, text)
        return text

    def bind(self, block: BlockLike) -> BoundOffsets:
        """Absolute offsets of every tensor (aliases included) inside `block`, a block reserved
        from a pool to hold this arena: `block.offset` plus the planned offset.

        The offsets stay valid across compactions because the table pins the block (a block
        with `pin()`, such as `npumem.Block`): a compaction never moves it while the table
        lives. The pin goes with the table (`release()`, leaving `with solution.bind(block) as
        offsets:`, or when the table is collected); free the block after that, since a pinned
        block cannot be freed.

        Raises `PlanError` when the arena does not fit in
        `block.nbytes` or when `block.offset` breaks a buffer's alignment, and
        `PlanArgumentTypeError` for a `block` without an integer `offset` and `nbytes`.
        """
        for attr in ("offset", "nbytes"):
            value = getattr(block, attr, None)
            if isinstance(value, bool) or not isinstance(value, int):
                raise PlanArgumentTypeError(
                    f"bind() takes a block with integer offset and nbytes (an npumem.Block), "
                    f"got {type(block).__name__} whose {attr} is {shown(value)}"
                )
        pin = getattr(block, "pin", None)
        if pin is not None:
            pin()  # before reading the offset: from here on the block does not move
        try:
            return BoundOffsets(self._offsets_in(block), block if pin is not None else None)
        except BaseException:
            if pin is not None:
                block.unpin()  # type: ignore[attr-defined]
            raise

    def _offsets_in(self, block: BlockLike) -> dict[str, int]:
        """The absolute offsets of `bind`, checked."""
        base, nbytes = int(block.offset), int(block.nbytes)
        if self.arena_size > nbytes:
            raise PlanError(
                f"the arena needs {self.arena_size} bytes but the block holds only {nbytes}"
            )
        strictest = max((b.alignment for b in self.problem.buffers), default=1)
        if base % strictest:
            raise PlanError(
                f"the block starts at offset {base}, which is not a multiple of {strictest}, "
                "the largest buffer alignment of the plan"
            )
        return {name: base + off for name, (off, _) in self.tensor_offsets().items()}
