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
  keeps the shape the model declares for its outputs, when it declares one; for an output left
  unsized, `Inferred` tells why (no shape inference for the op, or its inference failed on
  inputs of known shapes, such as dimensions that do not broadcast).
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from npumem._shown import shown

__all__ = ["FOLD_LIMIT", "FOLD_OPS", "Failure", "Inferred", "complete", "infer_types", "node_label"]

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


@dataclass(slots=True)
class Inferred:
    """The type of every value that could be typed; for each value left unsized because its
    op has no shape inference, the op (as `node_label` names it) and why ('' when there is no
    more to say); for each value left unsized because its op's inference failed
    on inputs of known shapes, the `Failure`."""

    types: dict[str, Any]
    no_inference: dict[str, tuple[str, str]] = field(default_factory=dict)
    failed: dict[str, Failure] = field(default_factory=dict)


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


def _elements(value_type: Any) -> int:
    return math.prod(d.dim_value for d in value_type.tensor_type.shape.dim)


def infer_types(onnx: Any, proto: Any) -> Inferred:
    """The types of `proto`'s values (see the module docstring), its symbolic dimensions
    already bound. Raises what `onnx.shape_inference.infer_shapes` raises."""
    graph = proto.graph
    declared = {v.name: v.type for v in [*graph.value_info, *graph.output]}
    inferred = onnx.shape_inference.infer_shapes(
        _to_infer(onnx, proto), strict_mode=False, data_prop=False
    ).graph

    types: dict[str, Any] = {}
    for value_info in [*inferred.value_info, *inferred.output, *inferred.input]:
        # An empty type (a value declared by name only, which inference could not type) is no
        # type: the value is left to the walk below and, failing that, to the caller.
        if value_info.HasField("type") and value_info.type.WhichOneof("value") is not None:
            types[value_info.name] = value_info.type
    for init in graph.initializer:
        if init.name not in types:  # an initializer that is not a graph input (or IR < 4)
            types[init.name] = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
    result = Inferred(types)
    if all(complete(types.get(o)) for node in graph.node for o in node.output if o):
        return result
    _walk(onnx, graph, proto, declared, result)
    return result


def _to_infer(onnx: Any, proto: Any) -> Any:
    """The model that shape inference runs on: `proto` without its declared value infos and
    output types, and with its large initializers (weights, whose values no shape depends on)
    turned into typed graph inputs, so that their data is neither copied nor read (it may be
    external, or more than a protobuf can hold)."""
    graph = proto.graph
    light = onnx.ModelProto()
    light.ir_version = max(proto.ir_version, 4)  # initializers need not be graph inputs
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    light.graph.name = graph.name
    light.graph.node.extend(graph.node)
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


def _walk(onnx: Any, graph: Any, proto: Any, declared: dict[str, Any], result: Inferred) -> None:
    """Infer node by node, folding shape computations (see the module docstring)."""
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    types = result.types
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    default_opset = onnx.helper.make_opsetid("", opsets.get("", 1))
    initializers = {init.name: init for init in graph.initializer}
    values: dict[str, Any] = {}

    def value(name: str) -> Any:
        if name in values:
            return values[name]
        init = initializers.get(name)
        if (
            init is None
            or init.data_location == onnx.TensorProto.EXTERNAL
            or math.prod(init.dims) > FOLD_LIMIT
        ):
            return None
        try:
            values[name] = onnx.numpy_helper.to_array(init)
        except Exception:
            return None
        return values[name]

    def best(name: str) -> Any:
        """The inferred type of a value, or the declared one where inference cannot tell."""
        found = types.get(name)
        return found if complete(found) or name not in declared else declared[name]

    for index, node in _dependency_order(graph.node):
        outputs = [o for o in node.output if o]
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        missing = [o for o in outputs if not complete(types.get(o))]
        if missing:
            schema = None
            if domain in opsets:
                try:
                    schema = onnx.defs.get_schema(node.op_type, opsets[domain], domain)
                except onnx.defs.SchemaError:
                    schema = None
            if schema is None:
                why = (node_label(node, index), _no_schema_reason(onnx, node, domain, opsets))
                for o in missing:
                    result.no_inference[o] = why
            elif all(x in types or x in declared for x in node.input if x):
                data = {}
                for x in node.input:
                    known = value(x) if x else None
                    if known is not None:
                        data[x] = onnx.numpy_helper.from_array(known, x)
                try:
                    found = onnx.shape_inference.infer_node_outputs(
                        schema,
                        node,
                        {x: best(x) for x in node.input if x},
                        data,
                        opset_imports=list(proto.opset_import),
                        ir_version=proto.ir_version,
                    )
                except Exception as exc:
                    found = {}
                    # Only a failure on inputs that are all sized is this node's own: otherwise
                    # the cause lies before it, where an input was left unsized.
                    if all(complete(best(x)) for x in node.input if x):
                        failure = Failure(
                            node_label(node, index),
                            " ".join(str(exc).split()),
                            ", ".join(
                                f"{shown(x)} {_shape_text(best(x))}" for x in node.input if x
                            ),
                        )
                        for o in missing:
                            result.failed[o] = failure
                for o, t in found.items():
                    if o in missing and (complete(t) or o not in types):
                        types[o] = t
            for o in missing:
                if not complete(types.get(o)) and complete(declared.get(o)):
                    types[o] = declared[o]
                    result.no_inference.pop(o, None)
                    result.failed.pop(o, None)
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
            source: Any = types.get(node.input[0]) if node.input else None
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
                values[o] = v


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


def _dependency_order(nodes: Any) -> list[tuple[int, Any]]:
    """The nodes, each with its position in `nodes`, in a dependency order, the first listed
    first among the ready ones (a valid model lists them so already); nodes on a cycle come
    last, as listed."""
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for o in node.output:
            if o:
                producer.setdefault(o, i)
    users: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
        for before in {producer[x] for x in node.input if x in producer} - {i}:
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
