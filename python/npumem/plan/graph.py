"""Graphs: ops in execution order and the tensors they read and write.

The graph format is ours and small (see `docs/planner.md`):

    {
      "format": "npumem-graph", "version": 1, "name": "tiny",
      "tensors": [
        {"name": "x", "shape": [1, 3, 224, 224], "dtype": "float32"},
        {"name": "w", "size": 1728, "weight": true},
        {"name": "y", "size": 802816},
        {"name": "y2", "size": 802816, "view_of": "y"}
      ],
      "inputs": ["x"], "outputs": ["y2"],
      "ops": [
        {"name": "conv", "inputs": ["x", "w"], "outputs": ["y"]},
        {"name": "relu", "inputs": ["y"], "outputs": ["y2"], "inplace": {"y2": "y"}}
      ]
    }

`npumem.plan.lifetimes` turns a graph into the buffers to plan.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from npumem._shown import shown
from npumem.fileio import json_text, read_json_object, write_text
from npumem.plan.errors import GraphError, PlanArgumentTypeError
from npumem.plan.inputs import check_header, is_tier_plan, path_argument, tier_plan_refused

__all__ = ["DTYPE_SIZES", "GRAPH_FORMAT", "GRAPH_VERSION", "Graph", "Op", "Tensor"]

GRAPH_FORMAT = "npumem-graph"
"""The `format` field of a graph file (`Graph.to_json()`)."""
GRAPH_VERSION = 1
"""The version of the graph files this npumem writes and reads."""

DTYPE_SIZES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
}
"""Bytes per element of the dtypes a `shape` may come with."""


@dataclass(slots=True)
class Tensor:
    """A tensor of `size` bytes. `weight`: static data, not planned by default. `view_of`:
    the tensor lives inside that one, `view_offset` bytes in."""

    name: str
    size: int
    weight: bool = False
    view_of: str | None = None
    view_offset: int = 0
    alignment: int = 1

    @classmethod
    def of_shape(cls, name: str, shape: Sequence[int], dtype: str = "float32", **kw: Any) -> Tensor:
        """A tensor sized from its shape and dtype (see `DTYPE_SIZES`)."""
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
            raise GraphError(f"tensor {shown(name)}: unknown dtype {shown(dtype)}")
        if isinstance(shape, str | bytes) or not isinstance(shape, Iterable):
            raise PlanArgumentTypeError(
                f"tensor {shown(name)}: shape must be a list of integers, got "
                f"{type(shape).__name__}"
            )
        shape = list(shape)
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
            raise GraphError(f"tensor {shown(name)}: shape {list(shape)} must hold integers >= 0")
        return cls(name, math.prod(shape) * DTYPE_SIZES[dtype], **kw)


@dataclass(slots=True)
class Op:
    """One step of the graph: reads `inputs`, writes `outputs`; `inplace` maps an output
    to the input whose memory it may reuse."""

    name: str
    inputs: list[str]
    outputs: list[str]
    inplace: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Graph:
    """Tensors, ops in execution order, and the graph's inputs and outputs."""

    name: str
    tensors: dict[str, Tensor]
    ops: list[Op]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        name: str,
        tensors: Iterable[Tensor],
        ops: Iterable[Op],
        inputs: Iterable[str] = (),
        outputs: Iterable[str] = (),
    ) -> Graph:
        """A graph from lists; tensor names must be unique. Lists of the wrong kind raise
        `PlanArgumentTypeError`."""
        lists = {"tensors": tensors, "ops": ops, "inputs": inputs, "outputs": outputs}
        for what, items in lists.items():
            if isinstance(items, str | bytes) or not isinstance(items, Iterable):
                raise PlanArgumentTypeError(
                    f"graph {shown(name)}: {what} must be a list, got {type(items).__name__}"
                )
        tensors, ops = list(tensors), list(ops)
        for what, items, kind in (("tensors", tensors, Tensor), ("ops", ops, Op)):
            odd = next((x for x in items if not isinstance(x, kind)), None)
            if odd is not None:
                raise PlanArgumentTypeError(
                    f"graph {shown(name)}: {what} must hold {kind.__name__} objects, got "
                    f"{type(odd).__name__}"
                )
        table: dict[str, Tensor] = {}
        for t in tensors:
            if t.name in table:
                raise GraphError(f"graph {shown(name)}: tensor {shown(t.name)} is declared twice")
            table[t.name] = t
        return cls(name, table, list(ops), list(inputs), list(outputs))

    # ----------------------------------------------------------------------------------------
    # JSON

    @classmethod
    def from_json(
        cls, source: str | os.PathLike[str] | Mapping[str, Any], *, label: str = "<graph>"
    ) -> Graph:
        """Read our graph JSON format (a path or the decoded object); errors name the entry
        (and start with the path, or with `label` for a decoded object)."""
        if isinstance(source, Mapping):
            return cls._from_obj(source, label)
        path = path_argument(
            source,
            error=GraphError,
            what="a graph JSON file path (str or os.PathLike) or a decoded JSON object",
        )
        obj = read_json_object(
            path, error=GraphError, expected="a JSON object with 'tensors' and 'ops'"
        )
        return cls._from_obj(obj, str(path))

    @classmethod
    def _from_obj(cls, obj: Mapping[str, Any], label: str) -> Graph:
        def need_list(key: str, where: str, entry: Mapping[str, Any]) -> list[Any]:
            value = entry.get(key, [])
            if not isinstance(value, list):
                raise GraphError(f"{where}: '{key}' must be a list")
            return value

        def names(key: str, where: str, entry: Mapping[str, Any]) -> list[str]:
            value = need_list(key, where, entry)
            if not all(isinstance(v, str) for v in value):
                raise GraphError(f"{where}: '{key}' must be a list of tensor names")
            return value

        if is_tier_plan(obj):
            raise tier_plan_refused(label, "a graph", error=GraphError)
        check_header(obj, label, GRAPH_FORMAT, GRAPH_VERSION, error=GraphError)
        if "buffers" in obj:
            raise GraphError(
                f"{label}: holds 'buffers', which a problem or a plan has, not a graph "
                "(a graph has 'tensors' and 'ops')"
            )
        for key in ("tensors", "ops"):
            if not isinstance(obj.get(key), list):
                raise GraphError(f"{label}: expected a '{key}' list")
        tensors: list[Tensor] = []
        for i, entry in enumerate(obj["tensors"]):
            where = f"{label}: tensors[{i}]"
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                raise GraphError(f"{where}: expected an object with a string 'name'")
            if not entry["name"]:
                raise GraphError(f"{where}: 'name' is empty")
            where = f"{where} ({shown(entry['name'])})"
            known = {
                "name",
                "size",
                "shape",
                "dtype",
                "weight",
                "view_of",
                "view_offset",
                "alignment",
            }
            unknown = sorted(set(entry) - known)
            if unknown:
                raise GraphError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
            extra: dict[str, Any] = {}
            if "weight" in entry:
                if not isinstance(entry["weight"], bool):
                    raise GraphError(f"{where}: 'weight' must be true or false")
                extra["weight"] = entry["weight"]
            if entry.get("view_of") is not None:
                if not isinstance(entry["view_of"], str):
                    raise GraphError(f"{where}: 'view_of' must be a tensor name")
                extra["view_of"] = entry["view_of"]
            for key in ("view_offset", "alignment"):
                if key in entry:
                    value = entry[key]
                    if isinstance(value, bool) or not isinstance(value, int):
                        raise GraphError(f"{where}: '{key}' must be an integer")
                    extra[key] = value
            if "size" in entry:
                size = entry["size"]
                if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                    raise GraphError(f"{where}: 'size' must be an integer >= 0, got {shown(size)}")
                tensors.append(Tensor(entry["name"], size, **extra))
            elif "shape" in entry:
                shape = entry["shape"]
                if not isinstance(shape, list):
                    raise GraphError(f"{where}: 'shape' must be a list of integers")
                dtype = entry.get("dtype", "float32")
                try:
                    tensors.append(Tensor.of_shape(entry["name"], shape, dtype, **extra))
                except GraphError as exc:
                    raise GraphError(f"{label}: {exc}") from None
            else:
                raise GraphError(f"{where}: give 'size' (bytes) or 'shape' (and 'dtype')")
        ops: list[Op] = []
        for i, entry in enumerate(obj["ops"]):
            where = f"{label}: ops[{i}]"
            if not isinstance(entry, Mapping):
                raise GraphError(f"{where}: expected an object")
            name = entry.get("name", f"op{i}")
            if not isinstance(name, str):
                raise GraphError(f"{where}: 'name' must be a string")
            where = f"{where} ({shown(name)})"
            inplace = entry.get("inplace", {})
            if not isinstance(inplace, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in inplace.items()
            ):
                raise GraphError(f"{where}: 'inplace' must map output names to input names")
            ops.append(
                Op(
                    name,
                    names("inputs", where, entry),
                    names("outputs", where, entry),
                    dict(inplace),
                )
            )
        name = obj.get("name", "")
        inputs, outputs = names("inputs", label, obj), names("outputs", label, obj)
        try:
            return cls.build(name if isinstance(name, str) else "", tensors, ops, inputs, outputs)
        except GraphError as exc:
            raise GraphError(f"{label}: {exc}") from None

    def to_json_obj(self) -> dict[str, Any]:
        """The graph in our JSON format, as a dict."""
        tensors: list[dict[str, Any]] = []
        for t in self.tensors.values():
            entry: dict[str, Any] = {"name": t.name, "size": t.size}
            if t.weight:
                entry["weight"] = True
            if t.view_of is not None:
                entry["view_of"] = t.view_of
                if t.view_offset:
                    entry["view_offset"] = t.view_offset
            if t.alignment != 1:
                entry["alignment"] = t.alignment
            tensors.append(entry)
        ops: list[dict[str, Any]] = []
        for op in self.ops:
            o: dict[str, Any] = {"name": op.name, "inputs": op.inputs, "outputs": op.outputs}
            if op.inplace:
                o["inplace"] = op.inplace
            ops.append(o)
        return {
            "format": GRAPH_FORMAT,
            "version": GRAPH_VERSION,
            "name": self.name,
            "tensors": tensors,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "ops": ops,
        }

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The graph as JSON text (written to `path` when given)."""
        text = json_text(self.to_json_obj(), indent=1)
        if path is not None:
            write_text(path, text)
        return text

    @property
    def activation_bytes(self) -> int:
        """Bytes of every non-weight tensor that owns memory (no reuse at all)."""
        return sum(t.size for t in self.tensors.values() if not t.weight and t.view_of is None)
