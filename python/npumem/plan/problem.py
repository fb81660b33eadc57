"""Planning problems: buffers with a live range, a size, an alignment and an optional fixed offset.

A buffer is live on the half-open range `[lower, upper)` of abstract time steps. Two buffers whose
ranges overlap must get disjoint byte ranges `[offset, offset + size)`. The file format is
MiniMalloc's CSV (`id,lower,upper,size`, optionally `alignment`, `offset` and `weight`); a
JSON form carries the same fields. An `offset` given in a problem pins that buffer there (an
empty cell leaves it free). A `weight` is what the buffer is worth in a fast pool, for plans
over several pools (`npumem.plan.tiers`).
"""

from __future__ import annotations

import csv
import difflib
import heapq
import io
import math
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from npumem._core import PlanTimeline
from npumem._gc import gc_paused
from npumem._shown import shown
from npumem.fileio import (
    MAX_INTEGER_DIGITS,
    integer_too_long,
    json_text,
    read_json_object,
    write_text,
)
from npumem.plan.buffers import Alias, Buffer
from npumem.plan.errors import (
    PlanArgumentError,
    PlanArgumentTypeError,
    PlanError,
    ProblemFormatError,
)
from npumem.plan.inputs import (
    check_header,
    decode_text,
    is_tier_plan,
    path_argument,
    read_input,
    tier_plan_refused,
)
from npumem.plan.json_rows import buffer_rows, rows_json
from npumem.plan.lifetimes import lifetimes
from npumem.plan.onnx_import import graph_from_onnx
from npumem.sizes import MAX_BYTES

if TYPE_CHECKING:
    from npumem.plan.graph import Graph

__all__ = ["Alias", "Buffer", "Problem"]

REQUIRED_COLUMNS = ("id", "lower", "upper", "size")
MAX_TIME = (1 << 63) - 1
"""The largest time step a live range may name (the search keeps them in 64 bits)."""
MAX_PLAN_BYTES = (1 << 63) - 1
"""The most bytes a plan addresses: every buffer of a plan ends at or below it, so that every
offset and arena size fits in 64 bits with room to spare. A problem is refused only when no plan
can fit within it (`Problem._check_total`: a buffer that does not fit on its own, or more bytes
live at one time); whether a plan is found is the planner's question (`npumem.plan.solve`
raises `PlanTooLargeError` when none is)."""
OPTIONAL_COLUMNS = ("alignment", "offset", "weight")
PLAN_FORMAT = "npumem-plan"
"""The `format` field of a plan file (`Solution.to_json()`), which reads back as a problem."""
PLAN_VERSION = 1
"""The version of the plan files this npumem writes and reads."""

MAX_IN_FLIGHT = 256
"""The most inferences in flight `Problem.pipelined()` plans (each pipelined buffer becomes
that many slot buffers, all live at once)."""
_FAST_DIGITS = 60
"""The most digits of `lower`, `upper` and `size` together that a CSV row's fast path reads:
more than any valid row has (each is at most 20 digits), so that a longer number goes through
the general checks."""


def _is_power_of_two(value: object) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value > 0
        and value & (value - 1) == 0
    )


def check_problem(problem: object, call: str) -> None:
    """Refuse a `problem` argument that is not a `Problem` (`PlanArgumentTypeError`; for a
    model, a graph or a path the message says how to make a problem of it). `call` names
    the function in the message."""
    if isinstance(problem, Problem):
        return
    kind = type(problem).__name__
    if kind == "ModelProto":
        hint = "; plan an ONNX model with Problem.from_onnx(model, dims={...})"
    elif kind == "Graph":
        hint = "; plan a graph with Problem.from_graph(graph)"
    elif isinstance(problem, str | os.PathLike):
        hint = "; read a file with Problem.from_csv, Problem.from_json or Problem.from_onnx"
    else:
        hint = ""
    raise PlanArgumentTypeError(f"{call} takes a Problem, got {kind}{hint}")


def check_flag(name: str, value: object) -> None:
    """Refuse a yes/no option that is not a `bool` (`PlanArgumentTypeError`)."""
    if not isinstance(value, bool):
        raise PlanArgumentTypeError(f"{name} must be True or False, got {shown(value)}")


def check_alignment(alignment: object) -> int:
    """`alignment` if it is a power-of-two `int` (bools, floats and text are refused) of at
    most 64 bits, else `ProblemFormatError`."""
    if not _is_power_of_two(alignment):
        raise ProblemFormatError(
            f"alignment must be a power-of-two integer, got {shown(alignment)}"
        )
    assert isinstance(alignment, int)
    if alignment > MAX_BYTES:
        raise ProblemFormatError(
            f"alignment {alignment} is larger than {MAX_BYTES} bytes (64 bits)"
        )
    return alignment


def _json_kind(value: object) -> str:
    """What a JSON value is, for a message: null, a bool, a number, a string, a list, an
    object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def _strict_int(value: object) -> int:
    """An int from an int or a decimal string; bools, floats and other text are refused."""
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        body = text[1:] if text[:1] in "+-" else text
        if body.isdigit() and body.isascii():
            return int(text)
    raise ValueError


def csv_id(buffer_id: str) -> str:
    """`buffer_id` for a CSV file, which reads ids without the spaces around them: an id that
    starts or ends with a space would come back as another id, so it raises `PlanError`."""
    if buffer_id != buffer_id.strip():
        raise PlanError(
            f"buffer {shown(buffer_id)}: a CSV file cannot keep the spaces at the start or end "
            "of an "
            "id (they are read as padding); write JSON instead"
        )
    return buffer_id


def _check_buffer(buf: Buffer) -> str | None:
    """The first rule `buf` breaks, as a sentence, or `None`."""
    return _check_types(buf) or _check_values(buf)


def _check_types(buf: Buffer) -> str | None:
    """The first field of `buf` of the wrong type, as a sentence, or `None`."""
    # Buffers built in code may hold anything: check the types before the values.
    fields: dict[str, object] = {"id": buf.id, "lower": buf.lower, "upper": buf.upper}
    fields |= {"size": buf.size, "alignment": buf.alignment, "offset": buf.offset}
    if not isinstance(fields["id"], str):
        return f"the id must be a string, got {type(fields['id']).__name__}"
    for name in ("lower", "upper", "size", "alignment", "offset"):
        value = fields[name]
        if (value is not None or name != "offset") and (
            isinstance(value, bool) or not isinstance(value, int)
        ):
            return f"{name} must be an integer, got {shown(value)}"
    weight: object = buf.weight
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int | float)):
        return f"weight must be a number, got {shown(weight)}"
    return None


def _check_values(buf: Buffer) -> str | None:
    """The first rule on values `buf` breaks (its fields of the right types), as a sentence, or
    `None`."""
    if not buf.id:
        return "the id is empty"
    if "\0" in buf.id:
        return "the id holds a NUL character, which a text file (a CSV plan) cannot carry"
    if buf.size <= 0:
        return f"size must be a positive integer, got {buf.size}"
    if buf.size > MAX_BYTES:
        return f"size {buf.size} is larger than {MAX_BYTES} bytes (64 bits)"
    if not -MAX_TIME <= buf.lower <= MAX_TIME or not -MAX_TIME <= buf.upper <= MAX_TIME:
        return f"lower and upper must lie within +-{MAX_TIME}"
    if buf.upper <= buf.lower:
        return f"upper ({buf.upper}) must be greater than lower ({buf.lower})"
    if not _is_power_of_two(buf.alignment):
        return f"alignment must be a power of two, got {buf.alignment}"
    if buf.alignment > MAX_BYTES:
        return f"alignment {buf.alignment} is larger than {MAX_BYTES} bytes (64 bits)"
    if buf.offset is not None:
        if buf.offset < 0:
            return f"offset must be non-negative, got {buf.offset}"
        if buf.offset + buf.size > MAX_BYTES:
            return f"offset {buf.offset} + size {buf.size} ends beyond {MAX_BYTES} (64 bits)"
        if buf.offset % buf.alignment:
            return f"offset {buf.offset} is not a multiple of the alignment {buf.alignment}"
    if buf.weight is not None and not (0 <= buf.weight < math.inf):
        return f"weight must be a finite number >= 0, got {buf.weight}"
    return None


def _check_alias(alias: Alias) -> str | None:
    """The first field of `alias` of the wrong type or value, as a sentence, or `None`. The
    rules on names are those on buffer ids; whether the alias lies inside its base is checked
    with the base."""
    # Aliases built in code may hold anything: check the types before the values.
    fields: dict[str, object] = {"name": alias.name, "base": alias.base}
    fields |= {"offset": alias.offset, "size": alias.size}
    for field in ("name", "base"):
        if not isinstance(fields[field], str):
            return f"the {field} must be a string, got {shown(fields[field])}"
    for field in ("offset", "size"):
        value = fields[field]
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{field} must be an integer, got {shown(value)}"
    if not alias.name:
        return "the name is empty"
    if "\0" in alias.name:
        return "the name holds a NUL character, which a text file (a C header) cannot carry"
    return None


def overlapping_pair(buffers: Sequence[Buffer], offsets: Sequence[int]) -> tuple[int, int] | None:
    """Two buffers live at the same time whose byte ranges `[offset, offset + size)` overlap,
    as indices (the smaller first), or `None` when there are none (offsets >= 0).

    One sweep over time in the core (`PlanTimeline.first_overlap`), ends before starts at the
    same time (ranges are half-open): the buffers live at each moment are kept ordered by
    offset, so that each new one only needs comparing with its two neighbours there.
    O(n log n), whatever the number of pairs live together.
    """
    return _timeline(buffers, with_fixed=False).first_overlap(list(offsets))


def _timeline(buffers: Sequence[Buffer], *, with_fixed: bool) -> PlanTimeline:
    """`buffers` (checked ones) as the core's columns; pinned offsets kept when `with_fixed`."""
    return PlanTimeline(
        [b.lower for b in buffers],
        [b.upper for b in buffers],
        [b.size for b in buffers],
        [b.alignment for b in buffers],
        [b.offset for b in buffers] if with_fixed else [None] * len(buffers),
    )


def _csv_header(row: Sequence[str], label: str, line: int) -> list[str]:
    """The column names of a CSV header row, lowercase; unknown, missing or repeated columns
    raise `ProblemFormatError` naming the line, and so does the `pool` column of a plan over
    several pools, which is no problem."""
    header = [cell.strip().lower() for cell in row]
    if "pool" in header:
        raise ProblemFormatError(
            f"{label}, line {line}: a 'pool' column: this is a plan over several pools "
            "(npumem plan --pool writes it), not a problem; its CSV is not read back: plan "
            "the problem it came from, or write the plan as JSON (-o plan.json), which "
            "npumem plot draws and TieredSolution.from_json reads"
        )
    known = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
    unknown = [c for c in header if c not in known]
    if unknown:
        raise ProblemFormatError(
            f"{label}, line {line}: unknown column(s) {', '.join(map(repr, unknown))}; "
            f"expected {','.join(REQUIRED_COLUMNS)} and optionally "
            f"{', '.join(OPTIONAL_COLUMNS)}"
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ProblemFormatError(
            f"{label}, line {line}: missing column(s) {', '.join(map(repr, missing))}; "
            f"the header must name {','.join(REQUIRED_COLUMNS)}"
        )
    duplicated = sorted({c for c in header if header.count(c) > 1})
    if duplicated:
        raise ProblemFormatError(
            f"{label}, line {line}: column(s) {', '.join(map(repr, duplicated))} "
            "appear more than once"
        )
    return header


def _csv_reason(exc: csv.Error) -> str:
    """Why the csv module refused a file, in the words of a CSV file rather than of Python's
    `open()`."""
    reason = str(exc)
    if reason.endswith("expected after '\"'"):
        return "a quoted field goes on after its closing quote"
    if reason.startswith("new-line character seen in unquoted field"):
        return "a line ends in a lone carriage return (CR); end lines with LF or CRLF"
    return reason


def _weight(value: object) -> float | None:
    """A buffer weight from a number or decimal text (empty: none); other values raise
    `ValueError`."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        raise ValueError from None
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


PLAN_STATUSES = ("optimal", "feasible", "capacity-not-met", "infeasible")
"""The `status` of a plan file (`npumem.plan.solution`)."""


def check_plan_figures(obj: Mapping[str, Any], label: str) -> None:
    """The figures a plan file (format `npumem-plan`) must have besides its buffers, as
    `plan.schema.json` lists them: `name` text; `arena_size`, `lower_bound` and `naive_size`
    byte counts; `gap` and `seconds` finite numbers >= 0; `status` one of `PLAN_STATUSES`;
    `capacity` a byte count or null; `greedy` an object with a `rule` and an `arena_size`;
    `tensors` a list. Anything else raises `ProblemFormatError` naming the field."""

    def fail(key: str, wanted: str) -> ProblemFormatError:
        if key not in obj:
            return ProblemFormatError(f"{label}: missing field {shown(key)} (a plan has it)")
        return ProblemFormatError(f"{label}: {key} must be {wanted}, got {shown(obj[key])}")

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BYTES

    counts = f"an integer between 0 and {MAX_BYTES}"
    for key in ("arena_size", "lower_bound", "naive_size"):
        if not count(obj.get(key)):
            raise fail(key, counts)
    for key in ("gap", "seconds"):
        value = obj.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (math.isfinite(value) and value >= 0)
        ):
            raise fail(key, "a finite number >= 0")
    if not isinstance(obj.get("name"), str):
        raise fail("name", "a string")
    if obj.get("status") not in PLAN_STATUSES:
        raise fail("status", f"one of {PLAN_STATUSES}")
    if "capacity" not in obj or not (obj["capacity"] is None or count(obj["capacity"])):
        raise fail("capacity", f"null or {counts}")
    greedy = obj.get("greedy")
    if not (
        isinstance(greedy, Mapping)
        and isinstance(greedy.get("rule"), str)
        and count(greedy.get("arena_size"))
    ):
        raise fail("greedy", "an object with a string 'rule' and an integer 'arena_size'")
    if not isinstance(obj.get("tensors"), list):
        raise fail("tensors", "a list")


def overlap_lists(
    buffers: Sequence[Buffer], tick: Callable[[int], None] | None = None
) -> list[list[int]]:
    """For each of `buffers`, the indices of those whose live range overlaps its own, ascending
    (`Problem.neighbors`): one sweep over the ranges sorted by start. `tick`, when given, is
    called with the work done as it goes (about one unit a pair listed), so that a caller with
    a deadline can stop the sweep by raising from it."""
    order = list(range(len(buffers)))
    order.sort(key=[b.lower for b in buffers].__getitem__)
    adjacency: list[list[int]] = [[] for _ in buffers]
    active: list[tuple[int, int]] = []  # heap of (upper, index)
    alive: set[int] = set()
    for i in order:
        lower = buffers[i].lower
        while active and active[0][0] <= lower:
            alive.discard(heapq.heappop(active)[1])
        mine = adjacency[i]
        for j in alive:
            mine.append(j)
            adjacency[j].append(i)
        if tick is not None:
            tick(len(alive) + 4)
        alive.add(i)
        heapq.heappush(active, (buffers[i].upper, i))
    for a in adjacency:
        a.sort()
        if tick is not None:
            tick(len(a) + 4)
    return adjacency


def left_out_reasons(
    graph: Any, problem: Problem, *, include_weights: bool, shared_weights: bool = False
) -> dict[str, str]:
    """Why each tensor of `graph` that is neither a buffer, an alias nor an empty tensor of
    `problem` got no buffer: a weight not planned (or, with `shared_weights`, laid out apart
    and shared by shape buckets), a graph input or output left out, or a view of one of
    these."""
    tensors = graph.tensors
    placed = set(problem._index) | {a.name for a in problem.aliases} | set(problem.empty)
    inputs, outputs = set(graph.inputs), set(graph.outputs)
    reasons: dict[str, str] = {}
    for name in tensors:
        if name in placed:
            continue
        root = name
        seen = {root}
        while tensors[root].view_of is not None and tensors[root].view_of not in seen:
            root = tensors[root].view_of
            seen.add(root)
        if tensors[root].weight and shared_weights:
            why = (
                "a weight, laid out once and shared by every shape bucket (only activations "
                "are pipelined with buckets)"
            )
        elif tensors[root].weight:
            why = (
                "a weight, which is planned only with include_weights=True (--include-weights)"
                if not include_weights
                else "a weight, which is not planned here"
            )
        elif root in inputs:
            why = "a graph input, left out of the plan (include_inputs=False)"
        elif root in outputs:
            why = "a graph output, left out of the plan (include_outputs=False)"
        else:
            why = "a tensor without a buffer of its own in this plan"
        if root == name:
            reasons[name] = f"it is {why}, so it has no buffer to pipeline"
        else:
            reasons[name] = f"it is a view of {shown(root)}, {why}, so it has no buffer to pipeline"
    return reasons


class Problem:
    """A set of buffers to place, plus the aliases (views, in-place outputs) that live inside them.

    Build one with `from_csv()`, `from_json()`, `from_graph()`, `from_onnx()`, or
    directly from `Buffer` objects. Every buffer and every alias is checked, the types of
    their fields first (an alias's name and base are strings, its name non-empty and without
    NUL as a buffer id is, its offset and size integers, bools refused); a broken rule raises
    `ProblemFormatError` naming the buffer or the alias.
    """

    def __init__(
        self,
        buffers: Iterable[Buffer],
        *,
        aliases: Iterable[Alias] = (),
        name: str = "",
        slots: Mapping[str, Sequence[str]] | None = None,
        empty: Iterable[str] = (),
        _checked: bool = False,
    ) -> None:
        # `_checked`: every buffer has passed `_check_buffer` already (a reader checked each as
        # it read it); the rules over all buffers are checked here all the same.
        for what, value in (("buffers", buffers), ("aliases", aliases), ("empty", empty)):
            if isinstance(value, str | bytes) or not isinstance(value, Iterable):
                raise PlanArgumentTypeError(f"{what} must be a list, got {type(value).__name__}")
        if slots is not None and not isinstance(slots, Mapping):
            raise PlanArgumentTypeError(
                f"slots must map tensor names to slot buffer ids, got {type(slots).__name__}"
            )
        self.buffers: tuple[Buffer, ...] = tuple(buffers)
        self.aliases: tuple[Alias, ...] = tuple(aliases)
        self.name = name
        self.slots: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in (slots or {}).items()}
        """For a pipelined problem (`pipelined()`): each pipelined tensor's slot buffers;
        iteration `i` uses slot `i % len(slots)`."""
        # Tensors of the graph this problem was made from that got no buffer, with the reason
        # (`from_graph()`): `pipelined()` names it for such a tensor rather than calling it
        # unknown.
        self._left_out: dict[str, str] = {}
        self.empty: tuple[str, ...] = tuple(empty)
        """Tensors of 0 bytes that lie in no buffer (`from_graph()`): they take no memory, and
        the tensor tables of a solution list them at offset 0 with size 0."""
        index: dict[str, int] = {}
        if _checked:
            index = dict(
                zip(
                    map(operator.attrgetter("id"), self.buffers),
                    range(len(self.buffers)),
                    strict=True,
                )
            )
        if len(index) < len(self.buffers):
            index = {}
            for i, buf in enumerate(self.buffers):
                if not isinstance(buf, Buffer):
                    raise ProblemFormatError(f"entry {i} is a {type(buf).__name__}, not a Buffer")
                problem = _check_buffer(buf)
                if problem:
                    raise ProblemFormatError(f"buffer {shown(buf.id)}: {problem}")
                if buf.id in index:
                    raise ProblemFormatError(f"buffer id {shown(buf.id)} appears twice")
                index[buf.id] = i
        self._index = index
        names = set(index)
        for i, alias in enumerate(self.aliases):
            if not isinstance(alias, Alias):
                raise ProblemFormatError(
                    f"alias entry {i} is a {type(alias).__name__}, not an Alias"
                )
            problem = _check_alias(alias)
            if problem:
                raise ProblemFormatError(f"alias {shown(alias.name)}: {problem}")
            if alias.name in names:
                raise ProblemFormatError(
                    f"alias {shown(alias.name)} reuses the name of a buffer or alias"
                )
            names.add(alias.name)
            base = self.buffers[index[alias.base]] if alias.base in index else None
            if base is None:
                raise ProblemFormatError(
                    f"alias {shown(alias.name)} refers to unknown buffer {shown(alias.base)}"
                )
            if alias.offset < 0 or alias.size < 0 or alias.offset + alias.size > base.size:
                raise ProblemFormatError(
                    f"alias {shown(alias.name)} ([{alias.offset}, {alias.offset + alias.size})) "
                    "does "
                    f"not lie inside buffer {shown(alias.base)} of {base.size} bytes"
                )
        for i, tensor in enumerate(self.empty):
            if not isinstance(tensor, str) or not tensor or "\0" in tensor:
                raise ProblemFormatError(
                    f"empty tensor entry {i}: {shown(tensor)} is not a non-empty name without NUL"
                )
            if tensor in names:
                raise ProblemFormatError(
                    f"empty tensor {shown(tensor)} reuses the name of a buffer or alias"
                )
            names.add(tensor)
        self._check_total()
        self._check_fixed_overlaps()
        for tensor, ids in self.slots.items():
            missing = [i for i in ids if i not in index]
            if not ids or missing:
                raise ProblemFormatError(
                    f"pipelined tensor {shown(tensor)}: slot buffer(s) {missing or '(none)'} "
                    "unknown"
                )

    # ----------------------------------------------------------------------------------------
    # Basic access

    def __len__(self) -> int:
        return len(self.buffers)

    def __iter__(self) -> Iterator[Buffer]:
        return iter(self.buffers)

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<Problem{label}: {len(self.buffers)} buffers, {len(self.aliases)} aliases>"

    def index_of(self, buffer_id: str) -> int:
        """Position of the buffer with this id in `buffers`."""
        try:
            return self._index[buffer_id]
        except KeyError:
            raise KeyError(f"no buffer with id {shown(buffer_id)}") from None

    def __getitem__(self, buffer_id: str) -> Buffer:
        return self.buffers[self.index_of(buffer_id)]

    @property
    def ids(self) -> list[str]:
        """The buffer ids, in problem order."""
        return [b.id for b in self.buffers]

    @property
    def total_size(self) -> int:
        """The sum of the buffer sizes (`Solution.naive_size`, the arena without reuse, adds
        the padding that alignment needs)."""
        return sum(b.size for b in self.buffers)

    @property
    def has_fixed(self) -> bool:
        """Whether some buffer has a fixed offset."""
        return any(b.offset is not None for b in self.buffers)

    @cached_property
    def timeline(self) -> PlanTimeline:
        """The buffers as the core's columns (`npumem._core.PlanTimeline`), for the passes
        over the whole problem that must stay fast at millions of buffers: the bound, the pairs
        counted, the overlap check, the greedy placements."""
        return _timeline(self.buffers, with_fixed=True)

    @cached_property
    def overlap_counts(self) -> tuple[int, ...]:
        """For each buffer, how many others are live at the same time (`len(neighbors[i])`),
        counted in O(n log n) without listing them."""
        return tuple(self.timeline.overlap_counts())

    @cached_property
    def overlap_pairs(self) -> int:
        """The number of pairs of buffers live at the same time (the size of `neighbors`),
        counted in O(n log n) without listing them."""
        return self.timeline.overlap_pairs()

    @cached_property
    def neighbors(self) -> tuple[tuple[int, ...], ...]:
        """For each buffer, the indices of the buffers whose live range overlaps its own.

        Computed by one sweep over the ranges sorted by start: O(n log n + number of pairs).
        """
        return tuple(tuple(a) for a in overlap_lists(self.buffers))

    def _check_total(self) -> None:
        """Refuse what no plan can address: a buffer that does not fit below `MAX_PLAN_BYTES`
        on its own (an unpinned one larger than it, as offset 0 suits every alignment; a pinned
        one that ends beyond it), or buffers live at one time that need more than it (the
        static lower bound of `npumem.plan.bounds`). Anything else may have a plan, so it is
        left to the planner (`solve` raises `PlanTooLargeError` when it finds none)."""
        buffers = self.buffers
        need = sum(b.size + b.alignment - 1 for b in buffers)
        need += max((b.offset + b.size for b in buffers if b.offset is not None), default=0)
        if need <= MAX_PLAN_BYTES:
            return  # every buffer one after the other, each aligned, fits already
        for b in buffers:
            if b.offset is None and b.size > MAX_PLAN_BYTES:
                raise ProblemFormatError(
                    f"buffer {shown(b.id)}: size {b.size} is more than the {MAX_PLAN_BYTES} "
                    "bytes (2^63 - 1) a plan can address"
                )
            if b.offset is not None and b.offset + b.size > MAX_PLAN_BYTES:
                raise ProblemFormatError(
                    f"buffer {shown(b.id)}: pinned at {b.offset}, it ends at "
                    f"{b.offset + b.size}, beyond the {MAX_PLAN_BYTES} bytes (2^63 - 1) a plan "
                    "can address"
                )
        bound = self.timeline.live_bound()
        if bound > MAX_PLAN_BYTES:
            raise ProblemFormatError(
                f"the buffers live at one time need at least {bound} bytes, more than the "
                f"{MAX_PLAN_BYTES} bytes (2^63 - 1) a plan can address"
            )

    def _check_fixed_overlaps(self) -> None:
        fixed = [b for b in self.buffers if b.offset is not None]
        clash = overlapping_pair(fixed, [b.offset or 0 for b in fixed])
        if clash is not None:
            a, b = fixed[clash[0]], fixed[clash[1]]
            raise ProblemFormatError(
                f"fixed buffers {shown(a.id)} and {shown(b.id)} are live at the same time and "
                "their fixed byte ranges overlap"
            )

    # ----------------------------------------------------------------------------------------
    # Transformations

    def with_alignment(self, alignment: int) -> Problem:
        """A copy in which every buffer's alignment is at least `alignment`."""
        check_alignment(alignment)
        return Problem(
            (
                Buffer(
                    b.id, b.lower, b.upper, b.size, max(b.alignment, alignment), b.offset, b.weight
                )
                for b in self.buffers
            ),
            aliases=self.aliases,
            name=self.name,
            slots=self.slots,
            empty=self.empty,
        )

    def pipelined(self, names: Iterable[str], in_flight: int = 2) -> Problem:
        """The problem of `in_flight` inferences in flight, the buffers `names` loaded ahead.

        While iteration `i` computes, the named buffers of iterations `i + 1` ..
        `i + in_flight - 1` are loaded into memory of their own. Each named buffer becomes
        `in_flight` slot buffers `{name}#slot{s}`; iteration `i` uses slot
        `i % in_flight`. In the steady state every slot is being loaded or used at every step
        of an iteration, so each slot is live over the whole iteration (from the first step of
        the problem to its last); the other buffers keep their ranges, and the same offsets serve
        every iteration. Aliases of a named buffer are repeated in every slot.

        An `in_flight` that is not an integer from 1 to `MAX_IN_FLIGHT` raises
        `PlanArgumentError`; an unknown or pinned buffer, `ProblemFormatError`.
        """
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, Iterable):
            raise PlanArgumentTypeError(
                f"names must be a list of buffer names, got {type(names).__name__}"
            )
        wanted = list(dict.fromkeys(names))
        odd = [n for n in wanted if not isinstance(n, str)]
        if odd:
            raise PlanArgumentTypeError(f"a buffer name must be a str, got {shown(odd[0])}")
        if isinstance(in_flight, bool) or not isinstance(in_flight, int):
            raise PlanArgumentTypeError(
                f"in_flight must be an integer from 1 to {MAX_IN_FLIGHT} (inferences in "
                f"flight), got {shown(in_flight)}"
            )
        if not 1 <= in_flight <= MAX_IN_FLIGHT:
            raise PlanArgumentError(
                f"in_flight must be an integer from 1 to {MAX_IN_FLIGHT} (inferences in "
                f"flight), got {in_flight}"
            )
        unknown = [n for n in wanted if n not in self._index]
        for n in unknown:
            reason = self._not_pipelinable(n)
            if reason:
                raise ProblemFormatError(f"cannot pipeline {shown(n)}: {reason}")
        if unknown:
            close = [
                m
                for n in unknown
                for m in difflib.get_close_matches(str(n), list(self._index), n=3)
            ]
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise ProblemFormatError(
                f"cannot pipeline unknown buffer(s) {', '.join(map(repr, unknown))}{hint}"
            )
        if not self.buffers or in_flight == 1:
            return self
        start = min(b.lower for b in self.buffers)
        end = max(b.upper for b in self.buffers)
        chosen = set(wanted)
        buffers: list[Buffer] = []
        slots: dict[str, list[str]] = {}
        for b in self.buffers:
            if b.id not in chosen:
                buffers.append(b)
                continue
            if b.offset is not None:
                raise ProblemFormatError(f"buffer {shown(b.id)} is pinned: it cannot take slots")
            for s in range(in_flight):
                slot_id = f"{b.id}#slot{s}"
                if slot_id in self._index:
                    raise ProblemFormatError(f"slot buffer {shown(slot_id)} clashes with a buffer")
                buffers.append(Buffer(slot_id, start, end, b.size, b.alignment))
                slots.setdefault(b.id, []).append(slot_id)
        aliases: list[Alias] = []
        for a in self.aliases:
            if a.base in chosen:
                aliases.extend(
                    Alias(f"{a.name}#slot{s}", slot_id, a.offset, a.size)
                    for s, slot_id in enumerate(slots[a.base])
                )
            else:
                aliases.append(a)
        merged = {**self.slots, **slots}
        result = Problem(buffers, aliases=aliases, name=self.name, slots=merged, empty=self.empty)
        result._left_out = self._left_out
        return result

    def _not_pipelinable(self, name: object) -> str | None:
        """Why `name`, a tensor that is no buffer of this problem, cannot be pipelined (None
        when the problem does not know it)."""
        for alias in self.aliases:
            if alias.name == name:
                return (
                    f"it is a view or an in-place output that lies in buffer {shown(alias.base)}; "
                    f"pipeline {shown(alias.base)} (its aliases take slots with it)"
                )
        if name in self.empty:
            return "it has 0 bytes and takes no memory, so there is nothing to load ahead"
        if isinstance(name, str) and name in self._left_out:
            return self._left_out[name]
        return None

    def double_buffered(self, names: Iterable[str]) -> Problem:
        """`pipelined()` with two inferences in flight: the named buffers of the next step
        load into a second slot while this step computes."""
        return self.pipelined(names, 2)

    # ----------------------------------------------------------------------------------------
    # CSV

    @classmethod
    def from_csv(cls, source: str | os.PathLike[str] | io.TextIOBase, *, name: str = "") -> Problem:
        """Read a MiniMalloc CSV: header `id,lower,upper,size` (columns in any order), optional
        `alignment` and `offset` columns (an offset pins the buffer; an empty cell does not).

        Errors name the file and line: `model.csv, line 7: size must be a positive integer`.
        """
        if isinstance(source, io.TextIOBase):
            label = getattr(source, "name", "<csv>")
            return cls._parse_csv(source.read(), str(label), name)
        path = path_argument(
            source,
            error=ProblemFormatError,
            what="a CSV file path (str or os.PathLike) or an open text file",
        )
        data = read_input(path, error=ProblemFormatError)
        return cls.from_csv_bytes(data, str(path), name=name or path.stem)

    @classmethod
    def from_csv_bytes(cls, data: bytes, label: str, *, name: str = "") -> Problem:
        """A MiniMalloc CSV already read (`from_csv()`); errors start with `label`."""
        return cls._parse_csv(decode_text(data, label, error=ProblemFormatError), label, name)

    @classmethod
    def _parse_csv(cls, text: str, label: str, name: str) -> Problem:
        # A reader makes an object or more per row and no reference cycle: the cyclic
        # garbage collector's passes over them as they pile up took most of its time.
        with gc_paused():
            fast = cls._parse_plain_csv(text, label, name)
            if fast is not None:
                return fast
            return cls._parse_csv_rows(text, label, name)

    @classmethod
    def _parse_plain_csv(cls, text: str, label: str, name: str) -> Problem | None:
        """The common file, read column by column: no quote, NUL or lone carriage return, the
        header on the first line, every other line a row (empty lines skipped) with the
        header's number of fields and no longer than the csv module's field limit, ids that
        are not empty and not repeated, `lower`, `upper` and `size` in plain ASCII digits
        that the rules accept, the optional columns empty. `None` for anything else:
        `_parse_csv_rows` reads it row by row and names the row at fault, so no file is
        refused here."""
        if '"' in text or "\0" in text:
            return None
        if "\r" in text:
            if text.count("\r") != text.count("\r\n"):
                return None
            text = text.replace("\r\n", "\n")
        lines = text.split("\n")
        if not lines[0].strip():
            return None
        try:
            header = _csv_header(lines[0].split(","), label, 1)
        except ProblemFormatError:
            return None  # the row reader names it
        width = len(header)
        body = [line for line in lines[1:] if line]
        if not body or any(line.count(",") != width - 1 for line in body):
            return None
        if max(map(len, body)) > csv.field_size_limit():
            return None  # a field may pass the csv module's limit, which the row reader names
        cells = ",".join(body).split(",")  # row after row, `width` cells each
        columns = [cells[k::width] for k in range(width)]
        for column in OPTIONAL_COLUMNS:
            if column in header and "".join(columns[header.index(column)]).strip():
                return None
        ids = list(map(str.strip, columns[header.index("id")]))
        if not all(ids) or len(set(ids)) != len(ids):
            return None
        numbers: list[list[int]] = []
        for column in ("lower", "upper", "size"):
            cells = columns[header.index(column)]
            joined = "".join(cells)
            if not (all(cells) and joined.isdigit() and joined.isascii()):
                return None
            if max(map(len, cells)) > _FAST_DIGITS // 3:
                return None
            numbers.append(list(map(int, cells)))
        lowers, uppers, sizes = numbers
        if (
            max(uppers) > MAX_TIME
            or min(sizes) <= 0
            or max(sizes) > MAX_BYTES
            or not all(map(operator.lt, lowers, uppers))
        ):
            return None
        return cls(list(map(Buffer, ids, lowers, uppers, sizes)), name=name, _checked=True)

    @classmethod
    def _parse_csv_rows(cls, text: str, label: str, name: str) -> Problem:
        # Strict: a quote left open is an error at the end of the file, not a field that
        # swallows every line after it.
        reader = csv.reader(io.StringIO(text), strict=True)
        next_start = 1  # the line where the next row starts
        header: list[str] | None = None
        columns: dict[str, int] = {}
        buffers: list[Buffer] = []
        first_line: dict[str, int] = {}
        # The common row (the four columns as plain digits, the optional ones empty) is read
        # here without the general checks of `_row_to_buffer`; anything else goes there.
        width, fields = -1, (0, 0, 0, 0)
        extra: list[int] = []
        # The csv module's own errors (a field over its size limit, a NUL byte, a stray quote)
        # name the line.
        try:
            for row in reader:
                next_start = reader.line_num + 1
                if len(row) == width:
                    buffer_id = row[fields[0]].strip()
                    lo, up, sz = row[fields[1]], row[fields[2]], row[fields[3]]
                    if (
                        buffer_id
                        and len(lo) + len(up) + len(sz) <= _FAST_DIGITS
                        and lo.isdigit()
                        and up.isdigit()
                        and sz.isdigit()
                        and (lo + up + sz).isascii()
                        and "\0" not in buffer_id
                        and (not extra or not any(row[c].strip() for c in extra))
                    ):
                        lower, upper, size = int(lo), int(up), int(sz)
                        if lower < upper <= MAX_TIME and 0 < size <= MAX_BYTES:
                            if buffer_id in first_line:
                                raise ProblemFormatError(
                                    f"{label}, line {reader.line_num}: buffer id "
                                    f"{shown(buffer_id)} "
                                    f"already used on line {first_line[buffer_id]}"
                                )
                            first_line[buffer_id] = reader.line_num
                            buffers.append(Buffer(buffer_id, lower, upper, size))
                            continue
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if header is None:
                    header = _csv_header(row, label, line)
                    columns = {c: header.index(c) for c in header}
                    width = len(header)
                    fields = (columns["id"], columns["lower"], columns["upper"], columns["size"])
                    extra = [columns[c] for c in OPTIONAL_COLUMNS if c in columns]
                    continue
                if len(row) != len(header):
                    raise ProblemFormatError(
                        f"{label}, line {line}: expected {len(header)} fields "
                        f"({','.join(header)}), got {len(row)}"
                    )
                buf = cls._row_to_buffer(row, columns, label, line)
                if buf.id in first_line:
                    raise ProblemFormatError(
                        f"{label}, line {line}: buffer id {shown(buf.id)} already used on line "
                        f"{first_line[buf.id]}"
                    )
                first_line[buf.id] = line
                buffers.append(buf)
        except csv.Error as exc:
            if str(exc) == "unexpected end of data":  # inside quotes, as strict reads it
                raise ProblemFormatError(
                    f"{label}, line {next_start}: not valid CSV (a quote in this row is not "
                    "closed before the end of the file)"
                ) from None
            raise ProblemFormatError(
                f"{label}, line {reader.line_num}: not valid CSV ({_csv_reason(exc)})"
            ) from None
        if header is None:
            raise ProblemFormatError(
                f"{label}: the file is empty; expected a header {','.join(REQUIRED_COLUMNS)}"
            )
        try:
            return cls(buffers, name=name, _checked=True)
        except ProblemFormatError as exc:
            # Only fixed-offset clashes get here: name the lines of the two buffers.
            raise ProblemFormatError(f"{label}: {exc}") from exc

    @staticmethod
    def _row_to_buffer(
        row: Sequence[str], columns: Mapping[str, int], label: str, line: int
    ) -> Buffer:
        def integer(column: str) -> int:
            raw = row[columns[column]]
            digits = len(raw.strip().lstrip("+-"))
            if digits > MAX_INTEGER_DIGITS:
                raise ProblemFormatError(
                    f"{label}, line {line}, column {column}: {integer_too_long(digits)}"
                )
            if raw.isdigit() and raw.isascii():  # the common case, without the general checks
                return int(raw)
            try:
                return _strict_int(raw)
            except ValueError:
                raise ProblemFormatError(
                    f"{label}, line {line}: {column} must be an integer, got {shown(raw.strip())}"
                ) from None

        buffer_id = row[columns["id"]].strip()
        if not buffer_id:
            raise ProblemFormatError(f"{label}, line {line}: the id is empty")
        alignment = 1
        if "alignment" in columns and row[columns["alignment"]].strip():
            alignment = integer("alignment")
        offset: int | None = None
        if "offset" in columns and row[columns["offset"]].strip():
            offset = integer("offset")
        weight = None
        if "weight" in columns:
            try:
                weight = _weight(row[columns["weight"]])
            except ValueError:
                raise ProblemFormatError(
                    f"{label}, line {line}: weight must be a number, "
                    f"got {shown(row[columns['weight']].strip())}"
                ) from None
        buf = Buffer(
            buffer_id,
            integer("lower"),
            integer("upper"),
            integer("size"),
            alignment,
            offset,
            weight,
        )
        problem = _check_values(buf)  # the types are right: the fields were read as such
        if problem:
            raise ProblemFormatError(f"{label}, line {line}: buffer {shown(buffer_id)}: {problem}")
        return buf

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The problem as MiniMalloc CSV text (written to `path` when given). `alignment` and
        `offset` columns appear only when some buffer needs them. Raises `PlanError` for an id
        the CSV reader would not read back (`csv_id`)."""
        with_align = any(b.alignment != 1 for b in self.buffers)
        with_offset = self.has_fixed
        with_weight = any(b.weight is not None for b in self.buffers)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        header = list(REQUIRED_COLUMNS)
        if with_align:
            header.append("alignment")
        if with_offset:
            header.append("offset")
        if with_weight:
            header.append("weight")
        writer.writerow(header)
        for b in self.buffers:
            row: list[object] = [csv_id(b.id), b.lower, b.upper, b.size]
            if with_align:
                row.append(b.alignment)
            if with_offset:
                row.append("" if b.offset is None else b.offset)
            if with_weight:
                row.append("" if b.weight is None else b.weight)
            writer.writerow(row)
        text = out.getvalue()
        if path is not None:
            write_text(path, text)
        return text

    # ----------------------------------------------------------------------------------------
    # JSON

    @classmethod
    def from_json(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any],
        *,
        name: str = "",
        label: str = "<json>",
    ) -> Problem:
        """Read a problem from JSON: `{"buffers": [{"id", "lower", "upper", "size",
        "alignment"?, "offset"?}, ...], "aliases"?: [{"name", "base", "offset", "size"}],
        "name"?: str}`. `source` is a path or the already-decoded object (errors then start
        with `label`).

        Errors name the file and the entry: `p.json: buffers[3] (id 'x'): size must be ...`.
        """
        if isinstance(source, Mapping):
            return cls._from_obj(source, label, name)
        path = path_argument(
            source,
            error=ProblemFormatError,
            what="a JSON file path (str or os.PathLike) or a decoded JSON object",
        )
        obj = read_json_object(
            path, error=ProblemFormatError, expected="a JSON object with a 'buffers' list"
        )
        return cls._from_obj(obj, str(path), name, default_name=path.stem)

    @classmethod
    def _from_obj(
        cls, obj: Mapping[str, Any], label: str, name: str, default_name: str = ""
    ) -> Problem:
        if is_tier_plan(obj):
            raise tier_plan_refused(
                label, "a problem or a plan of one arena", error=ProblemFormatError
            )
        check_header(obj, label, PLAN_FORMAT, PLAN_VERSION, error=ProblemFormatError)
        if "ops" in obj:
            raise ProblemFormatError(
                f"{label}: holds 'ops', which a graph has, not a problem or a plan (they have "
                "'buffers')"
            )
        if obj.get("format") == PLAN_FORMAT:
            check_plan_figures(obj, label)
        entries = obj.get("buffers")
        if not isinstance(entries, list):
            raise ProblemFormatError(f"{label}: expected a 'buffers' list")
        buffers: list[Buffer] = []
        seen: dict[str, int] = {}
        for i, entry in enumerate(entries):
            where = f"{label}: buffers[{i}]"
            if not isinstance(entry, Mapping):
                raise ProblemFormatError(f"{where}: expected an object, got {shown(entry)}")
            missing = [k for k in REQUIRED_COLUMNS if k not in entry]
            if missing:
                raise ProblemFormatError(
                    f"{where}: missing field(s) {', '.join(map(repr, missing))}"
                )
            unknown = [k for k in entry if k not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
            if unknown:
                raise ProblemFormatError(
                    f"{where}: unknown field(s) {', '.join(map(repr, unknown))}"
                )
            raw_id = entry["id"]
            if not isinstance(raw_id, str | int) or isinstance(raw_id, bool):
                raise ProblemFormatError(f"{where}: id must be a string or an integer")
            buffer_id = str(raw_id)
            where = f"{where} (id {shown(buffer_id)})"

            def integer(key: str, where: str = where, entry: Mapping[str, Any] = entry) -> int:
                try:
                    return _strict_int(entry[key])
                except ValueError:
                    raise ProblemFormatError(
                        f"{where}: {key} must be an integer, got {shown(entry[key])}"
                    ) from None

            alignment = integer("alignment") if entry.get("alignment") is not None else 1
            offset = integer("offset") if entry.get("offset") is not None else None
            try:
                weight = _weight(entry.get("weight"))
            except ValueError:
                raise ProblemFormatError(
                    f"{where}: weight must be a number a float can hold, "
                    f"got {shown(entry['weight'])}"
                ) from None
            buf = Buffer(
                buffer_id,
                integer("lower"),
                integer("upper"),
                integer("size"),
                alignment,
                offset,
                weight,
            )
            problem = _check_buffer(buf)
            if problem:
                raise ProblemFormatError(f"{where}: {problem}")
            if buffer_id in seen:
                raise ProblemFormatError(f"{where}: id already used by buffers[{seen[buffer_id]}]")
            seen[buffer_id] = i
            buffers.append(buf)
        aliases: list[Alias] = []
        raw_aliases = obj.get("aliases", [])
        if not isinstance(raw_aliases, list):
            raise ProblemFormatError(f"{label}: 'aliases' must be a list")
        for i, entry in enumerate(raw_aliases):
            where = f"{label}: aliases[{i}]"
            expected = (
                f"{where}: expected {{'name', 'base', 'offset', 'size'}} with string name and "
                "base, integer offset and size"
            )
            if not isinstance(entry, dict):
                raise ProblemFormatError(f"{expected}, got {_json_kind(entry)}")
            missing = [key for key in ("name", "base", "size") if key not in entry]
            if missing:
                raise ProblemFormatError(f"{expected}; missing {', '.join(map(repr, missing))}")
            alias_name, base = entry["name"], entry["base"]
            if not (isinstance(alias_name, str) and isinstance(base, str)):
                raise ProblemFormatError(
                    f"{expected}; got name {_json_kind(alias_name)}, base {_json_kind(base)}"
                )
            ints: list[int] = []
            for key, value in (("offset", entry.get("offset", 0)), ("size", entry["size"])):
                try:
                    ints.append(_strict_int(value))
                except ValueError:
                    raise ProblemFormatError(
                        f"{expected}; {key} is {_json_kind(value)} {shown(value)}"
                    ) from None
            try:
                aliases.append(Alias(alias_name, base, *ints))
            except (TypeError, ValueError) as exc:
                raise ProblemFormatError(f"{where}: {exc}") from None
        given_name = obj.get("name")
        if given_name is not None and not isinstance(given_name, str):
            raise ProblemFormatError(
                f"{label}: 'name' must be a string, got {_json_kind(given_name)}"
            )
        # A plan lists its tensors of 0 bytes that lie in no buffer among its `tensors` (at
        # offset 0, size 0): they stay in the problem it reads as.
        empty: list[str] = []
        if obj.get("format") == PLAN_FORMAT:
            placed = set(seen) | {a.name for a in aliases}
            for entry in obj["tensors"]:
                if (
                    isinstance(entry, Mapping)
                    and isinstance(entry.get("name"), str)
                    and type(entry.get("size")) is int
                    and entry["size"] == 0
                    and entry["name"] not in placed
                ):
                    empty.append(entry["name"])
                    placed.add(entry["name"])
        try:
            return cls(
                buffers,
                aliases=aliases,
                name=name or (given_name if isinstance(given_name, str) else "") or default_name,
                empty=empty,
                _checked=True,
            )
        except ProblemFormatError as exc:
            raise ProblemFormatError(f"{label}: {exc}") from exc

    def json_frame(self) -> dict[str, Any]:
        """`to_json_obj()` with an empty `buffers` list in place of the buffers' entries."""
        obj: dict[str, Any] = {"name": self.name, "buffers": []}
        if self.aliases:
            obj["aliases"] = [
                {"name": a.name, "base": a.base, "offset": a.offset, "size": a.size}
                for a in self.aliases
            ]
        return obj

    def to_json_obj(self) -> dict[str, Any]:
        """The problem as a JSON-ready dict (the format `from_json()` reads)."""
        buffers: list[dict[str, Any]] = []
        for b in self.buffers:
            entry: dict[str, Any] = {"id": b.id, "lower": b.lower, "upper": b.upper, "size": b.size}
            if b.alignment != 1:
                entry["alignment"] = b.alignment
            if b.offset is not None:
                entry["offset"] = b.offset
            if b.weight is not None:
                entry["weight"] = b.weight
            buffers.append(entry)
        obj = self.json_frame()
        obj["buffers"] = buffers
        return obj

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The problem as JSON text (written to `path` when given): `to_json_obj()` as
        `npumem.fileio.json_text` writes it with an indent of 1, one buffer a line (its rows
        formatted directly, `npumem.plan.json_rows`)."""
        text = rows_json(self.json_frame(), {"buffers": buffer_rows(self.buffers)})
        if text is None:
            text = json_text(self.to_json_obj(), indent=1)
        if path is not None:
            write_text(path, text)
        return text

    # ----------------------------------------------------------------------------------------
    # Graphs

    @classmethod
    def from_graph(
        cls,
        graph: Graph,
        *,
        include_weights: bool = False,
        include_inputs: bool = True,
        include_outputs: bool = True,
        alignment: int = 1,
        label: str | None = None,
    ) -> Problem:
        """Lifetimes of a graph's tensors (see `npumem.plan.lifetimes` for the rules).

        `label` (the file the graph was read from) starts the message of every error about
        the graph, as it does for the errors of the file's reader. A `graph` that is not a
        `Graph`, or a flag that is not a bool, raises `PlanArgumentTypeError`."""
        from npumem.plan.graph import Graph

        # Typed as a Graph, checked as any object: callers may pass anything.
        given: object = graph
        if not isinstance(given, Graph):
            hint = (
                "; read a graph JSON with Graph.from_json, an ONNX model with Problem.from_onnx"
                if isinstance(given, Mapping | str | os.PathLike) or hasattr(given, "graph")
                else ""
            )
            raise PlanArgumentTypeError(
                f"from_graph takes a Graph, got {type(given).__name__}{hint}"
            )
        check_flag("include_weights", include_weights)
        check_flag("include_inputs", include_inputs)
        check_flag("include_outputs", include_outputs)
        if label is not None and not isinstance(label, str):
            raise PlanArgumentTypeError(f"label must be a str or None, got {shown(label)}")
        check_alignment(alignment)
        try:
            buffers, aliases, empty = lifetimes(
                graph,
                include_weights=include_weights,
                include_inputs=include_inputs,
                include_outputs=include_outputs,
                alignment=alignment,
            )
            problem = cls(buffers, aliases=aliases, name=graph.name, empty=empty)
        except ProblemFormatError as exc:
            if label is None or str(exc).startswith(f"{label}: "):
                raise
            raise type(exc)(f"{label}: {exc}") from None
        problem._left_out = left_out_reasons(graph, problem, include_weights=include_weights)
        return problem

    @classmethod
    def from_onnx(
        cls,
        model: object,
        *,
        dims: Mapping[str, int] | None = None,
        include_weights: bool = False,
        include_inputs: bool = True,
        include_outputs: bool = True,
        alignment: int = 64,
    ) -> Problem:
        """Lifetimes of an ONNX model's tensors (a path or an `onnx.ModelProto`).

        Shapes come from ONNX shape inference; symbolic dimensions are bound by `dims`
        (`{"batch": 1, "seq": 128}`). Needs the `onnx` extra: `pip install npumem[onnx]`.
        A flag that is not a bool raises `PlanArgumentTypeError`.
        """
        check_flag("include_weights", include_weights)
        check_flag("include_inputs", include_inputs)
        check_flag("include_outputs", include_outputs)
        check_alignment(alignment)
        graph = graph_from_onnx(model, dims=dims)
        return cls.from_graph(
            graph,
            include_weights=include_weights,
            include_inputs=include_inputs,
            include_outputs=include_outputs,
            alignment=alignment,
            label=os.fspath(model) if isinstance(model, str | os.PathLike) else graph.name,
        )
