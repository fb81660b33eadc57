"""An executor that runs an ONNX model as a runtime following a plan would, and checks that no
write lands on bytes that still hold a value needed later; and a generator of random ONNX
models with control flow.

The executor knows ONNX's semantics and the runtime contract of `docs/planner.md` (how the
values of subgraphs are named in a plan, which copies a runtime makes at the end of an `If`
and of a loop's iteration), not how the planner flattens a model. Memory is an array of
content ids, one per byte: every value is written with a fresh id where the plan puts it (a
view op, whose output has its input's bytes, writes its input's ids, or nothing when the plan
puts the output on its input), and every read checks that the value's bytes still hold its
ids. An `If` runs one branch, chosen by `choose`; a loop runs its iterations (at most
`max_iterations`: a loop may stop early on its condition).

Slices of a `Scan`'s inputs and outputs are taken as if along axis 0 (the k-th block of
bytes): a slice along another axis touches other bytes of the same tensor, and the plan
reserves the whole tensor for the whole loop either way.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, helper, numpy_helper

from npumem.plan import Solution

VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
"""Ops whose output holds its first input's bytes unchanged."""


class PlanBroken(AssertionError):
    """A value was overwritten while still needed, or a value the runtime needs has no place
    in the plan."""


Segments = list[tuple[int, int, int]]
"""The content of a value: (offset in the value, length, content id) for each written part."""


@dataclass(eq=False)
class _Scope:
    prefix: str
    parent: _Scope | None
    names: dict[str, str] = field(default_factory=dict)

    def define(self, name: str) -> str:
        flat = name if self.parent is None else self.prefix + name
        self.names[name] = flat
        return flat

    def flat(self, name: str) -> str:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        raise PlanBroken(f"{name!r} is read before it is defined")


class Executor:
    """Runs `model` against `solution` (see the module docstring)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        solution: Solution,
        *,
        trips: dict[str, int] | None = None,
        max_iterations: int = 4,
    ) -> None:
        if model.functions:
            model = onnx.inliner.inline_local_functions(model)
        self.model = model
        self.place = dict(solution.tensor_offsets())
        self.arena = solution.arena_size
        self.trips = trips or {}
        self.max_iterations = max_iterations
        for name, (offset, size) in self.place.items():
            if offset < 0 or offset + size > self.arena:
                raise PlanBroken(f"{name!r} at [{offset}, {offset + size}) leaves the arena")

    # ----- memory ---------------------------------------------------------------------------

    def _reset(self) -> None:
        self.memory = np.zeros(self.arena, np.int64)
        self.contents: dict[str, Segments] = {}
        self.writer: dict[int, str] = {0: "nothing"}
        self.weights: dict[str, Any] = {}
        self.empty: set[str] = set()  # the scan outputs of loops that run no iteration
        self.next_id = 1
        self.steps = 0

    def _fresh(self, name: str) -> int:
        cid = self.next_id
        self.next_id += 1
        self.writer[cid] = name
        return cid

    def write(self, flat: str) -> None:
        """A node computes `flat` into its place."""
        if flat not in self.place:
            return  # not planned (a value of 0 bytes, or an unused output left out)
        offset, size = self.place[flat]
        cid = self._fresh(flat)
        self.memory[offset : offset + size] = cid
        self.contents[flat] = [(0, size, cid)]

    def check(self, flat: str, reader: str, content: Segments | None = None) -> None:
        """`reader` reads `flat`: its bytes must still hold what was written (or `content`)."""
        if flat in self.weights or flat in self.empty:
            return
        if flat not in self.place:
            raise PlanBroken(f"{reader} reads {flat!r}, which has no place in the plan")
        if content is None and flat not in self.contents:
            raise PlanBroken(f"{reader} reads {flat!r}, which was never written")
        offset, _ = self.place[flat]
        for at, length, cid in self.contents[flat] if content is None else content:
            held = self.memory[offset + at : offset + at + length]
            bad = np.flatnonzero(held != cid)
            if bad.size:
                culprit = self.writer.get(int(held[bad[0]]), "?")
                raise PlanBroken(
                    f"{reader} reads {flat!r}, but byte {offset + at + int(bad[0])} of it holds "
                    f"{culprit!r} (step {self.steps})"
                )

    def copy(self, src: str, dst: str, at: int = 0, content: Segments | None = None) -> None:
        """The runtime copies `src` into `dst` (at byte `at` of it), unless it is there already;
        `content`: what `src` held when the copies began (a loop's results are all taken at
        the end of the iteration, as ONNX defines it, whatever the copies before overwrote)."""
        self.check(src, f"the copy into {dst!r}", content)
        if content is not None and src not in self.weights:
            self.contents[src] = content
        if dst not in self.place:
            return
        if src in self.weights:
            assert at == 0, "a weight copied into a slice"
            size = self.place[dst][1]
            cid = self._fresh(dst)
            offset = self.place[dst][0] + at
            self.memory[offset : offset + size] = cid
            self.contents[dst] = [(at, size, cid)]
            return
        src_offset, src_size = self.place[src]
        dst_offset, dst_size = self.place[dst]
        if at + min(src_size, dst_size) > dst_size:
            raise PlanBroken(f"{src!r} does not fit in {dst!r} ({dst_size} bytes) at {at}")
        # A branch's value that holds an `If`'s output is sized for the larger branch: its
        # data is the start of it, as much as its readers take.
        moved = [
            (a + at, min(n, dst_size - at - a), cid)
            for a, n, cid in self.contents[src]
            if at + a < dst_size
        ]
        if src_offset != dst_offset + at:
            for a, n, cid in moved:
                self.memory[dst_offset + a : dst_offset + a + n] = cid
        if at == 0:
            self.contents[dst] = moved
        else:
            self.contents.setdefault(dst, []).extend(moved)

    # ----- running --------------------------------------------------------------------------

    def run(self, choose: Callable[[str], bool]) -> None:
        """One inference; `choose(op)` says whether the `If` named `op` takes its then-branch
        (asked at every execution)."""
        self._reset()
        self.choose = choose
        graph = self.model.graph
        top = _Scope("", None)
        for init in graph.initializer:
            self.weights[top.define(init.name)] = numpy_helper.to_array(init)
        for value in graph.input:
            if value.name not in self.weights:
                self.write(top.define(value.name))
        self._graph(graph, top)
        for value in graph.output:
            self.check(top.flat(value.name), "the end of the model")

    def _graph(self, graph: onnx.GraphProto, scope: _Scope) -> None:
        for init in graph.initializer:
            if scope.parent is not None:
                self.weights[scope.define(init.name)] = numpy_helper.to_array(init)
        for index, node in enumerate(graph.node):
            self.steps += 1
            name = scope.prefix + (node.name or f"{node.op_type}_{index}")
            reads = [scope.flat(x) for x in node.input if x]
            if node.op_type == "Constant":
                value = helper.get_attribute_value(node.attribute[0])
                for out in node.output:
                    self.weights[scope.define(out)] = (
                        numpy_helper.to_array(value) if isinstance(value, TensorProto) else value
                    )
                continue
            for flat in reads:
                self.check(flat, f"node {name!r}")
            if node.op_type == "If":
                self._if(scope, node, name)
            elif node.op_type in ("Loop", "Scan"):
                self._loop(scope, node, name, reads)
            else:
                for out in node.output:
                    if not out:
                        continue
                    flat = scope.define(out)
                    if node.op_type in VIEW_OPS and reads:
                        self.copy(reads[0], flat)
                    else:
                        self.write(flat)

    def _if(self, scope: _Scope, node: onnx.NodeProto, name: str) -> None:
        then = self.choose(name)
        attr = "then_branch" if then else "else_branch"
        branch = next(a.g for a in node.attribute if a.name == attr)
        inner = _Scope(f"{name}/{'then' if then else 'else'}/", scope)
        self._graph(branch, inner)
        # The end of the If: each output gets the branch's value, copied unless it is there.
        results = [inner.flat(v.name) for v in branch.output]
        for flat in results:
            self.check(flat, f"the end of {name!r}")
        for out, src in zip(node.output, results, strict=True):
            if out:
                self.copy(src, scope.define(out))

    def _trip(self, scope: _Scope, node: onnx.NodeProto, name: str) -> int:
        if name in self.trips:
            return self.trips[name]
        count = scope.flat(node.input[0])
        if count not in self.weights:
            raise PlanBroken(f"{name!r}: give its trip count (trips=)")
        return int(np.asarray(self.weights[count]).reshape(-1)[0])

    def _loop(self, scope: _Scope, node: onnx.NodeProto, name: str, reads: list[str]) -> None:
        is_loop = node.op_type == "Loop"
        body = next(a.g for a in node.attribute if a.name == "body")
        inner = _Scope(f"{name}/body/", scope)
        inputs = [inner.define(v.name) for v in body.input]
        if is_loop:
            n_states = len(node.input) - 2
            first_in, first_out = 2, 1
            initial = [scope.flat(x) for x in node.input[2:]]
            scanned: list[str] = []
            trip = self._trip(scope, node, name)
        else:
            attrs = {a.name: a for a in node.attribute}
            n_scan = attrs["num_scan_inputs"].i
            n_states = len(node.input) - n_scan
            first_in, first_out = 0, 0
            initial = [scope.flat(x) for x in node.input[:n_states]]
            scanned = [scope.flat(x) for x in node.input[n_states:]]
            slices = inputs[n_states:]
            trip = self.place[scanned[0]][1] // self.place[slices[0]][1]
        states = inputs[first_in : first_in + n_states]
        outputs = [v.name for v in body.output]
        n_scans = len(outputs) - first_out - n_states
        collected = [
            scope.define(out) if out else None
            for out in list(node.output[n_states:]) + [""] * (n_scans - len(node.output[n_states:]))
        ]
        if trip == 0:
            self.empty.update(out for out in collected if out is not None)
        # The start of the loop: the carried values' buffers get their initial values.
        for src, state in zip(initial, states, strict=True):
            self.copy(src, state)
        for k in range(min(trip, self.max_iterations)):
            # Before each iteration: its number, its condition, its slices.
            if is_loop:
                self.write(inputs[0])
                self.write(inputs[1])
            else:
                for src, piece in zip(scanned, slices, strict=True):
                    if src in self.weights:
                        self.write(piece)
                        continue
                    size = self.place[piece][1]
                    offset = self.place[src][0] + k * size
                    held = self.memory[offset : offset + size]
                    expected = [cid for a, n, cid in self.contents[src] if a <= k * size < a + n]
                    if expected and (held != expected[0]).any():
                        raise PlanBroken(f"slice {k} of {src!r} was overwritten before {name!r}")
                    self.write(piece)
            self._graph(body, inner)
            self.steps += 1
            results = [inner.flat(x) for x in outputs]
            for flat in results:
                self.check(flat, f"the end of an iteration of {name!r}")
            # A new value that the end of the iteration would overwrite before copying it
            # has a buffer of its own, `{body prefix}{carried value}@next`: copy it there.
            news = results[first_out : first_out + n_states]
            for j, new in enumerate(news):
                spare = f"{inner.prefix}{body.input[first_in + j].name}@next"
                if spare in self.place:
                    self.copy(new, spare)
                    news[j] = spare
            # The end of the iteration: the scan outputs' slices, then the carried values. Each
            # copy takes the value the body computed, whatever the copies before it wrote.
            taken = {x: list(self.contents[x]) for x in results + news if x in self.contents}
            for out, per in zip(collected, results[first_out + n_states :], strict=True):
                if out is not None:
                    self.copy(per, out, at=k * self.place[per][1], content=taken.get(per))
            for new, state in zip(news, states, strict=True):
                self.copy(new, state, content=taken.get(new))
        for out, state in zip(node.output[:n_states], states, strict=False):
            if out:
                self.copy(state, scope.define(out))
        del reads


def check_plan(
    model: onnx.ModelProto,
    solution: Solution,
    *,
    runs: int = 6,
    seed: int = 0,
    trips: dict[str, int] | None = None,
    max_iterations: int = 4,
) -> int:
    """Run `model` against `solution` with every `If` taking its then-branch, then its
    else-branch, then `runs` random choices (each execution of an `If` drawn anew); raise
    `PlanBroken` at the first value overwritten while needed. Returns the number of runs."""
    executor = Executor(model, solution, trips=trips, max_iterations=max_iterations)
    executor.run(lambda _: True)
    executor.run(lambda _: False)
    rng = random.Random(seed)
    for _ in range(runs):
        executor.run(lambda _: rng.random() < 0.5)
    return runs + 2


# ----- random models --------------------------------------------------------------------------

V = helper.make_tensor_value_info


@dataclass
class _Gen:
    rng: random.Random
    max_depth: int
    min_trip: int = 0
    count: int = 0
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)
    outputs: dict[str, int] = field(default_factory=dict)
    """Values the model returns that no node reads (name -> rank): an `If`'s outputs whose
    branches differ in size, scan outputs (those of subgraphs stay unread)."""

    def name(self, stem: str = "v") -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def weight(self, rows: int, cols: int) -> str:
        name = self.name("w")
        values = np.ones((rows, cols), np.float32)
        self.initializers.append(numpy_helper.from_array(values, name))
        return name

    def condition(self) -> str:
        if not self.conditions or self.rng.random() < 0.3:
            self.conditions.append(self.name("c"))
        return self.rng.choice(self.conditions)

    def block(
        self, env: dict[str, int], size: int, depth: int, nodes: list[onnx.NodeProto]
    ) -> dict[str, int]:
        """Append about `size` nodes reading values of `env` (name -> width of a [2, width]
        float tensor) to `nodes`; return the values they compute."""
        made: dict[str, int] = {}
        rng = self.rng
        for _ in range(size):
            seen = {**env, **made}
            pick = rng.choice(list(seen))
            width = seen[pick]
            kind = rng.random()
            out = self.name()
            if kind < 0.25:
                op = rng.choice(["Relu", "Neg", "Sigmoid", "Abs"])
                nodes.append(helper.make_node(op, [pick], [out], name=out))
                made[out] = width
            elif kind < 0.35:
                op = rng.choice(["Identity", "Flatten"])
                nodes.append(helper.make_node(op, [pick], [out], name=out))
                made[out] = width
            elif kind < 0.5:
                same = [n for n, w in seen.items() if w == width]
                other = rng.choice(same)
                op = rng.choice(["Add", "Mul", "Sub"])
                nodes.append(helper.make_node(op, [pick, other], [out], name=out))
                made[out] = width
            elif kind < 0.58 and width <= 8:
                other = rng.choice([n for n, w in seen.items() if w + width <= 16])
                nodes.append(helper.make_node("Concat", [pick, other], [out], name=out, axis=1))
                made[out] = width + seen[other]
            elif kind < 0.66:
                cols = rng.choice([2, 4, 8])
                weight = self.weight(width, cols)
                nodes.append(helper.make_node("MatMul", [pick, weight], [out], name=out))
                made[out] = cols
            elif depth < self.max_depth and kind < 0.8:
                made.update(self.if_node(seen, depth, nodes, out))
            elif depth < self.max_depth and kind < 0.92:
                made.update(self.loop_node(seen, depth, nodes, out))
            elif depth < self.max_depth:
                made.update(self.scan_node(seen, depth, nodes, out))
            else:
                nodes.append(helper.make_node("Relu", [pick], [out], name=out))
                made[out] = width
        return made

    def result(
        self,
        outer: dict[str, int],
        own: dict[str, int],
        width: int,
        nodes: list[onnx.NodeProto],
    ) -> str:
        """A value of `width` for a subgraph to return: mostly one it computes or one of its
        inputs (`own`), sometimes one of an enclosing graph (`outer`), which ONNX has a
        subgraph return through an op of its own (an `Identity`)."""
        mine = [n for n, w in own.items() if w == width]
        other = [n for n, w in outer.items() if w == width and n not in own]
        if mine and (self.rng.random() < 0.8 or not other):
            return self.rng.choice(mine)
        copy = self.name()
        nodes.append(helper.make_node("Identity", [self.rng.choice(other)], [copy], name=copy))
        return copy

    def if_node(
        self, env: dict[str, int], depth: int, nodes: list[onnx.NodeProto], name: str
    ) -> dict[str, int]:
        rng = self.rng
        widths = [rng.choice(list(env.values())) for _ in range(rng.randint(1, 2))]
        # An output whose branches differ in size cannot be read further: the model returns it.
        other_widths = [w if rng.random() < 0.75 else rng.choice([2, 4, 8, 16]) for w in widths]
        branches = []
        for tag, wanted in (("then", widths), ("else", other_widths)):
            inner: list[onnx.NodeProto] = []
            made = self.block(env, rng.randint(0, 4), depth + 1, inner)
            outs = []
            for width in wanted:
                if width not in set(env.values()) | set(made.values()):
                    # A value of that width from the model's input x [2, 4].
                    cols = self.weight(4, width)
                    extra = self.name()
                    inner.append(helper.make_node("MatMul", ["x", cols], [extra], name=extra))
                    made[extra] = width
                returned = self.result(env, made, width, inner)
                outs.append(V(returned, TensorProto.FLOAT, [None, None]))
            branches.append(helper.make_graph(inner, f"{name}_{tag}", [], outs))
        results = [self.name() for _ in widths]
        nodes.append(
            helper.make_node(
                "If",
                [self.condition()],
                results,
                name=name,
                then_branch=branches[0],
                else_branch=branches[1],
            )
        )
        same: dict[str, int] = {}
        for result, a, b in zip(results, widths, other_widths, strict=True):
            if a == b:
                same[result] = a
            elif depth == 0:  # inside a subgraph it stays unread
                self.outputs[result] = 2
        return same

    def loop_node(
        self, env: dict[str, int], depth: int, nodes: list[onnx.NodeProto], name: str
    ) -> dict[str, int]:
        rng = self.rng
        carried = rng.sample(list(env), min(len(env), rng.randint(1, 3)))
        iteration, cond_in = self.name("i"), self.name("cond")
        states = {self.name("s"): env[c] for c in carried}
        inner: list[onnx.NodeProto] = []
        scope = {**env, **states}
        made = self.block(scope, rng.randint(1, 5), depth + 1, inner)
        cond_out = self.name("cond")
        inner.append(helper.make_node("Identity", [cond_in], [cond_out], name=cond_out))
        outs = [V(cond_out, TensorProto.BOOL, [])]
        own = {**states, **made}
        for width in states.values():
            # Sometimes another carried value of the same width: a swap.
            outs.append(V(self.result(scope, own, width, inner), TensorProto.FLOAT, [None, None]))
        scans = []
        for _ in range(rng.randint(0, 2)):
            per = self.result(scope, own, rng.choice(list(own.values())), inner)
            outs.append(V(per, TensorProto.FLOAT, [None, None]))
            scans.append(per)
        inputs = [V(iteration, TensorProto.INT64, []), V(cond_in, TensorProto.BOOL, [])]
        inputs += [V(s, TensorProto.FLOAT, [2, w]) for s, w in states.items()]
        body = helper.make_graph(inner, f"{name}_body", inputs, outs)
        trip = self.name("trip")
        count = np.array(rng.randint(self.min_trip, 3), np.int64)
        self.initializers.append(numpy_helper.from_array(count, trip))
        finals = [self.name() for _ in states]
        collected = [self.name("ys") for _ in scans]
        nodes.append(
            helper.make_node(
                "Loop",
                [trip, "go", *carried],
                [*finals, *collected],
                name=name,
                body=body,
            )
        )
        if depth == 0:
            self.outputs.update(dict.fromkeys(collected, 3))
        return dict(zip(finals, states.values(), strict=True))

    def scan_node(
        self, env: dict[str, int], depth: int, nodes: list[onnx.NodeProto], name: str
    ) -> dict[str, int]:
        rng = self.rng
        carried = rng.choice(list(env))
        width = env[carried]
        source = rng.choice([n for n, w in env.items() if w == width])
        state, piece = self.name("s"), self.name("x")
        inner: list[onnx.NodeProto] = []
        # The slice is a [width] row: the body adds it to the [2, width] state.
        mixed = self.name()
        inner.append(helper.make_node("Add", [state, piece], [mixed], name=mixed))
        scope = {**env, state: width, mixed: width}
        made = {mixed: width, **self.block(scope, rng.randint(0, 4), depth + 1, inner)}
        own = {state: width, **made}
        new = self.result(scope, own, width, inner)
        per = self.result(scope, own, rng.choice(list(own.values())), inner)
        inputs = [V(state, TensorProto.FLOAT, [2, width]), V(piece, TensorProto.FLOAT, [width])]
        outs = [V(new, TensorProto.FLOAT, [None, None]), V(per, TensorProto.FLOAT, [None, None])]
        body = helper.make_graph(inner, f"{name}_body", inputs, outs)
        final, collected = self.name(), self.name("ys")
        nodes.append(
            helper.make_node(
                "Scan",
                [carried, source],
                [final, collected],
                name=name,
                body=body,
                num_scan_inputs=1,
            )
        )
        if depth == 0:
            self.outputs[collected] = 3
        return {final: width}


def random_model(
    seed: int, *, size: int = 8, max_depth: int = 2, min_trip: int = 0
) -> onnx.ModelProto:
    """A random valid model of [2, width] float tensors with `If`, `Loop` and `Scan` nodes
    (nested up to `max_depth`): branches that return values of their own or of enclosing
    graphs, of the same or of different sizes, one value twice; loops of `min_trip` to 2
    iterations with carried values (passed through, swapped), scan outputs and values of
    enclosing graphs; weights. Its inputs: x [2, 4], y [2, 8], the `If` conditions `c...` and
    the loops' condition `go`."""
    gen = _Gen(random.Random(seed), max_depth, min_trip)
    nodes: list[onnx.NodeProto] = []
    env = {"x": 4, "y": 8}
    made = gen.block(env, size, 0, nodes)
    outputs = {**dict.fromkeys(list(made)[-2:], 2), **gen.outputs}
    inputs = [V("x", TensorProto.FLOAT, [2, 4]), V("y", TensorProto.FLOAT, [2, 8])]
    inputs += [V(c, TensorProto.BOOL, []) for c in [*gen.conditions, "go"]]
    graph = helper.make_graph(
        nodes,
        f"random{seed}",
        inputs,
        [V(o, TensorProto.FLOAT, [None] * rank) for o, rank in outputs.items()],
        gen.initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def check_sizes(model: onnx.ModelProto, solution: Solution) -> int:
    """Run `model` with ONNX's reference evaluator, every `If` condition true, then false (the
    loops' condition `go` true), and check that each value of the top graph fits in its place
    in the plan. Returns the number of values checked."""
    from onnx.reference import ReferenceEvaluator

    place = dict(solution.tensor_offsets())
    names = [o for n in model.graph.node for o in n.output if o and n.op_type != "Constant"]
    evaluator = ReferenceEvaluator(model)
    rng = np.random.default_rng(0)
    checked = 0
    for taken in (True, False):
        feeds: dict[str, Any] = {
            "x": rng.random((2, 4), np.float32),
            "y": rng.random((2, 8), np.float32),
        }
        for value in model.graph.input:
            if value.type.tensor_type.elem_type == TensorProto.BOOL:
                feeds[value.name] = np.array(taken or value.name == "go")
        for name, result in zip(names, evaluator.run(names, feeds), strict=True):
            size = place[name][1] if name in place else 0
            if result.nbytes > size:
                raise PlanBroken(f"{name!r} takes {result.nbytes} bytes, {size} planned")
            checked += 1
    return checked
