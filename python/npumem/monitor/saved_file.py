"""Open a saved file without knowing in advance whether it holds a snapshot, a trace or a plan."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from npumem.monitor._files import PLAN_FORMAT, Reader, file_kind, path_argument, read_json
from npumem.monitor.errors import FileFormatError
from npumem.monitor.snapshot import Snapshot
from npumem.monitor.trace import Trace

if TYPE_CHECKING:
    from npumem.plan import Solution

__all__ = ["load_saved_file", "saved_file_from_json_obj", "solution_from_json_obj"]


def solution_from_json_obj(obj: Mapping[str, Any], *, where: str = "plan") -> Solution:
    """A planner solution from a plan file's object (`Solution.to_json_obj`).

    Raises `FileFormatError` for a wrong header or field.
    """
    from npumem.plan import PlanError, Problem, Solution

    r = Reader(where)
    r.header(obj, PLAN_FORMAT, (1,))
    buffers = r.field(obj, "buffers", list)
    offsets = {}
    for i, entry in enumerate(buffers):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise r.fail(f"buffers[{i}] must be an object with a string 'id'")
        offsets[entry["id"]] = r.non_negative(entry.get("offset"), f"buffers[{i}].offset")
    capacity = obj.get("capacity")
    name = r.field(obj, "name", str)
    try:  # the problem's errors start with `where` already
        problem = Problem.from_json(obj, name=name, label=where)
    except (PlanError, ValueError) as exc:
        raise FileFormatError(str(exc)) from None
    try:
        return Solution(
            problem,
            offsets,
            lower_bound=obj["lower_bound"],
            capacity=capacity if isinstance(capacity, int) else None,
            status=r.field(obj, "status", str),
        )
    except (PlanError, ValueError) as exc:
        raise r.fail(str(exc)) from None


def load_saved_file(path: str | os.PathLike[str]) -> Snapshot | Trace | Solution:
    """The snapshot, trace or plan in `path`, told apart by the file's `format` field.

    Raises `FileFormatError` for a file that is none of them.
    """
    where = os.fspath(path_argument(path))
    return saved_file_from_json_obj(read_json(path), where=where, consume=True)


def saved_file_from_json_obj(
    obj: Mapping[str, Any], *, where: str = "saved file", consume: bool = False
) -> Snapshot | Trace | Solution:
    """The snapshot, trace or plan in a file's object, told apart by its `format` field
    (`where` names the file in errors). `consume=True` lets a trace's reader empty `obj`'s
    events as it reads them (`Trace.from_json_obj`)."""
    if not isinstance(obj, Mapping):
        raise Reader(where).fail(f"expected a JSON object, found {type(obj).__name__}")
    kind = file_kind(obj, where)
    if kind == "snapshot":
        return Snapshot.from_json_obj(obj, where=where)
    if kind == "plan":
        return solution_from_json_obj(obj, where=where)
    return Trace.from_json_obj(obj, where=where, consume=consume)
