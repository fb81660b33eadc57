"""Shape buckets: one arena per value of a dynamic dimension, the weights shared between them.

A model with a dynamic dimension (the batch, a sequence length) is often run at a few fixed
sizes, *buckets*. Each bucket gets its own plan of the activations; the weights do not depend on
the dimension, so they are laid out once, at the start of the memory, and every bucket's
activations follow them, from the first offset after the weights that keeps every buffer
aligned. The memory to reserve is the weights plus the largest bucket's arena:

    weights [0, W) | activations of the running bucket [W, W + arena(bucket))

`BucketPlan.solution_of(bucket)` is one bucket's whole memory as one plan, weights included:
what the command line writes to each bucket's file.

>>> from npumem import plan
>>> buckets = plan.plan_buckets("model.onnx", dims={"N": [1, 8, 32]})  # doctest: +SKIP
>>> buckets.arena_size, [b.solution.arena_size for b in buckets.buckets]  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from npumem._shown import shown
from npumem.plan.buffers import Buffer
from npumem.plan.errors import PlanArgumentError, PlanArgumentTypeError, PlanError
from npumem.plan.graph import Graph
from npumem.plan.onnx_import import graph_from_onnx, load_onnx
from npumem.plan.problem import Problem, left_out_reasons
from npumem.plan.search import solve
from npumem.plan.solution import Solution

__all__ = ["Bucket", "BucketPlan", "bucket_dims", "plan_buckets"]


def bucket_dims(dims: Mapping[str, int | Sequence[int]]) -> list[dict[str, int]]:
    """Every combination of the values given per dimension (a single value is one bucket).
    `dims` that do not map names to an int or a list of ints raise `PlanArgumentTypeError`."""
    if not isinstance(dims, Mapping):
        raise PlanArgumentTypeError(
            f"dims must map dimension names to values, got {type(dims).__name__}"
        )
    names = list(dims)
    choices: list[list[int]] = []
    for name in names:
        value = dims[name]
        if isinstance(value, int) and not isinstance(value, bool):
            values = [value]
        elif isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise PlanArgumentTypeError(
                f"dims[{shown(name)}] must be an int or a list of ints, got {shown(value)}"
            )
        else:
            values = list(value)
        if not values:
            raise PlanError(f"dimension {name!r} has no value")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int):
                raise PlanArgumentTypeError(
                    f"dims[{shown(name)}] must be an int or a list of ints, got {shown(v)} in it"
                )
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise PlanArgumentError(
                f"dims[{shown(name)}] gives {twice[0]} twice (each value plans one bucket)"
            )
        choices.append(values)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*choices)]


@dataclass(slots=True)
class Bucket:
    """The plan of one bucket: its dimension values and the solution of its activations
    (offsets relative to `BucketPlan.weights_size`)."""

    dims: dict[str, int]
    solution: Solution

    @property
    def label(self) -> str:
        """`N=8` (dimensions joined by commas)."""
        return ",".join(f"{k}={v}" for k, v in self.dims.items())


@dataclass(slots=True)
class BucketPlan:
    """One plan per bucket, and the weights shared by all of them."""

    buckets: list[Bucket]
    weights: Solution | None
    """The weights' layout (offsets from the start of the memory), when weights are planned."""

    @property
    def weights_size(self) -> int:
        """Bytes of the shared weights region (0 when weights are not planned): the weights'
        arena rounded up to the largest alignment of the buckets' buffers, so that every
        activation placed after it stays aligned."""
        if self.weights is None:
            return 0
        align = max(
            (b.alignment for bucket in self.buckets for b in bucket.solution.problem.buffers),
            default=1,
        )
        return -(-self.weights.arena_size // align) * align

    @property
    def largest(self) -> Bucket:
        """The bucket with the largest arena."""
        return max(self.buckets, key=lambda b: b.solution.arena_size)

    @property
    def arena_size(self) -> int:
        """Bytes to reserve for every bucket: the weights plus the largest bucket's arena."""
        return self.weights_size + self.largest.solution.arena_size

    @property
    def lower_bound(self) -> int:
        """The weights plus the largest of the buckets' lower bounds."""
        return self.weights_size + max(b.solution.lower_bound for b in self.buckets)

    def solution_of(self, bucket: Bucket) -> Solution:
        """One bucket's whole memory as one plan: the weights at their shared offsets, live
        the whole run, and the bucket's activations from `weights_size` on; its arena covers
        both. Its lower bound is the weights plus the bucket's bound (for this layout, the
        weights first), and its greedy figure (`stats.greedy_arena`) covers the same buffers:
        the weights at their offsets and the greedy packing of the activations after them.
        Without weights, the bucket's own solution."""
        act = bucket.solution
        if self.weights is None:
            return act
        base = self.weights_size
        end = max((b.upper for b in act.problem.buffers), default=1)
        weights = self.weights.problem
        problem = Problem(
            [replace(b, lower=0, upper=end) for b in weights.buffers] + list(act.problem.buffers),
            aliases=[*weights.aliases, *act.problem.aliases],
            name=act.problem.name,
            slots=act.problem.slots,
            empty=[*weights.empty, *act.problem.empty],
        )
        offsets = dict(self.weights.offsets)
        offsets.update((name, base + offset) for name, offset in act.offsets.items())
        bound = max(self.weights.lower_bound, base + act.lower_bound if act.problem.buffers else 0)
        greedy = base + act.stats.greedy_arena if act.problem.buffers else 0
        stats = replace(act.stats, greedy_arena=max(self.weights.arena_size, greedy))
        return Solution(problem, offsets, lower_bound=bound, stats=stats)

    def tensor_offsets(self, bucket: Bucket) -> dict[str, tuple[int, int]]:
        """`name -> (offset, size)` from the start of the memory for one bucket: the weights,
        then that bucket's activations after them (`solution_of(bucket).tensor_offsets()`)."""
        return self.solution_of(bucket).tensor_offsets()


GraphSource = str | os.PathLike[str] | object | Callable[..., Graph]
"""An ONNX model (a path or an `onnx.ModelProto`), or a function that builds a graph from
dimension keywords (`npumem.plan.networks.resnet50(batch=8)`)."""


def _graph_builder(model: GraphSource) -> Callable[[Mapping[str, int]], Graph]:
    """A function from one bucket's dimensions to its graph. A model file is read once."""
    if callable(model) and not hasattr(model, "graph"):

        def build(dims: Mapping[str, int]) -> Graph:
            graph = model(**dims)
            if not isinstance(graph, Graph):
                raise PlanError(f"the graph builder returned {type(graph).__name__}, not a Graph")
            return graph

        return build
    if isinstance(model, str | os.PathLike):
        proto, label = load_onnx(model), os.fspath(model)
        return lambda dims: graph_from_onnx(proto, dims=dims, label=str(label))
    return lambda dims: graph_from_onnx(model, dims=dims)


def _weights_problem(graph: Graph, alignment: int) -> Problem:
    """Every weight live over one step (solving lays them out one after the other), with the
    views of weights as aliases, as a plan with weights lists them."""
    full = Problem.from_graph(graph, include_weights=True, alignment=alignment)
    weights = {t.name for t in graph.tensors.values() if t.weight}
    return Problem(
        [Buffer(b.id, 0, 1, b.size, b.alignment) for b in full.buffers if b.id in weights],
        aliases=[a for a in full.aliases if a.base in weights],
        name=f"{graph.name} weights",
        empty=[name for name in full.empty if name in weights],
    )


def plan_buckets(
    model: GraphSource,
    *,
    dims: Mapping[str, int | Sequence[int]],
    include_weights: bool = False,
    include_inputs: bool = True,
    include_outputs: bool = True,
    alignment: int = 64,
    pipelined: Iterable[str] = (),
    in_flight: int = 2,
    time_limit: float = 10.0,
    seed: int = 0,
) -> BucketPlan:
    """Plan `model` once per bucket of `dims` (`{"N": [1, 8, 32]}`; several dimensions
    give every combination). `time_limit` is per bucket. With `include_weights` the weights
    are laid out once and shared; they must be the same in every bucket. `pipelined` names
    buffers loaded ahead with `in_flight` inferences in flight (see
    `pipelined()`)."""
    combos = bucket_dims(dims)
    if isinstance(pipelined, str):
        pipelined = [pipelined]
    if not isinstance(pipelined, Iterable):
        raise PlanArgumentTypeError(
            f"pipelined must be a list of buffer names, got {type(pipelined).__name__}"
        )
    build = _graph_builder(model)
    names = list(pipelined)
    buckets: list[Bucket] = []
    weights: Solution | None = None
    weight_sizes: dict[str, int] | None = None
    for combo in combos:
        graph = build(combo)
        problem = Problem.from_graph(
            graph,
            include_weights=False,
            include_inputs=include_inputs,
            include_outputs=include_outputs,
            alignment=alignment,
            label=os.fspath(model) if isinstance(model, str | os.PathLike) else None,
        )
        if names:
            if include_weights:
                problem._left_out = left_out_reasons(
                    graph, problem, include_weights=True, shared_weights=True
                )
            problem = problem.pipelined(names, in_flight)
        label = ",".join(f"{k}={v}" for k, v in combo.items())
        problem.name = f"{problem.name or 'model'} [{label}]"
        if include_weights:
            sizes = {t.name: t.size for t in graph.tensors.values() if t.weight}
            if weight_sizes is None:
                weight_sizes = sizes
                weights = solve(_weights_problem(graph, alignment), time_limit=time_limit)
            elif sizes != weight_sizes:
                raise PlanError(
                    f"the weights differ in bucket {label}: they cannot be shared between buckets"
                )
        buckets.append(Bucket(combo, solve(problem, time_limit=time_limit, seed=seed)))
    return BucketPlan(buckets, weights)
