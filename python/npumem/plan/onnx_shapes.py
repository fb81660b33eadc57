"""The types and shapes of an ONNX model's values, as a runtime would compute them.

`infer_types()` runs ONNX shape inference on the model without its declared `value_info` and
output shapes (a declaration that contradicts what an op computes, such as a stale shape left
by graph surgery, must not shrink a buffer), then, when some value is still unsized, walks the
nodes in order:

* it folds shape computations into values (`Shape`, `Gather`, `Concat`, `Slice`, `Range`,
  arithmetic, ... on small tensors, with the ONNX reference implementation), and infers each
  node again with those values, so that a `Reshape`, `Expand`, `ConstantOfShape` or `Resize`
  whose target shape is computed at run time from the input's shape is sized in every opset
  (ONNX's own data propagation covers only some ops and opsets);
* an op that has no shape inference (a custom domain) or whose inference cannot tell a shape
  keeps the shape the model declares for its outputs, when it declares one (in `value_info`
  and the graph's outputs: of two declarations the more specific, `merge_declared`; two that
  disagree are left out, `Inferred.conflicts`); for an output left unsized, `Inferred` tells
  why (no shape inference for the op, or its inference failed on inputs of known shapes, such
  as dimensions that do not broadcast);
* the subgraphs of `If`, `Loop` and `Scan` nodes are walked the same way, each in a scope of
  its own (`Inferred.scopes`) that reads the values of the scopes around it: a loop's body
  with its carried values typed as they enter the loop (ONNX drops their shapes, which may
  change between iterations; the importer checks that they do not), a `Scan`'s slices typed
  from its scan inputs. The node's outputs are then typed from the subgraphs': an `If`'s as
  what its branches have in common, a loop's scan outputs with the trip count (`Inferred.trips`)
  along the scan axis.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from npumem._shown import shown

__all__ = [
    "CONTROL_FLOW_OPS",
    "FOLD_LIMIT",
    "FOLD_OPS",
    "SUBGRAPH_ATTRIBUTES",
    "Failure",
    "Inferred",
    "complete",
    "declared_text",
    "defined_names",
    "dependency_order",
    "infer_types",
    "merge_declared",
    "node_label",
    "node_reads",
    "outer_reads",
    "subgraphs",
]

FOLD_OPS = frozenset(
    {
        "Constant", "Shape", "Size", "Gather", "GatherElements", "Unsqueeze", "Squeeze",
        "Concat", "Slice", "Split", "Cast", "CastLike", "Add", "Sub", "Mul", "Div", "Mod", "Neg",
        "Abs", "Sign", "Floor", "Ceil", "Round", "Sqrt", "Min", "Max", "Clip", "Equal", "Less",
        "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Where", "Range",
        "ConstantOfShape", "Reshape", "Flatten", "Identity", "Expand", "Tile", "Transpose",
        "ReduceProd", "ReduceSum", "ReduceMin", "ReduceMax", "ArgMax", "ArgMin", "CumSum",
    }
)  # fmt: skip
"""Ops whose outputs are computed while sizing the model, when all their inputs are known and
every input and output has at most `FOLD_LIMIT` elements (shape arithmetic)."""

FOLD_LIMIT = 1 << 16
"""The most elements of a value computed while sizing the model."""


def node_label(node: Any, index: int) -> str:
    """How messages name a node: `'name' (OpType)`, or by its position in the graph's node
    list when it has no name (`#12 (LayerNormalization)`); a custom domain is written before
    the op type (`com.microsoft::FusedMatMul`)."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    op = f"{domain}::{node.op_type}" if domain else node.op_type
    return f"{shown(node.name)} ({op})" if node.name else f"#{index} ({op})"


@dataclass(slots=True)
class Failure:
    """An op's shape inference that failed on inputs whose shapes are all known."""

    node: str
    """The node, as `node_label` names it."""
    error: str
    """What ONNX shape inference said (one line)."""
    inputs: str
    """The node's inputs and their shapes (`'x' 2 x 64, 'a' 2 x 30`)."""

    @property
    def broadcast(self) -> bool:
        """Whether the inference failed because dimensions do not match (broadcasting,
        matrix products)."""
        return "incompatible dimensions" in self.error.lower() or "broadcast" in self.error.lower()


CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
"""The control-flow ops of the default domain whose subgraphs are inferred and planned."""

SUBGRAPH_ATTRIBUTES = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
"""The graph attributes of each control-flow op, in the order they are planned."""


def subgraphs(node: Any) -> list[tuple[str, Any]]:
    """A node's graph-valued attributes, as (attribute name, `GraphProto`)."""
    found = [(a.name, a.g) for a in node.attribute if a.HasField("g")]
    found += [(a.name, g) for a in node.attribute for g in a.graphs]
    return found


def defined_names(graph: Any) -> set[str]:
    """The names a graph defines: its inputs, initializers and node outputs."""
    names = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    names.update(o for node in graph.node for o in node.output if o)
    return names


def outer_reads(graph: Any) -> set[str]:
    """The names a (sub)graph reads but does not define: its references to enclosing scopes,
    those of its nested subgraphs included, and outputs passed through from outside."""
    reads = {v.name for v in graph.output}
    for node in graph.node:
        reads.update(x for x in node.input if x)
        for _, sub in subgraphs(node):
            reads |= outer_reads(sub)
    return reads - defined_names(graph)


def node_reads(node: Any) -> list[str]:
    """The names a node reads: its inputs, then, for a node with subgraphs, the names of
    enclosing scopes those subgraphs read (the node's implicit inputs)."""
    reads = [x for x in node.input if x]
    implicit: set[str] = set()
    for _, sub in subgraphs(node):
        implicit |= outer_reads(sub)
    return reads + sorted(implicit - set(reads))


@dataclass(slots=True, eq=False)
class Inferred:
    """What is known of the values of one graph (the model's, or a subgraph of it).

    `types`: the type of every value defined here that could be typed; for each value left
    unsized because its op has no shape inference, the op (as `node_label` names it) and why
    ('' when there is no more to say); for each value left unsized because its op's inference
    failed on inputs of known shapes, the `Failure`. `scopes` holds the same for the subgraphs
    of the control-flow nodes, which read the values of the scopes around them."""

    types: dict[str, Any]
    no_inference: dict[str, tuple[str, str]] = field(default_factory=dict)
    failed: dict[str, Failure] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    """Small values computed while sizing (shape arithmetic, bound inputs), as numpy arrays."""
    scopes: dict[tuple[int, str], Inferred] = field(default_factory=dict)
    """The subgraphs of this graph's nodes, by the node's position and the attribute's name."""
    trips: dict[int, int | None] = field(default_factory=dict)
    """The trip count of each `Loop` and `Scan` node, by position (None: not known)."""
    graph: Any = None
    """The `GraphProto` (as the model has it, not the copy shape inference ran on)."""
    parent: Inferred | None = None
    where: str = ""
    """'' for the model's graph; for a subgraph, where it lies (` in the body of node 'loop'
    (Loop)`), as messages append it to a node or a tensor."""
    declared: dict[str, Any] = field(default_factory=dict)
    """The types the graph declares (value_info, outputs): for a value declared in both, the
    more specific of the two, dimension by dimension (`merge_declared`)."""
    conflicts: dict[str, str] = field(default_factory=dict)
    """The values the graph declares twice with types that disagree (another element type,
    rank or known dimension), left out of `declared`: what the two declarations say, for a
    message (`the value_info declares float 2 x 6, the outputs float 2 x 7`)."""
    defined: set[str] = field(default_factory=set)
    initializers: dict[str, Any] = field(default_factory=dict)
    """The graph's initializers by name (built once: sizing looks values up node by node)."""

    def owner(self, name: str) -> Inferred | None:
        """The innermost scope, from this one outwards, that defines `name`."""
        scope: Inferred | None = self
        while scope is not None and name not in scope.defined:
            scope = scope.parent
        return scope

    def type_of(self, name: str) -> Any:
        """The inferred type of `name`, looked up by lexical scope (None: unknown)."""
        scope = self.owner(name)
        return None if scope is None else scope.types.get(name)

    def best(self, name: str) -> Any:
        """The inferred type of a value, or the declared one where inference cannot tell."""
        scope = self.owner(name)
        if scope is None:
            return None
        found = scope.types.get(name)
        return found if complete(found) or name not in scope.declared else scope.declared[name]

    def knows(self, name: str) -> bool:
        """Whether `name` has an inferred or a declared type."""
        scope = self.owner(name)
        return scope is not None and (name in scope.types or name in scope.declared)

    def value_of(self, onnx: Any, name: str) -> Any:
        """The value of `name` when it was computed while sizing or is a small initializer
        stored in the model (None otherwise)."""
        scope = self.owner(name)
        if scope is None:
            return None
        if name in scope.values:
            return scope.values[name]
        init = scope.initializers.get(name)
        if init is None:
            return None
        if init.data_location == onnx.TensorProto.EXTERNAL or math.prod(init.dims) > FOLD_LIMIT:
            return None
        try:
            scope.values[name] = onnx.numpy_helper.to_array(init)
        except Exception:
            return None
        return scope.values[name]


def complete(value_type: Any) -> bool:
    """Whether a `TypeProto` is a tensor of known element type and known dimensions (a value
    that is not a tensor counts as complete: nothing more can be inferred for it)."""
    if value_type is None:
        return False
    if not value_type.HasField("tensor_type"):
        return value_type.WhichOneof("value") is not None
    tensor = value_type.tensor_type
    return (
        tensor.elem_type != 0
        and tensor.HasField("shape")
        and all(d.HasField("dim_value") for d in tensor.shape.dim)
    )


def merge_declared(onnx: Any, first: Any, second: Any) -> Any:
    """One type from two declarations of a value (its value_info and its graph output entry),
    the more specific one dimension by dimension: a known element type, rank or dimension beats
    an unknown one (a named dimension beats an unnamed one). `None` when the two disagree: two
    known element types, ranks or dimensions that differ, or a tensor and a value of another
    kind."""
    kinds = (first.WhichOneof("value"), second.WhichOneof("value"))
    if kinds[1] is None:
        return first
    if kinds[0] is None:
        return second
    if kinds[0] != kinds[1]:
        return None
    if kinds[0] != "tensor_type":
        return first  # a sequence, a map, an optional: nothing to size, keep the first
    a, b = first.tensor_type, second.tensor_type
    if a.elem_type and b.elem_type and a.elem_type != b.elem_type:
        return None
    merged = onnx.TypeProto()
    merged.CopyFrom(first)
    out = merged.tensor_type
    out.elem_type = a.elem_type or b.elem_type
    if not b.HasField("shape"):
        return merged
    if not a.HasField("shape"):
        out.shape.CopyFrom(b.shape)
        return merged
    if len(a.shape.dim) != len(b.shape.dim):
        return None
    for mine, theirs in zip(out.shape.dim, b.shape.dim, strict=True):
        if mine.HasField("dim_value"):
            if theirs.HasField("dim_value") and theirs.dim_value != mine.dim_value:
                return None
        elif theirs.HasField("dim_value") or (
            theirs.HasField("dim_param") and not mine.HasField("dim_param")
        ):
            mine.CopyFrom(theirs)
    return merged


def declared_text(onnx: Any, value_type: Any) -> str:
    """A declared type for a message: a tensor's element type and shape (`float 2 x ?`,
    `float scalar`, `float of unknown rank`), or the kind of another value."""
    kind = value_type.WhichOneof("value")
    if kind != "tensor_type":
        return "no type" if kind is None else f"a {kind.replace('_type', '')}"
    tensor = value_type.tensor_type
    try:
        elem = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
    except ValueError:
        elem = f"element type {tensor.elem_type}"
    if not tensor.HasField("shape"):
        return f"{elem} of unknown rank"
    dims = [
        str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?"
        for d in tensor.shape.dim
    ]
    return f"{elem} {' x '.join(dims) if dims else 'scalar'}"


def _elements(value_type: Any) -> int:
    return math.prod(d.dim_value for d in value_type.tensor_type.shape.dim)


def infer_types(onnx: Any, proto: Any, values: Mapping[str, int] | None = None) -> Inferred:
    """The types of `proto`'s values (see the module docstring), its symbolic dimensions
    already bound; `values` gives graph inputs a value known when planning (an integer
    scalar, such as a loop's trip count). Raises what `onnx.shape_inference.infer_shapes`
    raises."""
    import numpy as np

    graph = proto.graph
    inferred = onnx.shape_inference.infer_shapes(
        _to_infer(onnx, proto), strict_mode=False, data_prop=False
    ).graph
    result = _scope(onnx, graph, inferred, None, "")
    inputs = {v.name: v for v in graph.input}
    for name, value in (values or {}).items():
        elem_type = inputs[name].type.tensor_type.elem_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        dims = [d.dim_value for d in inputs[name].type.tensor_type.shape.dim]
        result.values[name] = np.array(value, dtype).reshape(dims)
    has_subgraphs = any(subgraphs(node) for node in graph.node)
    if not has_subgraphs and all(
        complete(result.types.get(o)) for node in graph.node for o in node.output if o
    ):
        return result
    _walk(onnx, proto, result)
    return result


def _scope(onnx: Any, graph: Any, inferred: Any, parent: Inferred | None, where: str) -> Inferred:
    """What ONNX shape inference found for `graph` (its copy `inferred`, the same nodes in the
    same order), its subgraphs included."""
    defined = defined_names(graph)
    types: dict[str, Any] = {}
    for value_info in [*inferred.value_info, *inferred.output, *inferred.input]:
        # An empty type (a value declared by name only, which inference could not type) is no
        # type: the value is left to the walk below and, failing that, to the caller. A
        # subgraph's output may be a value of an enclosing scope: that scope types it.
        if (
            value_info.name in defined
            and value_info.HasField("type")
            and value_info.type.WhichOneof("value") is not None
        ):
            types[value_info.name] = value_info.type
    initializers: dict[str, Any] = {}
    for init in graph.initializer:
        initializers.setdefault(init.name, init)
        if init.name not in types:  # an initializer that is not a graph input (or IR < 4)
            types[init.name] = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
    declared: dict[str, Any] = {}
    conflicts: dict[str, str] = {}
    place: dict[str, str] = {}
    entries = [("value_info", v) for v in graph.value_info] + [("outputs", v) for v in graph.output]
    for kind, v in entries:
        if v.name not in defined or v.name in conflicts:
            continue
        if v.name not in declared:
            declared[v.name], place[v.name] = v.type, kind
            continue
        merged = merge_declared(onnx, declared[v.name], v.type)
        if merged is not None:
            declared[v.name] = merged
            continue
        # Two declarations that disagree: neither is used (see `Inferred.conflicts`).
        then = "and again" if kind == place[v.name] else f"the {kind}"
        conflicts[v.name] = (
            f"the {place[v.name]} declares {declared_text(onnx, declared.pop(v.name))}, "
            f"{then} {declared_text(onnx, v.type)}"
        )
    scope = Inferred(
        types,
        graph=graph,
        parent=parent,
        where=where,
        declared=declared,
        conflicts=conflicts,
        defined=defined,
        initializers=initializers,
    )
    for index, (node, copy) in enumerate(zip(graph.node, inferred.node, strict=True)):
        if node.op_type not in CONTROL_FLOW_OPS or node.domain not in ("", "ai.onnx"):
            continue
        copies = dict(subgraphs(copy))
        for attr, sub in subgraphs(node):
            if attr in copies:
                inner = f" in the {attr} of node {node_label(node, index)}{where}"
                scope.scopes[index, attr] = _scope(onnx, sub, copies[attr], scope, inner)
    return scope


def _to_infer(onnx: Any, proto: Any) -> Any:
    """The model that shape inference runs on: `proto` without its declared value infos and
    output types (in its subgraphs too), and with its large initializers (weights, whose values
    no shape depends on) turned into typed graph inputs, so that their data is neither copied
    nor read (it may be external, or more than a protobuf can hold)."""
    graph = proto.graph
    light = onnx.ModelProto()
    light.ir_version = max(proto.ir_version, 4)  # initializers need not be graph inputs
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    light.graph.name = graph.name
    light.graph.node.extend(graph.node)
    for node in light.graph.node:
        for _, sub in subgraphs(node):
            _forget_declarations(sub)
    light.graph.input.extend(graph.input)
    inputs = {v.name for v in graph.input}
    for value_info in graph.output:
        out = light.graph.output.add()
        out.name = value_info.name
        if value_info.name in inputs:
            out.type.CopyFrom(value_info.type)
    for init in graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL and math.prod(init.dims) <= FOLD_LIMIT:
            light.graph.initializer.append(init)
        elif init.name not in inputs:
            inputs.add(init.name)
            light.graph.input.append(
                onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    return light


def _forget_declarations(graph: Any) -> None:
    """Clear a subgraph's declared value infos and output types, its subgraphs' too (a stale
    declaration must not shrink a buffer); its inputs keep theirs."""
    del graph.value_info[:]
    for out in graph.output:
        out.ClearField("type")
    for node in graph.node:
        for _, sub in subgraphs(node):
            _forget_declarations(sub)


def _walk(onnx: Any, proto: Any, scope: Inferred) -> None:
    """Infer node by node, folding shape computations (see the module docstring), and the
    subgraphs of control-flow nodes with the values of the scopes around them."""
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    graph = scope.graph
    types = scope.types
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    default_opset = onnx.helper.make_opsetid("", opsets.get("", 1))

    def value(name: str) -> Any:
        return scope.value_of(onnx, name)

    for index, node in dependency_order(graph.node):
        outputs = [o for o in node.output if o]
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if subgraphs(node):
            if not domain and node.op_type in CONTROL_FLOW_OPS:
                _control_flow(onnx, proto, scope, index, node)
            continue  # another op with a subgraph is refused when the graph is built
        missing = [o for o in outputs if not complete(types.get(o))]
        if missing:
            schema = None
            if domain in opsets:
                try:
                    schema = onnx.defs.get_schema(node.op_type, opsets[domain], domain)
                except onnx.defs.SchemaError:
                    schema = None
            label = node_label(node, index) + scope.where
            if schema is None:
                why = (label, _no_schema_reason(onnx, node, domain, opsets))
                for o in missing:
                    scope.no_inference[o] = why
            elif all(scope.knows(x) for x in node.input if x):
                data = {}
                for x in node.input:
                    known = value(x) if x else None
                    if known is not None:
                        data[x] = onnx.numpy_helper.from_array(known, x)
                try:
                    found = onnx.shape_inference.infer_node_outputs(
                        schema,
                        node,
                        {x: scope.best(x) for x in node.input if x},
                        data,
                        opset_imports=list(proto.opset_import),
                        ir_version=proto.ir_version,
                    )
                except Exception as exc:
                    found = {}
                    # Only a failure on inputs that are all sized is this node's own: otherwise
                    # the cause lies before it, where an input was left unsized.
                    if all(complete(scope.best(x)) for x in node.input if x):
                        failure = Failure(
                            label,
                            " ".join(str(exc).split()),
                            ", ".join(
                                f"{shown(x)} {_shape_text(scope.best(x))}" for x in node.input if x
                            ),
                        )
                        for o in missing:
                            scope.failed[o] = failure
                for o, t in found.items():
                    if o in missing and (complete(t) or o not in types):
                        types[o] = t
            for o in missing:
                if not complete(types.get(o)) and complete(scope.declared.get(o)):
                    types[o] = scope.declared[o]
                    scope.no_inference.pop(o, None)
                    scope.failed.pop(o, None)
        if domain or node.op_type not in FOLD_OPS:
            continue
        if not all(
            complete(types.get(o))
            and types[o].HasField("tensor_type")
            and _elements(types[o]) <= FOLD_LIMIT
            for o in outputs
        ):
            continue
        computed: list[Any]
        if node.op_type in ("Shape", "Size"):
            source: Any = scope.type_of(node.input[0]) if node.input else None
            if not complete(source) or not source.HasField("tensor_type"):
                continue
            dims = [d.dim_value for d in source.tensor_type.shape.dim]
            if node.op_type == "Size":
                computed = [np.array(math.prod(dims), np.int64)]
            else:
                attrs = {a.name: a.i for a in node.attribute}
                computed = [np.array(dims[attrs.get("start", 0) : attrs.get("end")], np.int64)]
        elif node.op_type == "Constant":
            constant = _constant(onnx, node)
            if constant is None:
                continue
            computed = [constant]
        else:
            feeds = {x: value(x) for x in node.input if x}
            if any(v is None for v in feeds.values()):
                continue
            # The node runs inside a function so that it runs as the model's opset defines it
            # (a bare node would run as the newest opset does).
            function = onnx.helper.make_function(
                "npumem.fold", "fold", list(feeds), outputs, [node], [default_opset]
            )
            try:
                computed = list(ReferenceEvaluator(function).run(None, feeds, attributes={}))
            except Exception:
                continue
        for o, v in zip(outputs, computed, strict=False):
            if getattr(v, "size", FOLD_LIMIT + 1) <= FOLD_LIMIT:
                scope.values[o] = v


def _control_flow(onnx: Any, proto: Any, scope: Inferred, index: int, node: Any) -> None:
    """Infer the subgraphs of an `If`, `Loop` or `Scan` node, their inputs typed from the
    node's inputs, then the node's outputs from theirs. A loop's carried values are typed as
    they enter the loop: the body's outputs are checked against them when the graph is built.
    A `Loop`'s or `Scan`'s trip count goes to `scope.trips`."""
    helper = onnx.helper
    types = scope.types
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)

    def settle(name: str, found: Any) -> None:
        if name and found is not None and (complete(found) or not complete(types.get(name))):
            types[name] = found

    if node.op_type == "If":
        branches = [scope.scopes.get((index, a)) for a in SUBGRAPH_ATTRIBUTES["If"]]
        if None in branches:
            return
        for branch in branches:
            assert branch is not None
            _walk(onnx, proto, branch)
        then, other = branches
        assert then is not None and other is not None
        for i, out in enumerate(node.output):
            if i < len(then.graph.output) and i < len(other.graph.output):
                settle(
                    out,
                    _merged(
                        onnx,
                        then.best(then.graph.output[i].name),
                        other.best(other.graph.output[i].name),
                    ),
                )
        return
    body = scope.scopes.get((index, "body"))
    if body is None or (node.op_type == "Scan" and opset < 9):
        return  # Scan-8 (batched) is refused when the graph is built
    inputs = [v.name for v in body.graph.input]
    outputs = [v.name for v in body.graph.output]
    trip: int | None = None
    scan_axes: list[int] = []
    if node.op_type == "Loop":
        states = list(node.input[2:])
        first_state = 2
        body.types[inputs[0]] = helper.make_tensor_type_proto(onnx.TensorProto.INT64, [])
        if len(inputs) > 1:
            body.types[inputs[1]] = helper.make_tensor_type_proto(onnx.TensorProto.BOOL, [])
        if node.input and node.input[0]:
            count = scope.value_of(onnx, node.input[0])
            if count is not None and count.size == 1:
                trip = int(count.reshape(-1)[0])
    else:
        attrs = {a.name: a for a in node.attribute}
        scans = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
        states = list(node.input[: len(node.input) - scans])
        first_state = 0
        in_axes = list(attrs["scan_input_axes"].ints) if "scan_input_axes" in attrs else []
        out_axes = list(attrs["scan_output_axes"].ints) if "scan_output_axes" in attrs else []
        scan_axes = out_axes
        lengths: set[int | None] = set()
        for m, x in enumerate(node.input[len(states) :]):
            found = scope.best(x)
            slot = first_state + len(states) + m
            if not complete(found) or not found.HasField("tensor_type") or slot >= len(inputs):
                lengths.add(None)
                continue
            dims = [d.dim_value for d in found.tensor_type.shape.dim]
            axis = in_axes[m] if m < len(in_axes) else 0
            axis = axis + len(dims) if axis < 0 else axis
            if not 0 <= axis < len(dims):
                lengths.add(None)
                continue
            lengths.add(dims[axis])
            body.types[inputs[slot]] = helper.make_tensor_type_proto(
                found.tensor_type.elem_type, dims[:axis] + dims[axis + 1 :]
            )
        if len(lengths) == 1:
            trip = lengths.pop()
    for j, x in enumerate(states):
        if first_state + j >= len(inputs):
            continue
        name = inputs[first_state + j]
        found = scope.best(x) if x else None
        # The body's value_info, then the body's input, size a carried value whose type as it
        # enters the loop is not fully known (an initial value whose shape depends on the
        # branch taken); a declaration that disagrees with what is known is ignored.
        for declared in (body.declared.get(name), body.graph.input[first_state + j].type):
            if complete(found) or declared is None or declared.WhichOneof("value") is None:
                continue
            found = declared if found is None else merge_declared(onnx, found, declared) or found
        if found is not None:
            body.types[name] = found
    scope.trips[index] = trip
    _walk(onnx, proto, body)
    first_out = 1 if node.op_type == "Loop" else 0
    for j, out in enumerate(node.output[: len(states)]):
        slot = first_out + j
        if slot < len(outputs):
            entered = body.types.get(inputs[first_state + j])
            settle(out, _merged(onnx, entered, body.best(outputs[slot])))
    for k, out in enumerate(node.output[len(states) :]):
        slot = first_out + len(states) + k
        found = body.best(outputs[slot]) if slot < len(outputs) else None
        if found is None or not found.HasField("tensor_type"):
            settle(out, found)
            continue
        tensor = found.tensor_type
        scanned = helper.make_tensor_type_proto(tensor.elem_type, None)
        if tensor.HasField("shape"):
            dims = list(tensor.shape.dim)
            axis = scan_axes[k] if k < len(scan_axes) else 0
            axis = axis + len(dims) + 1 if axis < 0 else axis
            axis = min(max(axis, 0), len(dims))
            shape = scanned.tensor_type.shape
            shape.SetInParent()
            for d in [*dims[:axis], None, *dims[axis:]]:
                dim = shape.dim.add()
                if d is None:
                    if trip is not None:
                        dim.dim_value = trip
                else:
                    dim.CopyFrom(d)
        settle(out, scanned)


def _merged(onnx: Any, first: Any, second: Any) -> Any:
    """The type a value has when it is either `first` or `second` (None: unknown): the same
    type when they agree, else what they have in common (dimensions that differ unknown)."""
    if first is None or second is None:
        return None
    if not first.HasField("tensor_type") or not second.HasField("tensor_type"):
        return first if not first.HasField("tensor_type") else second
    if complete(first) and first == second:
        return first
    a, b = first.tensor_type, second.tensor_type
    merged = onnx.TypeProto()
    merged.tensor_type.elem_type = a.elem_type if a.elem_type == b.elem_type else 0
    if a.HasField("shape") and b.HasField("shape") and len(a.shape.dim) == len(b.shape.dim):
        shape = merged.tensor_type.shape
        shape.SetInParent()
        for x, y in zip(a.shape.dim, b.shape.dim, strict=True):
            dim = shape.dim.add()
            if x.HasField("dim_value") and y.HasField("dim_value") and x.dim_value == y.dim_value:
                dim.dim_value = x.dim_value
            elif x.dim_param and x.dim_param == y.dim_param:
                dim.dim_param = x.dim_param
    return merged


def _shape_text(value_type: Any) -> str:
    """A sized tensor type's shape as `2 x 64` (`scalar` for rank 0)."""
    if not value_type.HasField("tensor_type"):
        return (value_type.WhichOneof("value") or "unknown").replace("_type", "")
    dims = [str(d.dim_value) for d in value_type.tensor_type.shape.dim]
    return " x ".join(dims) if dims else "scalar"


def _no_schema_reason(onnx: Any, node: Any, domain: str, opsets: dict[str, int]) -> str:
    """Why an op has no schema in the model's opsets, when ONNX knows the op: its domain is
    not imported, or the op came in a later opset than the one imported ('' otherwise)."""
    if not onnx.defs.has(node.op_type, domain):
        return ""
    if domain not in opsets:
        return f"the model does not import the domain {domain or 'ai.onnx'!r}"
    first = _first_versions(onnx).get((domain, node.op_type), 0)
    if first > opsets[domain]:
        return (
            f"ONNX defines {node.op_type} from opset {first} on, and the model imports opset "
            f"{opsets[domain]} of {domain or 'the default domain'}"
        )
    return ""


@functools.cache
def _first_versions(onnx: Any) -> dict[tuple[str, str], int]:
    """The opset in which ONNX first defines each op, by (domain, op type)."""
    first: dict[tuple[str, str], int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        key = (schema.domain, schema.name)
        first[key] = min(first.get(key, schema.since_version), schema.since_version)
    return first


def dependency_order(nodes: Any) -> list[tuple[int, Any]]:
    """The nodes, each with its position in `nodes`, in a dependency order, the first listed
    first among the ready ones (a valid model lists them so already); nodes on a cycle come
    last, as listed. A node with subgraphs depends on the producers of the values its
    subgraphs read too."""
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for o in node.output:
            if o:
                producer.setdefault(o, i)
    users: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
        for before in {producer[x] for x in node_reads(node) if x in producer} - {i}:
            users[before].append(i)
            waiting[i] += 1
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    placed = set(order)
    order += [i for i in range(len(nodes)) if i not in placed]
    return [(i, nodes[i]) for i in order]


def _constant(onnx: Any, node: Any) -> Any:
    """The value of a `Constant` node as an array (None for a sparse or string value)."""
    import numpy as np

    for attr in node.attribute:
        if attr.name == "value":
            if attr.t.data_location == onnx.TensorProto.EXTERNAL:
                return None
            try:
                return onnx.numpy_helper.to_array(attr.t)
            except Exception:
                return None
        if attr.name == "value_int":
            return np.array(attr.i, np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), np.int64)
        if attr.name == "value_float":
            return np.array(attr.f, np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), np.float32)
    return None
