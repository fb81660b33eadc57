"""Tensor lifetimes from a graph: ops in execution order and the tensors they read and write.

The graph format is ours and small (see ``docs/planner.md``)::

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

Rules (op ``i`` runs at time step ``i``; a buffer is live on ``[lower, upper)``):

* a tensor written by op ``p`` and last read by op ``r`` is live on ``[p, r + 1)``; one nobody reads
  on ``[p, p + 1)``. An op's inputs and outputs are live together, so they never share memory
  unless the op is in place.
* graph inputs are live from step 0; graph outputs until the end (``len(ops)``).
* weights (``"weight": true``) are static: not planned, unless ``include_weights`` (then live
  over the whole run).
* a view (``"view_of": base``, optional ``"view_offset"`` in bytes) owns no memory: it lives in
  its base, and every use of the view extends the base's life.
* an in-place op (``"inplace": {output: input}``) may write ``output`` into ``input``'s memory. It
  does so when this op is the input's last use (counting its views and earlier in-place
  outputs), the input is not a graph input, output or weight, and the output fits; otherwise the
  output gets its own buffer.
* ops listed out of order are put in a dependency order (stable); a cycle, a tensor nobody
  declares, writes twice or produces before it is read, is a :class:`GraphError`.
"""

from __future__ import annotations

import heapq
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npumem.plan.errors import GraphError
from npumem.plan.problem import Alias, Buffer, Problem

__all__ = ["DTYPE_SIZES", "Graph", "Op", "Tensor", "lifetimes"]

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
"""Bytes per element of the dtypes a ``shape`` may come with."""


@dataclass(slots=True)
class Tensor:
    """A tensor of ``size`` bytes. ``weight``: static data, not planned by default. ``view_of``:
    the tensor lives inside that one, ``view_offset`` bytes in."""

    name: str
    size: int
    weight: bool = False
    view_of: str | None = None
    view_offset: int = 0
    alignment: int = 1

    @classmethod
    def of_shape(cls, name: str, shape: Sequence[int], dtype: str = "float32", **kw: Any) -> Tensor:
        """A tensor sized from its shape and dtype (see :data:`DTYPE_SIZES`)."""
        if dtype not in DTYPE_SIZES:
            raise GraphError(f"tensor {name!r}: unknown dtype {dtype!r}")
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
            raise GraphError(f"tensor {name!r}: shape {list(shape)} must hold integers >= 0")
        return cls(name, math.prod(shape) * DTYPE_SIZES[dtype], **kw)


@dataclass(slots=True)
class Op:
    """One step of the graph: reads ``inputs``, writes ``outputs``; ``inplace`` maps an output
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
        """A graph from lists; tensor names must be unique."""
        table: dict[str, Tensor] = {}
        for t in tensors:
            if t.name in table:
                raise GraphError(f"graph {name!r}: tensor {t.name!r} is declared twice")
            table[t.name] = t
        return cls(name, table, list(ops), list(inputs), list(outputs))

    # ----------------------------------------------------------------------------------------
    # JSON

    @classmethod
    def from_json(cls, source: str | os.PathLike[str] | Mapping[str, Any]) -> Graph:
        """Read our graph JSON format (a path or the decoded object); errors name the entry."""
        if isinstance(source, Mapping):
            return cls._from_obj(source, "<graph>")
        path = Path(source)
        try:
            obj = json.loads(path.read_text(encoding="utf-8-sig"))
        except OSError as exc:
            raise GraphError(f"{path}: cannot read the file ({exc.strerror})") from exc
        except UnicodeDecodeError as exc:
            raise GraphError(f"{path}: not a UTF-8 text file ({exc.reason})") from exc
        except json.JSONDecodeError as exc:
            raise GraphError(
                f"{path}, line {exc.lineno}, column {exc.colno}: invalid JSON ({exc.msg})"
            ) from exc
        if not isinstance(obj, Mapping):
            raise GraphError(f"{path}: expected a JSON object with 'tensors' and 'ops'")
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

        for key in ("tensors", "ops"):
            if not isinstance(obj.get(key), list):
                raise GraphError(f"{label}: expected a '{key}' list")
        tensors: list[Tensor] = []
        for i, entry in enumerate(obj["tensors"]):
            where = f"{label}: tensors[{i}]"
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                raise GraphError(f"{where}: expected an object with a string 'name'")
            where = f"{where} ({entry['name']!r})"
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
                    raise GraphError(f"{where}: 'size' must be an integer >= 0, got {size!r}")
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
            where = f"{where} ({name!r})"
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
        try:
            return cls.build(
                name if isinstance(name, str) else "",
                tensors,
                ops,
                names("inputs", label, obj),
                names("outputs", label, obj),
            )
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
            "format": "npumem-graph",
            "version": 1,
            "name": self.name,
            "tensors": tensors,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "ops": ops,
        }

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The graph as JSON text (written to ``path`` when given)."""
        text = json.dumps(self.to_json_obj(), indent=1) + "\n"
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    @property
    def activation_bytes(self) -> int:
        """Bytes of every non-weight tensor that owns memory (no reuse at all)."""
        return sum(t.size for t in self.tensors.values() if not t.weight and t.view_of is None)


def _check_and_order(graph: Graph) -> list[Op]:
    """Check references, then return the ops in a dependency order (the given one if valid)."""
    tensors = graph.tensors
    producer: dict[str, int] = {}
    op_names: set[str] = set()
    for i, op in enumerate(graph.ops):
        if op.name in op_names:
            raise GraphError(f"op name {op.name!r} is used twice")
        op_names.add(op.name)
        for t in op.inputs + op.outputs:
            if t not in tensors:
                raise GraphError(f"op {op.name!r} refers to unknown tensor {t!r}")
        for t in op.outputs:
            if t in producer:
                raise GraphError(
                    f"tensor {t!r} is written by op {graph.ops[producer[t]].name!r} and by "
                    f"op {op.name!r}"
                )
            if tensors[t].weight:
                raise GraphError(f"op {op.name!r} writes weight {t!r}")
            producer[t] = i
        for out, src in op.inplace.items():
            if out not in op.outputs or src not in op.inputs:
                raise GraphError(
                    f"op {op.name!r}: in-place pair {out!r} <- {src!r} must map one of its "
                    "outputs to one of its inputs"
                )
    for t in graph.inputs + graph.outputs:
        if t not in tensors:
            raise GraphError(f"graph input or output {t!r} is not a declared tensor")
    for t in graph.inputs:
        if t in producer:
            raise GraphError(
                f"graph input {t!r} is also written by op {graph.ops[producer[t]].name!r}"
            )
    available = set(graph.inputs) | {n for n, t in tensors.items() if t.weight}
    for op in graph.ops:
        for t in op.inputs:
            if t not in producer and t not in available:
                raise GraphError(
                    f"tensor {t!r} is read by op {op.name!r} but is not a graph input or a "
                    "weight and no op writes it"
                )
    for t in graph.outputs:
        if t not in producer and t not in available:
            raise GraphError(f"graph output {t!r} is never written")
    # Views: the base must exist, chains must end.
    for tensor in tensors.values():
        seen = [tensor.name]
        cur = tensor
        while cur.view_of is not None:
            if cur.view_of not in tensors:
                raise GraphError(f"tensor {cur.name!r} is a view of unknown tensor {cur.view_of!r}")
            if cur.view_of in seen:
                raise GraphError(f"views form a cycle: {' -> '.join([*seen, cur.view_of])}")
            seen.append(cur.view_of)
            cur = tensors[cur.view_of]
    # Stable topological order (Kahn, smallest listed index first).
    deps: list[set[int]] = []
    for op in graph.ops:
        needed = set()
        for t in op.inputs:
            if t in producer:
                needed.add(producer[t])
            base = tensors[t].view_of
            while base is not None:
                if base in producer:
                    needed.add(producer[base])
                base = tensors[base].view_of
        deps.append(needed)
    users: list[list[int]] = [[] for _ in graph.ops]
    indegree = [0] * len(graph.ops)
    for i, needed in enumerate(deps):
        for j in needed:
            if j == i:
                raise GraphError(f"op {graph.ops[i].name!r} reads its own output (a cycle)")
            users[j].append(i)
            indegree[i] += 1
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(graph.ops):
        stuck = {i for i, d in enumerate(indegree) if d > 0}
        # Walk dependencies inside the stuck set until an op repeats: that is a cycle.
        path: list[int] = []
        i = min(stuck)
        while i not in path:
            path.append(i)
            i = min(j for j in deps[i] if j in stuck)
        cycle = [*path[path.index(i) :], i]
        raise GraphError(
            "the graph has a cycle: " + " -> ".join(repr(graph.ops[j].name) for j in cycle)
        )
    return [graph.ops[i] for i in order]


def lifetimes(
    graph: Graph,
    *,
    include_weights: bool = False,
    include_inputs: bool = True,
    include_outputs: bool = True,
    alignment: int = 1,
) -> Problem:
    """The planning problem of ``graph`` (see the module docstring for the rules).

    One buffer per tensor that owns memory; views and in-place outputs become
    :class:`~npumem.plan.problem.Alias` entries of the problem. Tensors of 0 bytes are left out.
    ``alignment`` raises every buffer's alignment to at least that.
    """
    ops = _check_and_order(graph)
    tensors = graph.tensors
    n = len(ops)
    end = max(n, 1)
    outputs = set(graph.outputs)
    inputs = set(graph.inputs)

    def root(name: str) -> tuple[str, int]:
        offset = 0
        t = tensors[name]
        while t.view_of is not None:
            offset += t.view_offset
            t = tensors[t.view_of]
        return t.name, offset

    for tensor in tensors.values():
        if tensor.view_of is not None:
            base, offset = root(tensor.name)
            if offset < 0 or offset + tensor.size > tensors[base].size:
                raise GraphError(
                    f"view {tensor.name!r} ({tensor.size} bytes at offset {offset}) does not "
                    f"fit in {base!r} ({tensors[base].size} bytes)"
                )

    # Group: the memory owner of each tensor (itself, a view base, or an in-place input), with
    # the byte offset inside it.
    group: dict[str, tuple[str, int]] = {name: root(name) for name in tensors}
    born: dict[str, int] = {}
    last: dict[str, int] = {}

    def use(name: str, step: int) -> None:
        last[name] = max(last.get(name, step), step)

    for step, op in enumerate(ops):
        for t in op.inputs:
            use(t, step)
        for t in op.outputs:
            born.setdefault(t, step)
            use(t, step)
            if tensors[t].view_of is not None:
                use(root(t)[0], step)
    for t in outputs:
        use(t, end - 1)  # live until the last op has run
    for t in inputs:
        born[t] = 0

    members: dict[str, list[str]] = {}
    for name, (g, _) in group.items():
        members.setdefault(g, []).append(name)

    def group_last(owner: str) -> int:
        return max(last.get(m, born.get(m, 0)) for m in members[owner])

    for step, op in enumerate(ops):
        for out, src in op.inplace.items():
            owner, offset = group[src]
            out_t = tensors[out]
            if out_t.view_of is not None or out not in members or owner == out:
                continue  # a view already lives in its base
            owner_t = tensors[owner]
            if (
                owner_t.weight
                or owner in inputs
                or any(m in outputs or m in inputs for m in members[owner])
                or group_last(owner) > step
                or offset + out_t.size > owner_t.size
                or (out in outputs and not include_outputs)
            ):
                continue
            # The output and the views living in it move into the input's memory.
            for m in members.pop(out):
                group[m] = (owner, offset + group[m][1])
                members[owner].append(m)

    buffers: list[Buffer] = []
    aliases: list[Alias] = []
    for owner, names in members.items():
        owned = tensors[owner]
        if owned.size == 0:
            continue
        if owned.weight and not include_weights:
            continue
        if owner in inputs and not include_inputs:
            continue
        if not include_outputs and all(m in outputs for m in names if tensors[m].size):
            continue
        if owned.weight:
            lower, upper = 0, end
        else:
            lower = min(born.get(m, 0) for m in names)
            upper = group_last(owner) + 1
        buffers.append(Buffer(owner, lower, upper, owned.size, max(owned.alignment, alignment)))
        for m in names:
            if m != owner and tensors[m].size:
                aliases.append(Alias(m, owner, group[m][1], tensors[m].size))
    buffers.sort(key=lambda b: (b.lower, b.id))
    return Problem(buffers, aliases=aliases, name=graph.name)
