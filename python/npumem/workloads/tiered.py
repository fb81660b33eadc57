"""The demo on tiered memory: one fast pool (SRAM) per core and a shared slow pool (HBM).

The demo's three models (ResNet-50, MobileNetV2 and a 4-layer BERT-base text generator, fp16)
keep their weights in a `TieredPool`, one weight tensor per block, each
block homed on a core in turn. One worker thread per core serves requests (the demo's mix: 40%
ResNet-50, 30% MobileNetV2, 30% text): a vision request takes an activation arena (`hot`),
reads each op's weights in op order, and frees the arena; a text request takes a KV cache
(`hot`) and, for the prompt and then for every generated token, reads every layer's weights
and the cache. Every read is a `touch`. Each worker calls `rebalance` with a byte budget
every few requests.

The request mix is the demo's (`steady`) or one that shifts from model to model
(`shifting`). The run is recorded (`npumem.tiers.trace`) and replayed under each policy
(access counts with decay, LRU, size only), so the hit rates compare the policies on the same
accesses.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

import npumem
from npumem._shown import shown
from npumem.plan import networks
from npumem.plan.bounds import live_bytes
from npumem.plan.problem import Problem
from npumem.sizes import format_bytes
from npumem.tiers.events import TierEvent
from npumem.tiers.observe import TierSnapshot
from npumem.tiers.policy import FrequencyPolicy, LRUPolicy, Policy, SizeOnlyPolicy
from npumem.tiers.pool import TieredPool
from npumem.tiers.report import TierStats
from npumem.tiers.trace import replay
from npumem.workloads.workers import run_workers

__all__ = [
    "COLD_ADMIT",
    "MIXES",
    "POLICIES",
    "TieredDemoResult",
    "WeightModel",
    "make_policy",
    "report_tiered_demo",
    "run_tiered_demo",
    "synthetic_events",
    "weight_models",
    "write_tier_outputs",
]

MIB = 1 << 20
KV_BYTES_PER_TOKEN = 2 * 4 * 768 * 2  # K and V, 4 layers, hidden 768, fp16

POLICIES = ("frequency", "lru", "size-only")
"""The policies the demo compares, by name."""

MIXES = {
    "steady": ((0.4, 0.3, 0.3),),
    "shifting": ((0.8, 0.1, 0.1), (0.1, 0.8, 0.1), (0.1, 0.1, 0.8)),
}
"""Request mixes: shares of ResNet-50, MobileNetV2 and text, one triple per phase (the
requests are split evenly between the phases). `steady` is the demo's mix."""


COLD_ADMIT = 64 << 10
"""The demo's frequency policy admits cold blocks of at most this many bytes at allocation
(`FrequencyPolicy(admit_cold=...)`)."""


def make_policy(name: str, fast_max_block: int) -> Policy:
    """The policy called `name` (one of `POLICIES`, or `frequency-hot-only`: the frequency
    policy that admits only `hot` blocks at allocation)."""
    if name == "frequency":
        return FrequencyPolicy(admit_cold=COLD_ADMIT)
    if name == "frequency-hot-only":
        return FrequencyPolicy()
    if name == "lru":
        return LRUPolicy()
    if name == "size-only":
        return SizeOnlyPolicy(fast_max_block)
    raise ValueError(f"unknown policy {shown(name)}; known: {', '.join(POLICIES)}")


@dataclass
class WeightModel:
    """A model as the tiered demos see it: its weight tensors, which op reads which, and its
    activation bytes."""

    name: str
    weights: list[tuple[str, int]]
    """Weight tensors: name and bytes."""
    op_weights: list[list[int]]
    """For each op, the indices of the weights it reads."""
    arena_per_batch: int
    """Activation bytes of one sample (the most bytes live at once)."""


def weight_models() -> list[WeightModel]:
    """ResNet-50, MobileNetV2 and a 4-layer BERT-base text model (one token), float16."""
    graphs = [
        networks.resnet50(dtype="float16"),
        networks.mobilenet_v2(dtype="float16"),
        networks.bert_base(layers=4, seq_len=1, dtype="float16"),
    ]
    out = []
    for name, graph in zip(("resnet50", "mobilenet_v2", "text"), graphs, strict=True):
        weights = [(t.name, t.size) for t in graph.tensors.values() if t.weight]
        index = {n: i for i, (n, _) in enumerate(weights)}
        op_weights = [[index[x] for x in op.inputs if x in index] for op in graph.ops]
        arena = live_bytes(Problem.from_graph(graph, alignment=64))
        out.append(WeightModel(name, weights, op_weights, arena))
    return out


@dataclass
class TieredDemoResult:
    """What the tiered demo did, and the policies compared on its recorded accesses."""

    cores: int
    sram_per_core: int
    hbm: int
    fast_max_block: int
    requests: int
    mix: str
    policy: str
    """The policy of the live run."""
    seconds: float
    live: TierStats
    """The live run's figures (threads, so the order of accesses varies from run to run)."""
    events: list[TierEvent] = field(repr=False, default_factory=list)
    compared: dict[str, TierStats] = field(default_factory=dict)
    """Each policy replayed on the recorded accesses."""
    snapshot: TierSnapshot | None = None
    """Every tier at the end of the live run, the weights still in place."""

    def summary(self) -> str:
        lines = [
            f"tiered demo: {self.cores} cores x {self.sram_per_core // MIB} MiB SRAM, "
            f"{self.hbm // MIB} MiB HBM, blocks up to {self.fast_max_block // 1024} KiB in "
            f"SRAM; {self.requests} requests ({self.mix} mix), {len(self.events)} events, "
            f"{self.seconds:.2f} s",
            f"live run ({self.policy}): fast-tier hit rate {self.live.hit_rate:.1%} "
            f"({self.live.byte_hit_rate:.1%} of the bytes), "
            f"{self.live.promotions} promotions, {self.live.demotions} demotions, "
            f"{self.live.spills} spills",
            "same accesses replayed:",
        ]
        for name, s in self.compared.items():
            lines.append(
                f"  {name:<10} hit rate {s.hit_rate:6.1%}  of the bytes {s.byte_hit_rate:6.1%}  "
                f"promotions {s.promotions:>6}  "
                f"demotions {s.demotions:>6}  spills {s.spills:>6}"
            )
        return "\n".join(lines)


def _tiered_pool(
    cores: int, sram: int, hbm: int, fast_max_block: int, policy: Policy
) -> TieredPool:
    fast = [npumem.Pool(sram, cores=1, name=f"sram{c}") for c in range(cores)]
    slow = npumem.Pool(hbm, cores=cores, name="hbm")
    return TieredPool(fast, slow, fast_max_block=fast_max_block, policy=policy)


def run_tiered_demo(
    *,
    cores: int = 4,
    requests: int = 200,
    sram_per_core: int = 8 * MIB,
    hbm: int = 512 * MIB,
    fast_max_block: int = 4 * MIB,
    policy: str = "frequency",
    rebalance_every: int = 4,
    rebalance_bytes: int = 2 * MIB,
    seed: int = 0,
    compare: tuple[str, ...] = POLICIES,
    mix: str = "steady",
    on_request: Callable[[], object] | None = None,
) -> TieredDemoResult:
    """Run the tiered demo (see the module docstring) and compare the policies."""
    models = weight_models()
    rng = random.Random(seed)
    if mix not in MIXES:
        raise npumem.InvalidArgumentError(f"unknown mix {shown(mix)}; known: {', '.join(MIXES)}")
    phases = MIXES[mix]
    plan = [
        (
            rng.choices(range(3), phases[i * len(phases) // requests])[0],
            rng.choice((1, 1, 2, 2, 4, 8)),
            rng.randint(16, 256),
            rng.randint(8, 48),
        )
        for i in range(requests)
    ]

    def build(name: str) -> TieredPool:
        return _tiered_pool(
            cores, sram_per_core, hbm, fast_max_block, make_policy(name, fast_max_block)
        )

    mem = build(policy)
    mem.record()
    start = time.perf_counter()
    weights = [
        [
            mem.alloc(size, core=(k + i) % cores, tag=f"{m.name}:{w}")
            for i, (w, size) in enumerate(m.weights)
        ]
        for k, m in enumerate(models)
    ]
    errors: list[BaseException] = []
    stop = threading.Event()

    def serve(core: int) -> None:
        try:
            for n, (which, batch, prompt, new_tokens) in enumerate(plan[core::cores]):
                if stop.is_set():
                    return
                model = models[which]
                blocks = weights[which]
                if model.name == "text":
                    kv = mem.alloc(
                        KV_BYTES_PER_TOKEN * (prompt + new_tokens), core=core, hot=True, tag="kv"
                    )
                    for _ in range(1 + new_tokens):
                        for reads in model.op_weights:
                            for w in reads:
                                mem.touch(blocks[w])
                        mem.touch(kv, 4)
                    kv.free()
                else:
                    arena = mem.alloc(
                        model.arena_per_batch * batch, core=core, hot=True, tag="arena"
                    )
                    for reads in model.op_weights:
                        for w in reads:
                            mem.touch(blocks[w])
                        mem.touch(arena)
                    arena.free()
                if n % rebalance_every == rebalance_every - 1:
                    mem.rebalance(rebalance_bytes)
                if on_request is not None:
                    on_request()
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    run_workers([(f"npumem-tiers-worker-{c}", partial(serve, c)) for c in range(cores)], stop)
    if errors:
        raise errors[0]
    live = mem.stats()
    snapshot = mem.snapshot(label="end of the run")
    for blocks in weights:
        for tb in blocks:
            tb.free()
    events = mem.stop_recording()
    seconds = time.perf_counter() - start
    mem.check()
    compared = {name: replay(events, build(name)) for name in compare}
    return TieredDemoResult(
        cores,
        sram_per_core,
        hbm,
        fast_max_block,
        requests,
        mix,
        policy,
        seconds,
        live,
        events,
        compared,
        snapshot,
    )


def write_tier_outputs(
    result: TieredDemoResult, folder: str | os.PathLike[str], *, pictures: bool = True
) -> dict[str, Path]:
    """Write the tier snapshot (`tiers.json`) and, with `pictures`, the tiers' picture
    (`tiers.png`) to `folder`; returns `{what: path}`."""
    out = Path(folder)
    files: dict[str, Path] = {}
    if result.snapshot is not None:
        files["tiers at the end of the run"] = result.snapshot.save(out / "tiers.json")
        if pictures:
            from npumem.tiers.plots import plot_tiers

            files["tiers: use and hits"] = plot_tiers(result.snapshot, out / "tiers.png")
    return files


def report_tiered_demo(console: Console, result: TieredDemoResult) -> None:
    """Print the tiered demo's figures: the live run's tiers, then the policies compared on
    the same accesses."""
    from npumem.tiers.observe import render_tiers

    console.print(
        f"tiered demo: {result.cores} cores x {format_bytes(result.sram_per_core)} SRAM, "
        f"{format_bytes(result.hbm)} HBM shared, blocks up to "
        f"{format_bytes(result.fast_max_block)} in SRAM; {result.requests:,} requests "
        f"({result.mix} mix), {len(result.events):,} events, {result.seconds:.2f} s",
        markup=False,
    )
    render_tiers(console, result.live, title="tiers, live run")
    table = Table(
        title="the same accesses under each policy", title_justify="left", box=box.SIMPLE_HEAD
    )
    for name in ("policy", "hit rate", "of the bytes", "promotions", "demotions", "spills"):
        table.add_column(name, justify="left" if name == "policy" else "right", no_wrap=True)
    for name, s in result.compared.items():
        table.add_row(
            name,
            f"{s.hit_rate:.1%}",
            f"{s.byte_hit_rate:.1%}",
            f"{s.promotions:,}",
            f"{s.demotions:,}",
            f"{s.spills:,}",
        )
    console.print(table)


def synthetic_events(
    seed: int = 0,
    *,
    cores: int = 4,
    blocks: int = 400,
    accesses: int = 150_000,
    phases: int = 3,
    scratch: bool = True,
    rebalance_bytes: int = 2 * MIB,
) -> list[TierEvent]:
    """A recorded synthetic run, for comparing policies beyond the demo's accesses: `blocks`
    long-lived blocks of 1 KiB to 8 MiB (log-uniform; a fifth allocated `hot`), homed on the
    cores in turn, read `accesses` times in batches of 200 with Zipf popularity (exponent 0.9)
    whose ranking is drawn anew in each of `phases` phases; with `scratch`, each batch also
    allocates three short-lived `hot` blocks of 4 KiB to 2 MiB, touches each 1 to 30 times
    and frees it. A rebalance of at most `rebalance_bytes` follows each batch."""
    rng = random.Random(seed)
    mem = TieredPool(
        [npumem.Pool(64 * MIB, cores=1) for _ in range(cores)],
        npumem.Pool(4096 * MIB, cores=cores),
        policy=FrequencyPolicy(),
    )
    mem.record()
    sizes = [int(2 ** rng.uniform(10, 23)) for _ in range(blocks)]
    held = [mem.alloc(n, core=i % cores, hot=rng.random() < 0.2) for i, n in enumerate(sizes)]
    for _ in range(phases):
        order = list(range(blocks))
        rng.shuffle(order)
        popularity = [0.0] * blocks
        for rank, i in enumerate(order):
            popularity[i] = 1.0 / (rank + 1) ** 0.9
        done = 0
        while done < accesses // phases:
            mem.touch_many([held[i] for i in rng.choices(range(blocks), popularity, k=200)])
            done += 200
            if scratch:
                for _ in range(3):
                    nbytes = int(2 ** rng.uniform(12, 21))
                    tb = mem.alloc(nbytes, core=rng.randrange(cores), hot=True)
                    mem.touch(tb, rng.randint(1, 30))
                    tb.free()
            mem.rebalance(rebalance_bytes)
    for tb in held:
        tb.free()
    return mem.stop_recording()
