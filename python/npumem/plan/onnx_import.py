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
* control flow (`If`, `Loop`, `Scan`) and values that are not tensors (sequences, maps) are
  refused;
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
from collections.abc import Iterable, Mapping
from typing import Any

from npumem._shown import shown
from npumem.errors import MissingDependencyError
from npumem.plan.errors import GraphError
from npumem.plan.graph import Graph, Op, Tensor
from npumem.plan.inputs import content_kind, path_argument, read_input
from npumem.plan.onnx_shapes import FOLD_LIMIT, infer_types, node_label

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

CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


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
    if not any((n.domain, n.op_type) in local for n in proto.graph.node):
        return proto
    try:
        import onnx.inliner

        return onnx.inliner.inline_local_functions(proto)
    except Exception as exc:
        raise GraphError(f"{label}: could not inline the model's local functions ({exc})") from exc


def _small_external_tensors(onnx: Any, proto: Any) -> list[Any]:
    """The initializers and `Constant` values of the main graph stored as external data that
    have at most `FOLD_LIMIT` elements."""
    tensors = list(proto.graph.initializer)
    for node in proto.graph.node:
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
    """The names of the symbolic dimensions declared in a graph's inputs, outputs and
    value infos (those `dims` can bind)."""
    names: set[str] = set()
    for value_info in [*graph.input, *graph.output, *graph.value_info]:
        t = value_info.type
        if t.HasField("tensor_type") and t.tensor_type.HasField("shape"):
            names.update(d.dim_param for d in t.tensor_type.shape.dim if d.dim_param)
    return names


def _named_once(names: Iterable[str], label: str, twice: str) -> set[str]:
    """The set of `names`; a name given twice is a `GraphError` saying `twice` (formatted with
    the name)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise GraphError(
                f"{label}: {twice.format(shown(name))} (each tensor name may be given once)"
            )
        seen.add(name)
    return seen


def _check_structure(graph: Any, label: str) -> None:
    """Refuse, before shape inference, a graph whose tensors are not each written once (by a
    node, as a graph input or as an initializer), that reads a tensor nothing writes, or that
    has a cycle; each message names the tensor and a node."""
    initializers = _named_once(
        (init.name for init in graph.initializer), label, "two initializers are named {}"
    )
    inputs = _named_once((v.name for v in graph.input), label, "graph input {} is declared twice")
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            where = f"node {node_label(node, i)}"
            if out in producer:
                first = producer[out]
                by = (
                    "twice by that node"
                    if first == i
                    else f"by node {node_label(graph.node[first], first)} and by {where}"
                )
                raise GraphError(
                    f"{label}: tensor {shown(out)} is written {by} (a tensor is written once)"
                )
            for kind, names in (("an initializer", initializers), ("a graph input", inputs)):
                if out in names:
                    raise GraphError(
                        f"{label}: {where} writes tensor {shown(out)}, which is {kind} (a tensor "
                        "is "
                        "written once: rename the node's output)"
                    )
            producer[out] = i
    available = initializers | inputs
    for i, node in enumerate(graph.node):
        for x in node.input:
            if x and x not in producer and x not in available:
                raise GraphError(
                    f"{label}: node {node_label(node, i)} reads tensor {shown(x)}, which has no "
                    "producer: no node writes it, and it is neither a graph input nor an "
                    "initializer"
                )
    for value_info in graph.output:
        name = value_info.name
        if name not in producer and name not in available:
            raise GraphError(
                f"{label}: graph output {shown(name)} has no producer: no node writes it, and it "
                "is neither a graph input nor an initializer"
            )
    cycle = _cycle(graph.node, producer)
    if cycle is not None:
        node = graph.node[cycle]
        raise GraphError(
            f"{label}: the graph has a cycle: node {node_label(node, cycle)} depends, through "
            "the tensors it reads, on its own output"
        )


def _cycle(nodes: Any, producer: dict[str, int]) -> int | None:
    """The position of a node on a cycle of `nodes` (edges from each tensor's producer to its
    readers), or None when there is none."""
    waiting = [0] * len(nodes)
    readers: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        for before in {producer[x] for x in node.input if x in producer}:
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
        at = min(producer[x] for x in nodes[at].input if x in producer and producer[x] in left)
    return at


def graph_from_onnx(
    model: object, *, dims: Mapping[str, int] | None = None, label: str | None = None
) -> Graph:
    """Our graph of an ONNX model: a path or an `onnx.ModelProto`; `dims` binds symbolic
    dimensions by name (each must be one of the model's); `label` names the model in errors
    (default: the path, or the graph's name)."""
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
    unknown = sorted(set(dims) - _symbolic_dims(proto.graph))
    if unknown:
        known = sorted(_symbolic_dims(proto.graph))
        raise GraphError(
            f"{label}: the model has no symbolic dimension {', '.join(map(repr, unknown))} to "
            f"bind (dims, --dim); its symbolic dimensions: "
            f"{', '.join(map(repr, known)) if known else 'none'}"
        )
    graph = proto.graph
    for i, node in enumerate(graph.node):
        if node.op_type in CONTROL_FLOW:
            raise GraphError(
                f"{label}: node {node_label(node, i)} is {node.op_type}: control flow "
                "(subgraphs) is not supported"
            )
    _check_structure(graph, label)
    # Bind symbolic dimensions everywhere they are declared, then infer the rest.
    for value_info in [*graph.input, *graph.output, *graph.value_info]:
        t = value_info.type
        if t.HasField("tensor_type") and t.tensor_type.HasField("shape"):
            for dim in t.tensor_type.shape.dim:
                if dim.HasField("dim_param") and dim.dim_param in dims:
                    dim.dim_value = dims[dim.dim_param]
    bindable = _symbolic_dims(graph)
    try:
        inferred = infer_types(onnx, proto)
    except Exception as exc:
        raise GraphError(f"{label}: ONNX shape inference failed ({exc})") from exc

    info: dict[str, tuple[int, list[int | str | None]]] = {}
    not_tensors: dict[str, str] = {}  # name -> the kind of value (sequence, map, ...)
    for name, t in inferred.types.items():
        kind = t.WhichOneof("value")
        if kind is None:  # an empty type: nothing is known of the value
            continue
        if kind != "tensor_type":
            not_tensors[name] = kind.replace("_type", "")
            continue
        shape: list[int | str | None] = []
        if t.tensor_type.HasField("shape"):
            for dim in t.tensor_type.shape.dim:
                if dim.HasField("dim_value"):
                    shape.append(dim.dim_value)
                elif dim.dim_param in bindable:  # a dimension the user can bind
                    shape.append(dims.get(dim.dim_param, dim.dim_param))
                else:  # unnamed, or named by shape inference (unk__0): not bindable
                    shape.append(None)
        else:
            shape = [None]
        info[name] = (t.tensor_type.elem_type, shape)
    sub_byte = _sub_byte_bits()

    def size_of(name: str, elem_type: int, shape: list[int]) -> int:
        negative = [d for d in shape if d < 0]
        if negative:
            raise GraphError(
                f"{label}: tensor {shown(name)} has a negative dimension {negative[0]} (shape "
                f"{' x '.join(map(str, shape))})"
            )
        bits = sub_byte.get(elem_type)
        if bits is not None:  # packed several to a byte
            return -(-math.prod(shape) * bits // 8)
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        except Exception:
            dtype = None
        if dtype is None or dtype.kind == "O":  # strings: no fixed size
            raise GraphError(
                f"{label}: tensor {shown(name)} has element type "
                f"{_elem_type_name(onnx, elem_type)}, which has no fixed size"
            )
        return math.prod(shape) * int(dtype.itemsize)

    tensors: dict[str, Tensor] = {}
    for init in graph.initializer:
        size = size_of(init.name, init.data_type, list(init.dims))
        tensors[init.name] = Tensor(init.name, size, weight=True)

    def activation(name: str) -> Tensor:
        if name in not_tensors:
            raise GraphError(
                f"{label}: value {shown(name)} is a {not_tensors[name]}, not a tensor: only "
                "tensors "
                "can be planned"
            )
        sized = name in info and _known(info[name][1])
        if name in inferred.no_inference and not sized:
            node, reason = inferred.no_inference[name]
            raise GraphError(
                f"{label}: tensor {shown(name)} has no known shape: node {node} has no ONNX shape "
                f"inference{f' ({reason})' if reason else ''}; declare the shape of {shown(name)} "
                "in the model's value_info"
            )
        if name in inferred.failed and not sized:
            failure = inferred.failed[name]
            if failure.broadcast:
                raise GraphError(
                    f"{label}: tensor {shown(name)} has no shape: the dimensions of the inputs of "
                    f"node {failure.node} do not broadcast together ({failure.inputs}); check "
                    "the values bound to the model's dimensions (dims, --dim)"
                )
            raise GraphError(
                f"{label}: tensor {shown(name)} has no shape: ONNX shape inference of node "
                f"{failure.node} fails on its inputs ({failure.inputs}): {failure.error}"
            )
        if name not in info:
            if name in graph_inputs:
                raise GraphError(
                    f"{label}: graph input {shown(name)} has no type; declare its element type and "
                    "shape in the model's inputs"
                )
            raise GraphError(
                f"{label}: shape inference gave no shape for tensor {shown(name)}; the model may "
                "need its input shapes bound (dims=...) or a newer opset"
            )
        elem_type, shape = info[name]
        unknown = [d for d in shape if not isinstance(d, int)]
        if unknown:
            named = sorted({d for d in unknown if isinstance(d, str)})
            hint = (
                f"; bind {', '.join(map(repr, named))} (command line: "
                f"{' '.join('--dim ' + shlex.quote(f'{d}=1') for d in named)}; Python: dims="
                f"{{{', '.join(f'{d!r}: 1' for d in named)}}})"
                if named
                else " (the model does not give it: name the dimension in the model to bind it)"
                if name in graph_inputs
                else " (not inferable: it may depend on the data; declare it in the model's "
                "value_info, with a named dimension to bind)"
            )
            shape_text = " x ".join("?" if d is None else str(d) for d in shape)
            raise GraphError(
                f"{label}: tensor {shown(name)} has an unknown shape {shape_text}{hint}"
            )
        return Tensor(name, size_of(name, elem_type, [d for d in shape if isinstance(d, int)]))

    inputs = [v.name for v in graph.input if v.name not in tensors]
    graph_inputs = set(inputs)
    for name in inputs:
        tensors[name] = activation(name)
    read = {x for node in graph.node for x in node.input if x}
    returned = {v.name for v in graph.output}

    def unused_and_unsized(name: str) -> bool:
        return (
            name not in read
            and name not in returned
            and (name not in info or not _known(info[name][1]))
        )

    ops: list[Op] = []
    op_names: set[str] = set()
    for i, node in enumerate(graph.node):
        # Node names are optional and need not be unique in ONNX: make each one unique.
        op_name = node.name or f"{node.op_type}_{i}"
        if op_name in op_names:
            op_name = next(
                f"{op_name}#{k}" for k in itertools.count(2) if f"{op_name}#{k}" not in op_names
            )
        op_names.add(op_name)
        if node.op_type == "Constant":
            for out in node.output:
                t = activation(out)
                tensors[out] = Tensor(out, t.size, weight=True)
            continue
        node_inputs = [x for x in node.input if x]
        node_outputs = [x for x in node.output if x and not unused_and_unsized(x)]
        for out in node_outputs:
            t = activation(out)
            if node.op_type in VIEW_OPS and node_inputs:
                t.view_of = node_inputs[0]
            tensors[out] = t
        inplace: dict[str, str] = {}
        if node.op_type in INPLACE_OPS and node_inputs and node_outputs:
            first, out = node_inputs[0], node_outputs[0]
            if first in info and out in info and info[first][1] == info[out][1]:
                inplace[out] = first
        ops.append(Op(op_name, node_inputs, node_outputs, inplace))
    outputs = [v.name for v in graph.output]
    try:
        return Graph.build(graph.name or label, tensors.values(), ops, inputs, outputs)
    except GraphError as exc:
        raise GraphError(f"{label}: {exc}") from None
