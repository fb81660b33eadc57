"""Tensor lifetimes from a graph (`npumem.plan.graph`): the buffers the planner places.

Rules (op `i` runs at time step `i`; a buffer is live on `[lower, upper)`):

* a tensor written by op `p` and last read by op `r` is live on `[p, r + 1)`; one nobody reads
  on `[p, p + 1)`. An op's inputs and outputs are live together, so they never share memory
  unless the op is in place.
* graph inputs are live from step 0; graph outputs until the end (`len(ops)`).
* weights (`"weight": true`) are static: not planned, unless `include_weights` (then live
  over the whole run).
* a view (`"view_of": base`, optional `"view_offset"` in bytes) owns no memory: it lives in
  its base, and every use of the view extends the base's life.
* an in-place op (`"inplace": {output: input}`) may write `output` into `input`'s memory. It
  does so when this op is the input's last use (counting its views and earlier in-place
  outputs), the input is not a graph input, output or weight, and the output fits; otherwise the
  output gets its own buffer.
* a tensor of 0 bytes takes no memory: one that lies in a buffer (a view, an in-place output)
  is an alias of 0 bytes there; one whose memory owner has 0 bytes too gets no buffer and is
  listed apart, as an empty tensor (the plan reports it at offset 0, size 0).
* ops listed out of order are put in a dependency order (stable); a cycle, a tensor nobody
  declares, writes twice or produces before it is read, is a `GraphError`.
"""

from __future__ import annotations

import bisect
import heapq
import math

from npumem._shown import shown
from npumem.plan.buffers import Alias, Buffer
from npumem.plan.errors import GraphError
from npumem.plan.graph import Graph, Op

__all__ = ["execution_order", "lifetimes"]


def _check_view_chains(graph: Graph) -> None:
    """Every view's base exists and every chain of views ends at a tensor that owns memory.

    Linear in the number of tensors: each tensor is walked once, and a walk stops at a
    tensor already known to end well.
    """
    tensors = graph.tensors
    ends_well: set[str] = set()
    for tensor in tensors.values():
        path: list[str] = []
        on_path: set[str] = set()
        cur = tensor
        while cur.view_of is not None and cur.name not in ends_well:
            path.append(cur.name)
            on_path.add(cur.name)
            if cur.view_of not in tensors:
                raise GraphError(
                    f"tensor {shown(cur.name)} is a view of unknown tensor {shown(cur.view_of)}"
                )
            if cur.view_of in on_path:
                start = path.index(cur.view_of)
                cycle = (
                    path[start:] if len(path) - start <= 8 else [*path[start : start + 8], "..."]
                )
                raise GraphError(f"views form a cycle: {' -> '.join([*cycle, cur.view_of])}")
            cur = tensors[cur.view_of]
        ends_well.update(path)


def _view_forest_intervals(graph: Graph) -> dict[str, tuple[int, int]]:
    """For each tensor, `[first, last)` positions in a depth-first walk of the views (each
    tensor a child of the one it is a view of): `a` lies on `t`'s chain of views (or is `t`)
    exactly when `t`'s first position lies in `a`'s range."""
    children: dict[str, list[str]] = {}
    for t in graph.tensors.values():
        if t.view_of is not None:
            children.setdefault(t.view_of, []).append(t.name)
    spans: dict[str, tuple[int, int]] = {}
    clock = 0
    for root in graph.tensors.values():
        if root.view_of is not None:
            continue
        stack: list[tuple[str, int]] = [(root.name, 0)]
        first: dict[str, int] = {}
        while stack:
            name, child = stack.pop()
            if child == 0:
                first[name] = clock
                clock += 1
            kids = children.get(name, [])
            if child < len(kids):
                stack.append((name, child + 1))
                stack.append((kids[child], 0))
            else:
                spans[name] = (first[name], clock)
    return spans


def _check_self_reads(graph: Graph, producer: dict[str, int]) -> None:
    """Refuse an op that reads one of its own outputs, directly or through views of it."""
    spans = _view_forest_intervals(graph)
    for i, op in enumerate(graph.ops):
        if not op.outputs or not op.inputs:
            continue
        # The outputs' ranges, nested ones dropped: disjoint and sorted by start.
        ranges: list[tuple[int, int]] = []
        for lo, hi in sorted(spans[t] for t in op.outputs if producer.get(t) == i):
            if not ranges or lo >= ranges[-1][1]:
                ranges.append((lo, hi))
        starts = [lo for lo, _ in ranges]
        for t in op.inputs:
            at = spans[t][0]
            k = bisect.bisect_right(starts, at) - 1
            if k >= 0 and at < ranges[k][1]:
                raise GraphError(f"op {shown(op.name)} reads its own output (a cycle)")


def _stable_topological_order(graph: Graph, producer: dict[str, int]) -> list[int]:
    """Op indices in a dependency order, the smallest listed index first among the ready
    ones (Kahn); the ops left out are on or behind a cycle."""
    tensors = graph.tensors
    # Nodes: ops 0..n-1, then one per tensor. Edges point from a dependency to its users.
    n = len(graph.ops)
    node = {name: n + k for k, name in enumerate(tensors)}
    users: list[list[int]] = [[] for _ in range(n + len(node))]
    indegree = [0] * (n + len(node))
    for name, tensor in tensors.items():
        base = tensor.view_of
        for before in (producer.get(name), None if base is None else node[base]):
            if before is not None:
                users[before].append(node[name])
                indegree[node[name]] += 1
    for i, op in enumerate(graph.ops):
        for t in dict.fromkeys(op.inputs):
            users[node[t]].append(i)
            indegree[i] += 1
    ready = [i for i in range(n) if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []

    def done(k: int) -> None:
        # Tensor nodes carry no choice: they pass readiness on at once.
        pending = [k]
        while pending:
            for u in users[pending.pop()]:
                indegree[u] -= 1
                if indegree[u] == 0:
                    if u < n:
                        heapq.heappush(ready, u)
                    else:
                        pending.append(u)

    for k in range(n, n + len(node)):
        if indegree[k] == 0:
            done(k)
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        done(i)
    return order


def _describe_cycle(graph: Graph, producer: dict[str, int], order: list[int]) -> str:
    """A cycle among the ops left out of `order`, as `'a' -> 'b' -> 'a'`: from the first
    of them, step to the first op left out that it depends on until an op repeats."""
    tensors = graph.tensors
    stuck = set(range(len(graph.ops))) - set(order)
    # For each tensor, the first stuck op among the producers up its chain of views (memoized:
    # each tensor is resolved once).
    first_stuck: dict[str, float] = {}

    def first_stuck_up(name: str) -> float:
        chain: list[str] = []
        cur: str | None = name
        while cur is not None and cur not in first_stuck:
            chain.append(cur)
            cur = tensors[cur].view_of
        best = math.inf if cur is None else first_stuck[cur]
        for link in reversed(chain):
            p = producer.get(link)
            if p is not None and p in stuck:
                best = min(best, p)
            first_stuck[link] = best
        return first_stuck[name]

    position: dict[int, int] = {}  # op -> its place on the walk
    i = min(stuck)
    while i not in position:
        position[i] = len(position)
        i = int(min(first_stuck_up(t) for t in graph.ops[i].inputs))
    path = list(position)
    cycle = [*path[position[i] :], i]
    return " -> ".join(repr(graph.ops[j].name) for j in cycle)


def execution_order(graph: Graph) -> list[Op]:
    """Check references, then return the ops in a dependency order (the given one if valid)."""
    tensors = graph.tensors
    producer: dict[str, int] = {}
    op_names: set[str] = set()
    for i, op in enumerate(graph.ops):
        if op.name in op_names:
            raise GraphError(f"op name {shown(op.name)} is used twice")
        op_names.add(op.name)
        for t in op.inputs + op.outputs:
            if t not in tensors:
                raise GraphError(f"op {shown(op.name)} refers to unknown tensor {shown(t)}")
        for t in op.outputs:
            if t in producer:
                raise GraphError(
                    f"tensor {shown(t)} is written by op {shown(graph.ops[producer[t]].name)} "
                    "and by "
                    f"op {shown(op.name)}"
                )
            if tensors[t].weight:
                raise GraphError(f"op {shown(op.name)} writes weight {shown(t)}")
            producer[t] = i
        for out, src in op.inplace.items():
            if out not in op.outputs or src not in op.inputs:
                raise GraphError(
                    f"op {shown(op.name)}: in-place pair {shown(out)} <- {shown(src)} must map "
                    "one of its "
                    "outputs to one of its inputs"
                )
    for t in graph.inputs + graph.outputs:
        if t not in tensors:
            raise GraphError(f"graph input or output {shown(t)} is not a declared tensor")
    for t in graph.inputs:
        if t in producer:
            raise GraphError(
                f"graph input {shown(t)} is also written by op {shown(graph.ops[producer[t]].name)}"
            )
    available = set(graph.inputs) | {n for n, t in tensors.items() if t.weight}
    for op in graph.ops:
        for t in op.inputs:
            if t not in producer and t not in available:
                raise GraphError(
                    f"tensor {shown(t)} is read by op {shown(op.name)} but is not a graph input "
                    "or a "
                    "weight and no op writes it"
                )
    for t in graph.outputs:
        if t not in producer and t not in available:
            raise GraphError(f"graph output {shown(t)} is never written")
    _check_view_chains(graph)
    # An op that reads a view depends on the producers of every tensor up the view's chain.
    # Those sets can be as long as the chain for every op, so the order is computed over ops
    # plus one node per tensor instead: a tensor is ready once its producer has run and its
    # base is ready, and an op once the tensors it reads are ready. Linear in the graph.
    _check_self_reads(graph, producer)
    order = _stable_topological_order(graph, producer)
    if len(order) < len(graph.ops):
        raise GraphError("the graph has a cycle: " + _describe_cycle(graph, producer, order))
    return [graph.ops[i] for i in order]


def lifetimes(
    graph: Graph,
    *,
    include_weights: bool = False,
    include_inputs: bool = True,
    include_outputs: bool = True,
    alignment: int = 1,
) -> tuple[list[Buffer], list[Alias], list[str]]:
    """The buffers, the aliases and the empty tensors of `graph` (see the module docstring
    for the rules).

    One buffer per tensor that owns memory; views and in-place outputs become
    `Alias` entries (one of 0 bytes too, where it lies in a buffer). A tensor of 0 bytes that
    lies in no buffer (its memory owner has 0 bytes) is named in the third list: it takes no
    memory, and the planner reports it at offset 0 with size 0.
    `alignment` raises every buffer's alignment to at least that.
    """
    ops = execution_order(graph)
    tensors = graph.tensors
    n = len(ops)
    end = max(n, 1)
    outputs = set(graph.outputs)
    inputs = set(graph.inputs)

    roots: dict[str, tuple[str, int]] = {}

    def root(name: str) -> tuple[str, int]:
        """The tensor that owns `name`'s memory and the byte offset inside it (memoized: each
        chain of views is walked once)."""
        chain: list[str] = []
        t = tensors[name]
        while t.view_of is not None and t.name not in roots:
            chain.append(t.name)
            t = tensors[t.view_of]
        base, offset = roots.get(t.name, (t.name, 0))
        for link in reversed(chain):
            offset += tensors[link].view_offset
            roots[link] = (base, offset)
        return roots.get(name, (base, offset))

    for tensor in tensors.values():
        align = tensor.alignment
        if (
            isinstance(align, bool)
            or not isinstance(align, int)
            or align < 1
            or align & (align - 1)
        ):
            raise GraphError(
                f"tensor {shown(tensor.name)}: alignment must be a power of two, got {shown(align)}"
            )
        if tensor.view_of is not None:
            base, offset = root(tensor.name)
            if offset < 0 or offset + tensor.size > tensors[base].size:
                raise GraphError(
                    f"view {shown(tensor.name)} ({tensor.size} bytes at offset {offset}) does not "
                    f"fit in {shown(base)} ({tensors[base].size} bytes)"
                )
            if offset % align:
                raise GraphError(
                    f"view {shown(tensor.name)} asks for alignment {align} but lies {offset} bytes "
                    f"into {shown(base)}"
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

    # Per group, kept up to date as groups merge (each check below is then O(1)): the last
    # step any member is used, and whether a member is a graph input or output.
    group_last: dict[str, int] = {}
    group_io: dict[str, bool] = {}
    for owner, names in members.items():
        group_last[owner] = max(last.get(m, born.get(m, 0)) for m in names)
        group_io[owner] = any(m in outputs or m in inputs for m in names)

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
                or group_io[owner]
                or group_last[owner] > step
                or offset + out_t.size > owner_t.size
                or (out in outputs and not include_outputs)
                or any((offset + group[m][1]) % tensors[m].alignment for m in members[out])
            ):
                continue
            # The output and the views living in it move into the input's memory.
            for m in members.pop(out):
                group[m] = (owner, offset + group[m][1])
                members[owner].append(m)
            group_last[owner] = max(group_last[owner], group_last.pop(out))
            out_io = group_io.pop(out)
            group_io[owner] = group_io[owner] or out_io

    buffers: list[Buffer] = []
    aliases: list[Alias] = []
    empty: list[str] = []
    for owner, names in members.items():
        owned = tensors[owner]
        if owned.weight and not include_weights:
            continue
        if owner in inputs and not include_inputs:
            continue
        if not include_outputs and all(
            m in outputs for m in names if tensors[m].size or not owned.size
        ):
            continue
        if owned.size == 0:
            # Nothing of the group takes memory (a view or an in-place output fits inside
            # its owner, so every member has 0 bytes): no buffer, each member listed as empty.
            empty.extend(names)
            continue
        if owned.weight:
            lower, upper = 0, end
        else:
            lower = min(born.get(m, 0) for m in names)
            upper = group_last[owner] + 1
        # The buffer is aligned for every tensor in it (each lies at a multiple of its own).
        align = max(tensors[m].alignment for m in names)
        buffers.append(Buffer(owner, lower, upper, owned.size, max(align, alignment)))
        aliases.extend(Alias(m, owner, group[m][1], tensors[m].size) for m in names if m != owner)
    buffers.sort(key=lambda b: (b.lower, b.id))
    return buffers, aliases, empty
