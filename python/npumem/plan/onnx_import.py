"""Graphs from ONNX models (needs the `onnx` extra: `pip install 'npumem[onnx]'`).

Shapes come from ONNX shape inference, after the symbolic dimensions named in `dims` are bound
(`{"batch": 1, "sequence": 128}`), with shape computations folded and stale declarations
ignored (`npumem.plan.onnx_shapes`). A tensor whose shape is still unknown is a `GraphError`
that names it and its unbound dimensions.

Mapping to our graph format (`npumem.plan.graph`):

* initializers and `Constant` outputs are weights;
* `Reshape`, `Flatten`, `Squeeze`, `Unsqueeze` and `Identity` outputs are views of their
  data input;
* element-wise ops (activations, `BatchNormalization`, and binary arithmetic whose first input
  has the output's shape) may run in place on their first input;
* an output that no node reads and the graph does not return, and whose shape inference
  cannot size (such as `Dropout`'s mask in older opsets), is left out: a runtime does not
  compute an unused optional output;
* control flow (`If`, `Loop`, `Scan`, nested) is flattened into the sequence of ops: an
  `If`'s branches one after the other, then a join; a loop's body once, between an op that
  begins the loop and one that ends it (`docs/planner.md`, *Control flow*, says how, and what
  a runtime following the plan does). The values of a subgraph are named
  `{op}/then/{name}`, `{op}/else/{name}` and `{op}/body/{name}`;
* values that are not tensors (sequences, maps), nodes with other subgraphs (`SequenceMap`)
  and the batched `Scan` of opset 8 are refused;
* every tensor is written once: by one node, or as a graph input or an initializer, and every
  tensor a node reads is written somewhere; a graph that breaks this or has a cycle is refused
  before shape inference, naming the tensor and the node. Messages name a node by its name, or
  by its position and op type when it has none (`#12 (LayerNormalization)`).
"""

from __future__ import annotations

import itertools
import math
import os
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from npumem._shown import shown
from npumem.errors import MissingDependencyError
from npumem.plan.errors import GraphError
from npumem.plan.graph import Graph, Op, Tensor
from npumem.plan.inputs import content_kind, path_argument, read_input
from npumem.plan.onnx_shapes import (
    CONTROL_FLOW_OPS,
    FOLD_LIMIT,
    SUBGRAPH_ATTRIBUTES,
    Failure,
    Inferred,
    defined_names,
    dependency_order,
    infer_types,
    node_label,
    node_reads,
    subgraphs,
)

__all__ = [
    "INPLACE_OPS",
    "MAX_DIM",
    "VIEW_OPS",
    "check_dims",
    "graph_from_onnx",
    "load_onnx",
    "parse_onnx",
]

VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
"""Ops whose output is a view of their first input."""

INPLACE_OPS = frozenset(
    {
        "Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Clip", "Elu", "Selu", "Celu",
        "HardSigmoid", "HardSwish", "Gelu", "Erf", "Softmax", "LogSoftmax", "Neg", "Abs", "Exp",
        "Log", "Sqrt", "Reciprocal", "Dropout", "BatchNormalization", "Add", "Sub", "Mul", "Div",
        "Pow", "Mish", "Softplus", "Sign", "Floor", "Ceil", "Round",
    }
)  # fmt: skip
"""Element-wise ops whose output may reuse their first input's memory."""


def _sub_byte_bits() -> dict[int, int]:
    """Bits per element of the ONNX element types packed several to a byte."""
    from onnx import TensorProto

    bits = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}
    bits |= {"FLOAT6E2M3": 6, "FLOAT6E3M2": 6}
    return {getattr(TensorProto, n): b for n, b in bits.items() if hasattr(TensorProto, n)}


def _elem_type_name(onnx: Any, elem_type: int) -> str:
    try:
        return f"{onnx.TensorProto.DataType.Name(elem_type)} ({elem_type})"
    except ValueError:
        return str(elem_type)


def _known(shape: list[int | str | None]) -> bool:
    return all(isinstance(d, int) for d in shape)


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError(
            "reading ONNX models needs the onnx package: pip install 'npumem[onnx]'"
        ) from exc
    return onnx


MAX_DIM = (1 << 63) - 1
"""The largest value a dimension may be bound to: ONNX stores dimensions as 64-bit integers."""


def check_dims(dims: object) -> dict[str, int]:
    """`dims` as a dict of dimension name -> value; anything but a mapping of names to
    integers from 1 to `MAX_DIM` raises `GraphError` (a batch or a sequence of 0 plans nothing,
    as `--dim` says)."""
    if dims is None:
        return {}
    if not isinstance(dims, Mapping):
        raise GraphError(f"dims must map dimension names to integers, got {type(dims).__name__}")
    for key, value in dims.items():
        if not isinstance(key, str):
            raise GraphError(f"dims: a dimension name must be a string, got {shown(key)}")
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIM:
            raise GraphError(
                f"dims[{shown(key)}] must be an integer from 1 to {MAX_DIM} (ONNX dimensions "
                f"are 64-bit), got {shown(value)}"
            )
    return dict(dims)


def parse_onnx(data: bytes, label: str, base_dir: str | os.PathLike[str] | None = None) -> Any:
    """The `onnx.ModelProto` in `data`, the bytes of the model file `label`. Of the tensors
    stored as external data, only the small ones (shape constants, which sizing may need) are
    read, from `base_dir`; the weights stay where they are (planning needs only their shapes,
    and a model of several gigabytes could not be held in one protobuf)."""
    onnx = _onnx()
    kind = content_kind(data)
    if kind is not None:
        raise GraphError(f"{label}: not an ONNX model (it reads as a {kind.upper()} file)")
    try:
        proto = onnx.load_model_from_string(data)
        if base_dir is not None:
            for tensor in _small_external_tensors(onnx, proto):
                onnx.external_data_helper.load_external_data_for_tensor(tensor, os.fspath(base_dir))
    except Exception as exc:
        raise GraphError(f"{label}: not a readable ONNX model ({exc})") from exc
    # A graph without nodes is a model only if it has outputs (its inputs or weights, passed
    # through); without either it is what an empty or cut-off file parses as.
    if not proto.HasField("graph") or not (proto.graph.node or proto.graph.output):
        raise GraphError(
            f"{label}: not an ONNX model (no graph with nodes or outputs in it; an empty or "
            "truncated file?)"
        )
    return proto


def _inline_functions(onnx: Any, proto: Any, label: str) -> Any:
    """`proto` with every call of one of its model-local functions replaced by the function's
    nodes (recursively), as a runtime runs it: the tensors a function computes need room too.
    Exporters write such functions (torch.onnx's dynamo exporter: one per module)."""
    local = {(f.domain, f.name) for f in proto.functions}
    if not any((n.domain, n.op_type) in local for g in _all_graphs(proto.graph) for n in g.node):
        return proto
    try:
        import onnx.inliner

        return onnx.inliner.inline_local_functions(proto)
    except Exception as exc:
        raise GraphError(f"{label}: could not inline the model's local functions ({exc})") from exc


def _all_graphs(graph: Any) -> Iterator[Any]:
    """`graph` and every subgraph in it, nested ones included."""
    pending = [graph]
    while pending:
        current = pending.pop()
        yield current
        for node in current.node:
            pending.extend(sub for _, sub in subgraphs(node))


def _small_external_tensors(onnx: Any, proto: Any) -> list[Any]:
    """The initializers and `Constant` values of the model's graphs (subgraphs included)
    stored as external data that have at most `FOLD_LIMIT` elements."""
    tensors: list[Any] = []
    for graph in _all_graphs(proto.graph):
        tensors.extend(graph.initializer)
        for node in graph.node:
            tensors.extend(a.t for a in node.attribute if a.type == onnx.AttributeProto.TENSOR)
    return [
        t
        for t in tensors
        if t.data_location == onnx.TensorProto.EXTERNAL and math.prod(t.dims) <= FOLD_LIMIT
    ]


def load_onnx(path: object) -> Any:
    """The `onnx.ModelProto` in the file at `path` (read once)."""
    checked = path_argument(path, error=GraphError, what="an ONNX file path (str or os.PathLike)")
    return parse_onnx(read_input(checked, error=GraphError), str(checked), checked.parent)


def _symbolic_dims(graph: Any) -> set[str]:
    """The names of the symbolic dimensions declared in the inputs, outputs and value infos of
    a graph and its subgraphs (those `dims` can bind)."""
    names: set[str] = set()
    for g in _all_graphs(graph):
        for value_info in [*g.input, *g.output, *g.value_info]:
            t = value_info.type
            if t.HasField("tensor_type") and t.tensor_type.HasField("shape"):
                names.update(d.dim_param for d in t.tensor_type.shape.dim if d.dim_param)
    return names


def _value_inputs(onnx: Any, graph: Any) -> set[str]:
    """The graph inputs whose value `dims` may give: integer scalars (no dimension, or one
    of 1) that are not initializers, such as a generation loop's maximum length."""
    integers = {
        getattr(onnx.TensorProto, n)
        for n in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
    }
    weights = {init.name for init in graph.initializer}
    found: set[str] = set()
    for v in graph.input:
        t = v.type
        if v.name in weights or not t.HasField("tensor_type"):
            continue
        tensor = t.tensor_type
        if tensor.elem_type in integers and tensor.HasField("shape"):
            dims = list(tensor.shape.dim)
            if not dims or (len(dims) == 1 and dims[0].dim_value == 1):
                found.add(v.name)
    return found


def _named_once(names: Iterable[str], label: str, twice: str, where: str = "") -> set[str]:
    """The set of `names`; a name given twice is a `GraphError` saying `twice` (formatted with
    the name), then `where`."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise GraphError(
                f"{label}: {twice.format(shown(name))}{where} (each tensor name may be given once)"
            )
        seen.add(name)
    return seen


def _check_structure(
    graph: Any, label: str, opset: int, outer: frozenset[str] = frozenset(), where: str = ""
) -> None:
    """Refuse, before shape inference, a graph whose tensors are not each written once (by a
    node, as a graph input or as an initializer), that reads a tensor nothing writes, or that
    has a cycle; each message names the tensor and a node. Subgraphs are checked the same way,
    a name they do not define resolving to an enclosing graph's value (`outer`); a node with a
    subgraph that is not an `If`, a `Loop` or a `Scan` (opset 9 on) is refused."""
    initializers = _named_once(
        (init.name for init in graph.initializer), label, "two initializers are named {}", where
    )
    inputs = _named_once(
        (v.name for v in graph.input), label, "graph input {} is declared twice", where
    )
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            at = f"node {node_label(node, i)}{where}"
            if out in producer:
                first = producer[out]
                by = (
                    f"twice by that node{where}"
                    if first == i
                    else f"by node {node_label(graph.node[first], first)} and by {at}"
                )
                raise GraphError(
                    f"{label}: tensor {shown(out)} is written {by} (a tensor is written once)"
                )
            for kind, names in (("an initializer", initializers), ("a graph input", inputs)):
                if out in names:
                    raise GraphError(
                        f"{label}: {at} writes tensor {shown(out)}, which is {kind} (a tensor "
                        "is "
                        "written once: rename the node's output)"
                    )
            producer[out] = i
    available = initializers | inputs
    enclosing = ", nor a value of an enclosing graph" if where else ""
    for i, node in enumerate(graph.node):
        for x in node.input:
            if x and x not in producer and x not in available and x not in outer:
                raise GraphError(
                    f"{label}: node {node_label(node, i)}{where} reads tensor {shown(x)}, which "
                    "has no producer: no node writes it, and it is neither a graph input nor an "
                    f"initializer{enclosing}"
                )
    for value_info in graph.output:
        name = value_info.name
        if name not in producer and name not in available and name not in outer:
            what = "graph output" if not where else "output"
            raise GraphError(
                f"{label}: {what} {shown(name)}{where} has no producer: no node writes it, and it "
                f"is neither a graph input nor an initializer{enclosing}"
            )
    visible = outer | producer.keys() | available
    for i, node in enumerate(graph.node):
        found = subgraphs(node)
        if not found:
            continue
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        at = f"{label}: node {node_label(node, i)}{where}"
        if domain or node.op_type not in CONTROL_FLOW_OPS:
            why = (
                ": it maps over sequences, which are not tensors"
                if node.op_type == "SequenceMap" and not domain
                else ""
            )
            raise GraphError(
                f"{at} has a subgraph ({found[0][0]}){why}; only the subgraphs of If, Loop and "
                "Scan are planned"
            )
        if node.op_type == "Scan" and opset < 9:
            raise GraphError(
                f"{at} is a Scan of opset {opset} (batched, with sequence_lens), which is not "
                "planned; convert the model to opset 9 or later"
            )
        attrs = dict(found)
        for attr in SUBGRAPH_ATTRIBUTES[node.op_type]:
            if attr not in attrs:
                raise GraphError(f"{at} has no {attr}")
            inner = f" in the {attr} of node {node_label(node, i)}{where}"
            _check_structure(attrs[attr], label, opset, frozenset(visible), inner)
    cycle = _cycle(graph.node, producer)
    if cycle is not None:
        node = graph.node[cycle]
        raise GraphError(
            f"{label}: the graph has a cycle: node {node_label(node, cycle)}{where} depends, "
            "through the tensors it reads, on its own output"
        )


def _cycle(nodes: Any, producer: dict[str, int]) -> int | None:
    """The position of a node on a cycle of `nodes` (edges from each tensor's producer to its
    readers, the values a node's subgraphs read included), or None when there is none."""
    reads = [node_reads(node) for node in nodes]
    waiting = [0] * len(nodes)
    readers: list[list[int]] = [[] for _ in nodes]
    for i in range(len(nodes)):
        for before in {producer[x] for x in reads[i] if x in producer}:
            readers[before].append(i)
            waiting[i] += 1
    ready = [i for i, n in enumerate(waiting) if n == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for j in readers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    if done == len(nodes):
        return None
    # Every node left waits on another node left: walking back from one through producers
    # that are left must come round to a node already seen, which lies on a cycle.
    left = {i for i, n in enumerate(waiting) if n > 0}
    seen: list[int] = []
    at = min(left)
    while at not in seen:
        seen.append(at)
        at = min(producer[x] for x in reads[at] if x in producer and producer[x] in left)
    return at


def graph_from_onnx(
    model: object, *, dims: Mapping[str, int] | None = None, label: str | None = None
) -> Graph:
    """Our graph of an ONNX model: a path or an `onnx.ModelProto`; `dims` binds symbolic
    dimensions by name (each must be one of the model's), and gives the value of integer
    scalar graph inputs (a loop's trip count); `label` names the model in errors (default: the
    path, or the graph's name). Control flow is flattened into the graph's ops: see
    `docs/planner.md`."""
    onnx = _onnx()
    dims = check_dims(dims)
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        label = label or model.graph.name or "<onnx model>"
    elif isinstance(model, str | os.PathLike):
        proto = load_onnx(model)
        label = label or os.fspath(model)
    else:
        raise GraphError(f"expected a path or an onnx.ModelProto, got {type(model).__name__}")

    proto = _inline_functions(onnx, proto, label)
    graph = proto.graph
    symbolic = _symbolic_dims(graph)
    scalars = _value_inputs(onnx, graph)
    unknown = sorted(set(dims) - symbolic - scalars)
    if unknown:
        known = sorted(symbolic)
        message = (
            f"{label}: the model has no symbolic dimension {', '.join(map(repr, unknown))} to "
            f"bind (dims, --dim); its symbolic dimensions: "
            f"{', '.join(map(repr, known)) if known else 'none'}"
        )
        if scalars:
            message += (
                f"; its integer scalar inputs, whose value dims may give: "
                f"{', '.join(map(repr, sorted(scalars)))}"
            )
        raise GraphError(message)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    _check_structure(graph, label, opset)
    # Bind symbolic dimensions everywhere they are declared, then infer the rest.
    for g in _all_graphs(graph):
        for value_info in [*g.input, *g.output, *g.value_info]:
            t = value_info.type
            if t.HasField("tensor_type") and t.tensor_type.HasField("shape"):
                for dim in t.tensor_type.shape.dim:
                    if dim.HasField("dim_param") and dim.dim_param in dims:
                        dim.dim_value = dims[dim.dim_param]
    bound = {name: dims[name] for name in scalars if name in dims}
    try:
        inferred = infer_types(onnx, proto, bound)
    except Exception as exc:
        raise GraphError(f"{label}: ONNX shape inference failed ({exc})") from exc
    return _Flattener(onnx, label, dims, _symbolic_dims(graph), bound).build(proto, inferred)


@dataclass(slots=True, eq=False)
class _Scope:
    """A graph being flattened: the model's, or a subgraph, whose names resolve to its own
    values first, then to those of the graphs around it."""

    graph: Any
    inferred: Inferred
    parent: _Scope | None
    prefix: str
    """What the flattened names of the graph's values and nodes start with ('' at the top)."""
    names: dict[str, str] = field(default_factory=dict)
    """The graph's own values flattened so far: ONNX name -> flattened name."""
    read: set[str] = field(default_factory=set)
    """The names the graph's nodes read (their subgraphs' reads of enclosing values included)."""
    returned: set[str] = field(init=False)
    """The names of the graph's outputs."""

    def __post_init__(self) -> None:
        self.returned = {v.name for v in self.graph.output}

    def flat(self, name: str) -> str:
        """The flattened name of the value `name` means here (lexical scope)."""
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        raise GraphError(f"tensor {shown(name)}{self.inferred.where} is not defined")

    def graph_name(self) -> str:
        """This graph in a message: `the model`, `the then_branch of node 'if' (If)`."""
        return "the model" if self.parent is None else self.inferred.where.removeprefix(" in ")

    def declare_in(self, name: str) -> str:
        """Where the value `name` of this graph may declare its shape: the graph's value_info,
        and for an output of the graph its entry among the outputs too (of two declarations,
        the more specific one counts)."""
        output = name in self.returned
        if self.parent is None:
            return "the model's value_info" + (" or its graph outputs" if output else "")
        return f"the value_info{' or the outputs' if output else ''} of {self.graph_name()}"


class _Flattener:
    """Builds our graph from an ONNX model: the model's nodes become ops in a dependency
    order, and the subgraphs of control-flow nodes are flattened into that sequence (see
    `docs/planner.md`, *Control flow*)."""

    def __init__(
        self,
        onnx: Any,
        label: str,
        dims: Mapping[str, int],
        bindable: set[str],
        bound: Mapping[str, int],
    ) -> None:
        self.onnx = onnx
        self.label = label
        self.dims = dims
        self.bindable = bindable
        self.bound = bound
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []
        self.op_names: set[str] = set()
        self.taken: set[str] = set()
        """Flattened tensor names in use or reserved (the top graph's names)."""
        self.info: dict[str, tuple[int, list[int | str | None]]] = {}
        self.not_tensors: dict[str, str] = {}  # name -> the kind of value (sequence, map, ...)
        self.no_inference: dict[str, tuple[str, str]] = {}
        self.failed: dict[str, Failure] = {}
        self.named: dict[str, str] = {}
        """How messages name each flattened value: its ONNX name and where it lies."""
        self.onnx_names: dict[str, str] = {}
        """The ONNX name of each flattened value."""
        self.declare_in: dict[str, str] = {}
        """Where each flattened value's shape may be declared (a graph's value_info, and its
        outputs for an output of the graph)."""
        self.conflicts: dict[str, tuple[str, str]] = {}
        """The values whose graph declares them twice with shapes that disagree: the graph (as
        `_Scope.graph_name` names it) and what the two declarations say."""
        self.origin: dict[str, tuple[_Scope, Any]] = {}
        """The node that computes each flattened value, and the graph it lies in."""
        self.inputs: list[str] = []
        self.graph_inputs: set[str] = set()
        self.scalar_inputs: set[str] = set()
        self.claimed: set[str] = set()
        """Tensors already given another role in memory: the home of an `If`'s output, or a
        loop's new value placed in its carried value's buffer."""
        self.sub_byte = _sub_byte_bits()

    # ----------------------------------------------------------------------------------------
    # values

    def shape_of(self, t: Any) -> tuple[int, list[int | str | None]] | None:
        """A tensor type's element type and shape: known dimensions, the symbolic ones the user
        can bind (bound or by name), None for the rest. None for a value that is not a tensor
        or has no type."""
        if t is None or t.WhichOneof("value") != "tensor_type":
            return None
        shape: list[int | str | None] = []
        if t.tensor_type.HasField("shape"):
            for dim in t.tensor_type.shape.dim:
                if dim.HasField("dim_value"):
                    shape.append(dim.dim_value)
                elif dim.dim_param in self.bindable:  # a dimension the user can bind
                    shape.append(self.dims.get(dim.dim_param, dim.dim_param))
                else:  # unnamed, or named by shape inference (unk__0): not bindable
                    shape.append(None)
        else:
            shape = [None]
        return t.tensor_type.elem_type, shape

    def define(self, scope: _Scope, name: str) -> str:
        """Give the value `name` of `scope` its flattened name (the name itself in the top
        graph; in a subgraph the graph's prefix and the name, made unique with `#2`, `#3`, ...
        when taken) and record what inference found for it."""
        if scope.parent is None:
            flat = name
        else:
            flat = scope.prefix + name
            if flat in self.taken:
                flat = next(
                    f"{flat}#{k}" for k in itertools.count(2) if f"{flat}#{k}" not in self.taken
                )
        self.taken.add(flat)
        scope.names[name] = flat
        self.named[flat] = shown(name) + scope.inferred.where
        self.onnx_names[flat] = name
        self.declare_in[flat] = scope.declare_in(name)
        if name in scope.inferred.conflicts:
            self.conflicts[flat] = (scope.graph_name(), scope.inferred.conflicts[name])
        found = scope.inferred.types.get(name)
        kind = None if found is None else found.WhichOneof("value")
        if kind is not None and kind != "tensor_type":
            self.not_tensors[flat] = kind.replace("_type", "")
        shape = self.shape_of(found)
        if shape is not None:
            self.info[flat] = shape
        if name in scope.inferred.no_inference:
            self.no_inference[flat] = scope.inferred.no_inference[name]
        if name in scope.inferred.failed:
            self.failed[flat] = scope.inferred.failed[name]
        return flat

    def size_of(self, flat: str, elem_type: int, shape: list[int]) -> int:
        """The bytes of a tensor of `shape` and ONNX element type `elem_type`."""
        onnx, label = self.onnx, self.label
        negative = [d for d in shape if d < 0]
        if negative:
            raise GraphError(
                f"{label}: tensor {self.named[flat]} has a negative dimension {negative[0]} (shape "
                f"{' x '.join(map(str, shape))})"
            )
        bits = self.sub_byte.get(elem_type)
        if bits is not None:  # packed several to a byte
            return -(-math.prod(shape) * bits // 8)
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        except Exception:
            dtype = None
        if dtype is None or dtype.kind == "O":  # strings: no fixed size
            raise GraphError(
                f"{label}: tensor {self.named[flat]} has element type "
                f"{_elem_type_name(onnx, elem_type)}, which has no fixed size"
            )
        return math.prod(shape) * int(dtype.itemsize)

    def need_tensor(self, flat: str) -> None:
        """Refuse a value that is not a tensor."""
        if flat in self.not_tensors:
            raise GraphError(
                f"{self.label}: value {self.named[flat]} is a {self.not_tensors[flat]}, not a "
                "tensor: only tensors can be planned"
            )

    def activation(self, flat: str) -> Tensor:
        """The tensor of a value, sized from its shape; a `GraphError` that says why when it
        cannot be sized."""
        label, info, name = self.label, self.info, self.named[flat]
        self.need_tensor(flat)
        sized = flat in info and _known(info[flat][1])
        if flat in self.conflicts and not sized:
            graph, declarations = self.conflicts[flat]
            why = ""
            if flat in self.no_inference:
                why = f"node {self.no_inference[flat][0]} has no ONNX shape inference, and "
            raise GraphError(
                f"{label}: tensor {name} has no known shape: {why}{graph} declares two shapes "
                f"for it that disagree ({declarations}); make the two agree"
            )
        if flat in self.no_inference and not sized:
            node, reason = self.no_inference[flat]
            raise GraphError(
                f"{label}: tensor {name} has no known shape: node {node} has no ONNX shape "
                f"inference{f' ({reason})' if reason else ''}; declare the shape of "
                f"{shown(self.onnx_names[flat])} in {self.declare_in[flat]}"
            )
        if flat in self.failed and not sized:
            failure = self.failed[flat]
            if failure.broadcast:
                raise GraphError(
                    f"{label}: tensor {name} has no shape: the dimensions of the inputs of "
                    f"node {failure.node} do not broadcast together ({failure.inputs}); check "
                    "the values bound to the model's dimensions (dims, --dim)"
                )
            raise GraphError(
                f"{label}: tensor {name} has no shape: ONNX shape inference of node "
                f"{failure.node} fails on its inputs ({failure.inputs}): {failure.error}"
            )
        if flat not in info:
            if flat in self.graph_inputs:
                raise GraphError(
                    f"{label}: graph input {name} has no type; declare its element type and "
                    "shape in the model's inputs"
                )
            raise GraphError(
                f"{label}: shape inference gave no shape for tensor {name}; the model may "
                "need its input shapes bound (dims=...) or a newer opset"
            )
        elem_type, shape = info[flat]
        unknown = [d for d in shape if not isinstance(d, int)]
        if unknown:
            named = sorted({d for d in unknown if isinstance(d, str)})
            values = (
                []
                if named or flat in self.graph_inputs
                else sorted(self.inputs_behind(flat)[0] - set(self.bound))
            )
            hint = (
                f"; bind {', '.join(map(repr, named))} (command line: "
                f"{' '.join('--dim ' + shlex.quote(f'{d}=1') for d in named)}; Python: dims="
                f"{{{', '.join(f'{d!r}: 1' for d in named)}}})"
                if named
                else " (the model does not give it: name the dimension in the model to bind it)"
                if flat in self.graph_inputs
                else f" (it depends on the value of {', '.join(map(repr, values))}: bind it "
                f"(command line: {' '.join('--dim ' + shlex.quote(f'{d}=N') for d in values)};"
                f" Python: dims={{{', '.join(f'{d!r}: N' for d in values)}}}))"
                if values
                else " (not inferable: it may depend on the data; declare it in "
                f"{self.declare_in[flat]}, with a named dimension to bind)"
            )
            shape_text = " x ".join("?" if d is None else str(d) for d in shape)
            raise GraphError(f"{label}: tensor {name} has an unknown shape {shape_text}{hint}")
        return Tensor(flat, self.size_of(flat, elem_type, [d for d in shape if isinstance(d, int)]))

    def root(self, flat: str) -> str:
        """The tensor that owns `flat`'s memory (up its chain of views)."""
        while (base := self.tensors[flat].view_of) is not None:
            flat = base
        return flat

    # ----------------------------------------------------------------------------------------
    # graphs

    def build(self, proto: Any, inferred: Inferred) -> Graph:
        """Our graph of `proto`, its values' types in `inferred`."""
        graph = proto.graph
        self.scalar_inputs = _value_inputs(self.onnx, graph)
        top = _Scope(graph, inferred, None, "")
        # The top graph keeps its names: a flattened name never takes one of them.
        self.taken = defined_names(graph) | {v.name for v in graph.output}
        try:
            self.run(top)
        except GraphError as exc:
            if str(exc).startswith(f"{self.label}: "):
                raise
            raise GraphError(f"{self.label}: {exc}") from None
        outputs = [v.name for v in graph.output]
        try:
            return Graph.build(
                graph.name or self.label, self.tensors.values(), self.ops, self.inputs, outputs
            )
        except GraphError as exc:
            raise GraphError(f"{self.label}: {exc}") from None

    def op_name(self, name: str) -> str:
        """`name`, or `name#2`, `name#3`, ... when an op has it (ONNX node names are optional
        and need not be unique)."""
        if name in self.op_names:
            name = next(
                f"{name}#{k}" for k in itertools.count(2) if f"{name}#{k}" not in self.op_names
            )
        self.op_names.add(name)
        return name

    def run(self, scope: _Scope) -> None:
        """Flatten the nodes of `scope` (its inputs, for a subgraph, are already defined)."""
        graph = scope.graph
        scope.read = {x for node in graph.node for x in node_reads(node)}
        for init in graph.initializer:
            flat = self.define(scope, init.name)
            size = self.size_of(flat, init.data_type, list(init.dims))
            self.tensors[flat] = Tensor(flat, size, weight=True)
        if scope.parent is None:
            self.inputs = [v.name for v in graph.input if v.name not in self.tensors]
            for name in self.inputs:
                self.define(scope, name)
            self.graph_inputs = set(self.inputs)
            for name in self.inputs:
                self.tensors[name] = self.activation(name)
        # The top graph's nodes keep the order they are listed in (ops listed out of order
        # are put in order when the lifetimes are computed); a graph with control flow, and
        # every subgraph, is put in order here, so that a subgraph's ops land between the ops
        # that begin and end it.
        ordered = scope.parent is not None or any(subgraphs(node) for node in graph.node)
        nodes = dependency_order(graph.node) if ordered else list(enumerate(graph.node))
        for index, node in nodes:
            name = self.op_name(scope.prefix + (node.name or f"{node.op_type}_{index}"))
            if node.op_type == "Constant":
                for out in node.output:
                    if out:
                        flat = self.define(scope, out)
                        size = self.activation(flat).size
                        self.tensors[flat] = Tensor(flat, size, weight=True)
            elif node.op_type == "If" and subgraphs(node):
                self.flatten_if(scope, index, node, name)
            elif node.op_type in ("Loop", "Scan") and subgraphs(node):
                self.flatten_loop(scope, index, node, name)
            else:
                self.flatten_node(scope, node, name)

    def unused_and_unsized(self, scope: _Scope, name: str) -> bool:
        """Whether a node's output is read by no node and returned by no graph, and cannot
        be sized: it is left out, as a runtime skips an unused optional output."""
        shape = self.shape_of(scope.inferred.types.get(name))
        return (
            name not in scope.read
            and name not in scope.returned
            and (shape is None or not _known(shape[1]))
        )

    def flatten_node(self, scope: _Scope, node: Any, name: str) -> None:
        """A node without subgraphs: one op (its outputs views or in place as the module
        docstring says)."""
        node_inputs = [scope.flat(x) for x in node.input if x]
        node_outputs: list[str] = []
        for out in node.output:
            if not out or self.unused_and_unsized(scope, out):
                continue
            flat = self.define(scope, out)
            self.origin[flat] = (scope, node)
            node_outputs.append(flat)
        for flat in node_outputs:
            t = self.activation(flat)
            if node.op_type in VIEW_OPS and node_inputs:
                t.view_of = node_inputs[0]
            self.tensors[flat] = t
        inplace: dict[str, str] = {}
        info = self.info
        if node.op_type in INPLACE_OPS and node_inputs and node_outputs:
            first, out = node_inputs[0], node_outputs[0]
            if first in info and out in info and info[first][1] == info[out][1]:
                inplace[out] = first
        self.ops.append(Op(name, node_inputs, node_outputs, inplace))

    def child(self, scope: _Scope, index: int, node: Any, attr: str, name: str) -> _Scope:
        """The scope of a control-flow node's subgraph `attr`: its values are named
        `{op}/{then|else|body}/{value}`."""
        tag = {"then_branch": "then", "else_branch": "else"}.get(attr, attr)
        graph = dict(subgraphs(node))[attr]
        inferred = scope.inferred.scopes.get((index, attr))
        if inferred is None:  # pragma: no cover - every If, Loop and Scan subgraph is inferred
            raise GraphError(f"{self.label}: node {node_label(node, index)} was not inferred")
        return _Scope(graph, inferred, scope, f"{name}/{tag}/")

    def movable(self, flat: str, made: set[str]) -> bool:
        """Whether a tensor that an op in a subgraph computes (`made`: the tensors the
        subgraph's ops write) may be placed in another tensor's memory: it owns its memory,
        is no weight and has no other role yet."""
        t = self.tensors[flat]
        return flat in made and flat not in self.claimed and not t.weight and t.view_of is None

    def flatten_if(self, scope: _Scope, index: int, node: Any, name: str) -> None:
        """An `If`: an op that reads the condition, the then-branch's ops, the else-branch's
        ops, and a join that writes the node's outputs. Only one branch runs, so the branches'
        values may share memory. Each output lives in one tensor of a branch (its *home*),
        sized for the larger branch; the other branch's value is placed there too when its
        branch computes it, or else is copied there at the join."""
        where = f"node {node_label(node, index)}{scope.inferred.where}"
        if not node.input or not node.input[0]:
            raise GraphError(f"{self.label}: {where} has no condition")
        self.ops.append(Op(name, [scope.flat(node.input[0])], []))
        sides: list[tuple[set[str], list[str]]] = []
        for attr in SUBGRAPH_ATTRIBUTES["If"]:
            branch = self.child(scope, index, node, attr, name)
            start = len(self.ops)
            self.run(branch)
            made = {o for op in self.ops[start:] for o in op.outputs}
            outs = [branch.flat(v.name) for v in branch.graph.output]
            if len(outs) != len(node.output):
                raise GraphError(
                    f"{self.label}: {where} has {len(node.output)} outputs and its {attr} "
                    f"returns {len(outs)}"
                )
            for out in outs:
                self.need_tensor(out)
            sides.append((made, outs))
        (then_made, then_outs), (else_made, else_outs) = sides
        outputs: list[str] = []
        homes: dict[str, str] = {}
        # The outputs without a home: (position among the outputs, output, then, else).
        own: list[tuple[int, str, str, str]] = []
        for out, t, e in zip(node.output, then_outs, else_outs, strict=True):
            if not out:
                continue
            flat = self.define(scope, out)
            self.origin[flat] = (scope, node)
            self.need_tensor(flat)
            size = max(self.tensors[t].size, self.tensors[e].size)
            then_root, else_root = self.root(t), self.root(e)
            home: str | None = None
            if self.movable(then_root, then_made):
                home = then_root
                if else_root != home and self.movable(else_root, else_made):
                    # The else-branch writes its value where the then-branch would have: that
                    # memory is reserved from the then-branch on, and holds nothing when the
                    # else-branch runs.
                    self.tensors[else_root].view_of = home
                    self.claimed.add(else_root)
                    size = max(size, self.tensors[else_root].size)
            elif self.movable(else_root, else_made):
                home = else_root
            if home is not None:
                self.claimed.add(home)
                self.tensors[home].size = max(self.tensors[home].size, size)
                self.tensors[flat] = Tensor(flat, size, view_of=home)
                homes[flat] = home
            else:
                self.tensors[flat] = Tensor(flat, size)
                own.append((len(outputs), flat, t, e))
            outputs.append(flat)
        inplace = self.join_inplace(list(node.output), then_outs, else_outs, homes, own)
        join = self.op_name(f"{name}/join")
        self.ops.append(Op(join, list(dict.fromkeys([*then_outs, *else_outs])), outputs, inplace))

    def join_inplace(
        self,
        names: list[str],
        then_outs: list[str],
        else_outs: list[str],
        homes: dict[str, str],
        own: list[tuple[int, str, str, str]],
    ) -> dict[str, str]:
        """The in-place pairs of an `If`'s join for its outputs without a home. `names`: the
        node's outputs (an empty name is an output not taken, which nothing copies);
        `then_outs`, `else_outs`: the branches' values; `homes`: output -> home; `own`: the
        other outputs (position among the outputs taken, output, then-value, else-value).

        At the join the runtime copies, in any order, each output's value in the branch taken
        to the output's address unless it is there already. An output may take the memory of
        one of its two values (a tensor `r`, up its chain of views) only where no copy of
        another output can read or write `r` in a branch where the output's own copy runs:

        * `r` is no other output's home and no other output's in-place value (two outputs in
          one tensor would both be written there);
        * in each branch where the output's value is not (a view of) `r`, so that its copy
          writes `r`, no other output's value in that branch lies in `r`.

        Every output then ends with its branch's value, whatever the order of the copies,
        outputs that nothing reads included (the runtime copies them as well). The lifetime
        rules decide, as for any in-place op, whether the output takes that memory."""
        sides = [
            [self.root(x) for x, out in zip(outs, names, strict=True) if out]
            for outs in (then_outs, else_outs)
        ]
        taken = set(homes.values())
        inplace: dict[str, str] = {}
        for k, flat, t, e in own:
            size = self.tensors[flat].size
            for value in dict.fromkeys((t, e)):
                r = self.root(value)
                if r in taken or self.tensors[value].size < size:
                    continue
                if any(side[k] != r and r in side[:k] + side[k + 1 :] for side in sides):
                    continue
                inplace[flat] = value
                taken.add(r)
                break
        return inplace

    def flatten_loop(self, scope: _Scope, index: int, node: Any, name: str) -> None:
        """A `Loop` or a `Scan`: an op that begins the loop, the body's ops once (every
        iteration runs them at the same addresses), and an op that ends the loop.

        The begin op writes the body's inputs (the iteration number and condition of a
        `Loop`, the carried values, a `Scan`'s slices: the runtime writes them before every
        iteration) and the scan outputs (filled one slice per iteration). The end op reads what
        must last through every iteration: the carried values' buffers, the scan outputs, the
        values of enclosing graphs that the body reads, a `Scan`'s inputs, and the body's
        results that the runtime copies at the end of an iteration; it writes the loop's final
        carried values, in place of the carried values' buffers where the lifetime rules
        allow."""
        is_loop = node.op_type == "Loop"
        where = f"node {node_label(node, index)}{scope.inferred.where}"
        body = self.child(scope, index, node, "body", name)
        b_in = [v.name for v in body.graph.input]
        b_out = [v.name for v in body.graph.output]
        if is_loop:
            n_states = max(len(node.input) - 2, 0)
            first_in, first_out = 2, 1
            scan_inputs: list[str] = []
        else:
            attrs = {a.name: a for a in node.attribute}
            n_scan = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
            n_states = len(node.input) - n_scan
            first_in, first_out = 0, 0
            scan_inputs = [scope.flat(x) for x in node.input[n_states:] if x]
        n_scans = len(b_out) - first_out - n_states
        if (
            len(b_in) != first_in + n_states + len(scan_inputs)
            or n_scans < 0
            or len(node.output) > n_states + n_scans
        ):
            raise GraphError(
                f"{self.label}: {where} has {len(node.input)} inputs and {len(node.output)} "
                f"outputs, and its body {len(b_in)} inputs and {len(b_out)} outputs, which do "
                f"not match as a {node.op_type} needs"
            )
        initial: list[str] = []
        for x in node.input[first_in : first_in + n_states]:
            if not x:
                raise GraphError(f"{self.label}: {where} has no initial value for a carried value")
            initial.append(scope.flat(x))
        begin_outputs = [self.define(body, x) for x in b_in]
        for flat in begin_outputs:
            self.tensors[flat] = self.activation(flat)
        states = begin_outputs[first_in : first_in + n_states]
        begin = Op(
            name,
            list(dict.fromkeys(scope.flat(x) for x in node.input if x)),
            begin_outputs,
            dict(zip(states, initial, strict=True)),
        )
        self.ops.append(begin)
        start = len(self.ops)
        self.run(body)
        cond = body.flat(b_out[0]) if is_loop else None
        news = [body.flat(x) for x in b_out[first_out : first_out + n_states]]
        per_iteration = [body.flat(x) for x in b_out[first_out + n_states :]]
        for flat in [*news, *per_iteration]:
            self.need_tensor(flat)
        for j, (state, new) in enumerate(zip(states, news, strict=True)):
            self.check_carried(where, b_in[first_in + j], state, new)
        finals: dict[str, str] = {}
        for state, out in zip(states, node.output, strict=False):
            if out:
                flat = self.define(scope, out)
                self.origin[flat] = (scope, node)
                self.need_tensor(flat)
                self.tensors[flat] = Tensor(flat, self.tensors[state].size)
                finals[flat] = state
        trip = scope.inferred.trips.get(index)
        scanned: list[str] = []
        for k, out in enumerate(node.output[n_states:]):
            if not out:
                continue
            flat = self.define(scope, out)
            self.origin[flat] = (scope, node)
            self.need_tensor(flat)
            if trip is None:
                raise self.unknown_trip(scope, node, where, flat, node.input[n_states:])
            per = self.tensors[per_iteration[k]].size
            if max(trip, 0) * per > MAX_DIM:
                raise GraphError(
                    f"{self.label}: scan output {self.named[flat]} of {where} would take {trip:,} "
                    f"iterations x {per:,} bytes, more than 2^63 - 1 bytes; the loop's trip "
                    "count is too large to plan it (a loop that stops on its condition needs a "
                    "trip count that bounds it)"
                )
            self.tensors[flat] = Tensor(flat, max(trip, 0) * per)
            scanned.append(flat)
        begin.outputs.extend(scanned)
        # A scan output nobody takes is not collected: its slices need not last.
        collected = [
            x for x, out in zip(per_iteration, node.output[n_states:], strict=False) if out
        ]
        end_reads = [x for x in [cond, *collected] if x is not None]
        self.place_new_values(states, news, set(begin.outputs), start, end_reads)
        sources = self.order_copies(body, states, news, b_in[first_in : first_in + n_states])
        made = set(begin.outputs) | {o for op in self.ops[start:] for o in op.outputs}
        outer = [
            x
            for op in self.ops[start:]
            for x in op.inputs
            if x not in made and not self.tensors[x].weight
        ]
        keep = [*states, *end_reads, *sources, *scanned, *scan_inputs, *outer]
        end = Op(self.op_name(f"{name}/end"), list(dict.fromkeys(keep)), list(finals), finals)
        self.ops.append(end)

    def check_carried(self, where: str, name: str, state: str, new: str) -> None:
        """Refuse a carried value whose shape or type changes between iterations: its buffer
        must hold it in every one."""
        entered, returned = self.info.get(state), self.info.get(new)
        if entered == returned and self.tensors[state].size == self.tensors[new].size:
            return

        def text(found: tuple[int, list[int | str | None]] | None, size: int) -> str:
            if found is None:
                return f"{size:,} bytes"
            dims = " x ".join("?" if d is None else str(d) for d in found[1]) or "scalar"
            return f"{dims} of {_elem_type_name(self.onnx, found[0])}"

        raise GraphError(
            f"{self.label}: the loop-carried value {shown(name)} of {where} enters the body as "
            f"{text(entered, self.tensors[state].size)} and an iteration returns it as "
            f"{text(returned, self.tensors[new].size)} ({self.named[new]}); a static plan needs "
            "the same shape and type in every iteration"
        )

    def place_new_values(
        self, states: list[str], news: list[str], inputs: set[str], start: int, end_reads: list[str]
    ) -> None:
        """Put each carried value's new value, when the body computes it after every read of
        the old one, in the carried value's buffer (a view of it): the runtime then has
        nothing to copy at the end of an iteration. `inputs`: what the begin op writes;
        `start`: the body's first op; `end_reads`: the other body results the end of an
        iteration reads (the condition, the scan outputs' slices)."""
        producer = {o: k for k in range(start, len(self.ops)) for o in self.ops[k].outputs}
        for j, (state, new) in enumerate(zip(states, news, strict=True)):
            r = self.root(new)
            if r == state or r not in producer or r in inputs or r in self.claimed:
                continue
            t = self.tensors[r]
            if t.weight or t.size > self.tensors[state].size:
                continue
            # The old value is read at the end of the iteration when a result copied then is
            # (a view of) it.
            others = [x for i, x in enumerate(news) if i != j] + end_reads
            if any(self.root(x) == state for x in others):
                continue
            at = producer[r]
            last = max(
                (
                    k
                    for k in range(start, len(self.ops))
                    if any(self.root(x) == state for x in self.ops[k].inputs)
                ),
                default=-1,
            )
            # An element-wise op may write the new value over the old one it reads (in place).
            src = self.ops[at].inplace.get(r)
            if last > at or (last == at and (src is None or self.root(src) != state)):
                continue
            t.view_of = state
            self.claimed.add(r)

    def order_copies(
        self, body: _Scope, states: list[str], news: list[str], names: list[str]
    ) -> list[str]:
        """The values the end of an iteration copies into the carried values' buffers, one
        after the other in the order of the carried values. A new value that lies in the
        buffer of a carried value copied before it (a swap: `a, b = b, a`) is first copied to
        a buffer of its own, `{body prefix}{carried value}@next`, by an op of that name at the
        end of the body."""
        writes = [self.root(n) != s for s, n in zip(states, news, strict=True)]
        sources = list(news)
        for i, new in enumerate(news):
            r = self.root(new)
            if not writes[i] or not any(writes[j] and r == states[j] for j in range(i)):
                continue
            flat = f"{body.prefix}{names[i]}@next"
            if flat in self.taken:
                flat = next(
                    f"{flat}#{k}" for k in itertools.count(2) if f"{flat}#{k}" not in self.taken
                )
            self.taken.add(flat)
            self.named[flat] = f"{shown(names[i])} (its next value){body.inferred.where}"
            self.tensors[flat] = Tensor(flat, self.tensors[new].size)
            if new in self.info:
                self.info[flat] = self.info[new]
            self.ops.append(Op(self.op_name(flat), [new], [flat]))
            sources[i] = flat
        return sources

    def unknown_trip(
        self, scope: _Scope, node: Any, where: str, output: str, scanned: Iterable[str]
    ) -> GraphError:
        """The error for a scan output of a loop whose trip count is not known: what it
        depends on, and how to bind it (`scanned`: a `Scan`'s scan inputs)."""
        head = (
            f"{self.label}: scan output {self.named[output]} of {where} has no size: it holds "
            "one slice per iteration, and "
        )
        if node.op_type == "Scan":
            lengths = []
            for name in [v for v in scanned if v]:
                found = self.info.get(scope.flat(name))
                lengths.append(f"{shown(name)} {' x '.join(map(str, found[1])) if found else '?'}")
            return GraphError(
                head + "the scan inputs do not give one length along their scan axes "
                f"({', '.join(lengths)})"
            )
        if not node.input or not node.input[0]:
            return GraphError(
                head + "the loop has no trip count M (it runs until its condition is false); "
                "give it an M to plan its scan outputs"
            )
        count = node.input[0]
        values, data = self.inputs_behind(scope.flat(count))
        scalars = sorted(values - set(self.bound))
        if scalars:
            hint = (
                f"bind the value of {', '.join(map(repr, scalars))} (command line: "
                f"{' '.join('--dim ' + shlex.quote(f'{d}=N') for d in scalars)}; Python: dims="
                f"{{{', '.join(f'{d!r}: N' for d in scalars)}}})"
            )
        elif data:
            hint = (
                f"it is computed from the data of {', '.join(map(repr, sorted(data)))}, which "
                "planning cannot know; make M a constant, a value computed from the inputs' "
                "shapes (bind their dimensions with dims=... / --dim), or an integer scalar "
                "input (bind its value with --dim NAME=N)"
            )
        else:
            hint = (
                "it depends on values computed at run time, which planning cannot know; make M "
                "a constant, a value computed from the inputs' shapes (bind their dimensions "
                "with dims=... / --dim), or an integer scalar input (bind its value with "
                "--dim NAME=N)"
            )
        return GraphError(
            head + f"its trip count M ({self.named[scope.flat(count)]}) is not known when "
            f"planning: {hint}"
        )

    def inputs_behind(self, flat: str) -> tuple[set[str], set[str]]:
        """The graph inputs a value is computed from: the integer scalars whose value `dims`
        may give, and the others."""
        values: set[str] = set()
        data: set[str] = set()
        seen: set[str] = set()
        pending = [flat]
        while pending:
            x = pending.pop()
            if x in seen:
                continue
            seen.add(x)
            if x in self.graph_inputs:
                (values if x in self.scalar_inputs else data).add(x)
            elif x in self.origin:
                scope, node = self.origin[x]
                for name in node_reads(node):
                    try:
                        pending.append(scope.flat(name))
                    except GraphError:
                        continue
        return values, data
