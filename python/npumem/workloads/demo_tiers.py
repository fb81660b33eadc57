"""The main demo on tiered memory (`npumem demo`, unless `--no-tiers`): one fast pool (SRAM)
per worker in front of the demo's pool, which becomes the shared slow tier (HBM).

The models' weights are allocated through a `TieredPool`, one block per weight tensor of
the model's graph (plus one block for the rest of the model's parameters, the embeddings, kept
in HBM), so that single tensors can be promoted. The service (`TieredService`, the demo's
`Service` with three hooks) reads each op's weights when it serves a vision request, and every
layer's weights at the prefill and at every generated token of a text request. A read only
counts the pass over the model's weights; every `rebalance_every` reads (all workers together)
the worker that made the last one enters the window's reads into the tiered pool, one
`touch_many(blocks, counts)` per model read in the window, and calls `rebalance` with a byte
budget. Blocks move only in those rebalances, so each access is counted in the tier that
served it. The activation arenas, the KV cache and the small per-request blocks stay in the
demo's pool as without tiers.

The whole run is recorded (`npumem.tiers.trace`: a few events per window) and replayed on
fresh pools under each other policy of `compare` (the live run's own policy needs no replay: the
recording holds the calls in the order the tiered pool served them, so its replay gives the
live figures), so the report compares the policies on the demo's own accesses.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, NoReturn

import npumem
from npumem.tiers.block import SLOW, TieredBlock
from npumem.tiers.pool import TieredPool
from npumem.tiers.trace import replay
from npumem.workloads.models import Model
from npumem.workloads.service import Service
from npumem.workloads.tiered import (
    TieredDemoResult,
    WeightModel,
    make_policy,
    weight_models,
)

__all__ = ["COMPARE", "DemoTiers", "TieredService"]

MIB = 1 << 20


COMPARE = ("frequency", "size-only")
"""The policies the demo replays its accesses under."""


class DemoTiers:
    """The tiers of one demo run: `workers` fast pools of `sram_per_core` bytes in front of
    `pool`, the policy called `policy` (one of `npumem.workloads.tiered.POLICIES`), blocks
    up to `fast_max_block` bytes in SRAM, the reads entered every `rebalance_every` reads of
    all workers together (a window), and a rebalance of at most `rebalance_bytes` after each of
    the first `warm_windows` windows, then after every `steady_every`-th; the run is recorded
    and replayed under each policy of `compare`."""

    def __reduce__(self) -> NoReturn:
        # A copy would share the tiered pool, locks and counts of this run (copy.copy,
        # deepcopy and pickle all come here).
        raise TypeError(
            "cannot copy or pickle a 'DemoTiers' object: it owns a live TieredPool and the "
            "locks of its run"
        )

    def __init__(
        self,
        pool: npumem.Pool,
        workers: int,
        *,
        sram_per_core: int = 8 * MIB,
        fast_max_block: int = 4 * MIB,
        policy: str = "frequency",
        rebalance_every: int = 128,
        rebalance_bytes: int = 2 * MIB,
        warm_windows: int = 32,
        steady_every: int = 8,
        compare: Sequence[str] = COMPARE,
    ) -> None:
        self.sram_per_core = sram_per_core
        self.fast_max_block = fast_max_block
        self.policy = policy
        self.rebalance_every = rebalance_every
        self.rebalance_bytes = rebalance_bytes
        self.warm_windows = warm_windows
        self.steady_every = steady_every
        self.compare = tuple(compare)
        fast = [npumem.Pool(sram_per_core, cores=1, name=f"sram{c}") for c in range(workers)]
        self.mem = TieredPool(
            fast,
            pool,
            fast_max_block=fast_max_block,
            policy=make_policy(policy, fast_max_block),
        )
        self.models: dict[str, WeightModel] = {}
        self.blocks: dict[str, list[TieredBlock]] = {}
        self._passes: dict[str, tuple[list[TieredBlock], list[int]]] = {}
        self._pending: dict[str, int] = {}
        self._reads = 0
        self._lock = threading.Lock()  # the read count and the pending reads
        self._flush_lock = threading.Lock()  # windows are entered one at a time, in order
        self._started = time.perf_counter()

    @property
    def reads(self) -> int:
        """Passes over a model's weights so far."""
        return self._reads

    def alloc_weights(self, models: Sequence[Model]) -> list[TieredBlock]:
        """Every weight tensor of `models` as a tiered block (homed on the cores in turn), and
        per model one more block in HBM for the parameters not in its graph, so that the
        weights take `model.weight_bytes` in all. Starts the recording."""
        graphs = {m.name: m for m in weight_models()}
        out: list[TieredBlock] = []
        self.mem.record()
        self._started = time.perf_counter()
        for k, model in enumerate(models):
            wm = graphs[model.name]
            tag = f"{model.name}.weights"
            blocks = [
                self.mem.alloc(size, core=(k + i) % self.mem.cores, tag=tag)
                for i, (_, size) in enumerate(wm.weights)
            ]
            self.models[model.name] = wm
            self.blocks[model.name] = blocks
            # One pass reads each weight as many times as ops read it.
            per_pass = Counter(w for reads in wm.op_weights for w in reads)
            self._passes[model.name] = (
                [blocks[w] for w in per_pass],
                list(per_pass.values()),
            )
            self._pending[model.name] = 0
            out += blocks
            rest = model.weight_bytes - sum(size for _, size in wm.weights)
            if rest > 0:
                out.append(self.mem.alloc(rest, core=k % self.mem.cores, tier=SLOW, tag=tag))
        return out

    def read(self, model: str) -> None:
        """One pass over `model`'s weights in op order (a forward pass, or one token)."""
        with self._lock:
            self._pending[model] += 1
            self._reads += 1
            due = self._reads % self.rebalance_every == 0
        if due:
            # Every window while the SRAM fills, then every `steady_every` windows: each move
            # of a weight reallocates it in the shared pool, among the requests' blocks.
            window = self._reads // self.rebalance_every
            steady = window > self.warm_windows and window % self.steady_every
            self.flush(rebalance=not steady)

    def flush(self, *, rebalance: bool = False) -> None:
        """Enter the reads made since the last flush into the tiered pool (one
        `touch_many(blocks, counts)` per model read), then, with `rebalance`, rebalance
        within the budget."""
        with self._flush_lock:
            with self._lock:
                pending = self._pending
                self._pending = dict.fromkeys(pending, 0)
            for model, passes in pending.items():
                if passes:
                    blocks, per_pass = self._passes[model]
                    self.mem.touch_many(blocks, [n * passes for n in per_pass])
            if rebalance:
                self.mem.rebalance(self.rebalance_bytes)

    def service(self, *args: Any, **kwargs: Any) -> TieredService:
        """The demo's service with these tiers (the arguments of `Service`)."""
        return TieredService(*args, tiers=self, **kwargs)

    def result(self, requests: int) -> TieredDemoResult:
        """The live figures and a snapshot of every tier (call it while the weights are
        still allocated), and the policies replayed on the recorded run."""
        self.flush()
        seconds = time.perf_counter() - self._started
        live = self.mem.stats()
        snapshot = self.mem.snapshot(label="end of the run")
        events = self.mem.stop_recording()
        slow = self.mem.slow
        compared = {}
        for name in self.compare:
            if name == self.policy:
                # The recording holds the calls in the order the tiered pool served them, so
                # a replay under the live run's policy gives the live run's figures.
                compared[name] = live
                continue
            fresh = TieredPool(
                [npumem.Pool(self.sram_per_core, cores=1) for _ in range(self.mem.cores)],
                npumem.Pool(slow.capacity, cores=self.mem.cores),
                fast_max_block=self.fast_max_block,
                policy=make_policy(name, self.fast_max_block),
            )
            compared[name] = replay(events, fresh)
        return TieredDemoResult(
            self.mem.cores,
            self.sram_per_core,
            slow.capacity,
            self.fast_max_block,
            requests,
            "demo",
            self.policy,
            seconds,
            live,
            events,
            compared,
            snapshot,
        )


class TieredService(Service):
    """The demo's `Service` that also reads the models' weights through `tiers`: each
    vision request reads its model's weights once, a text request at the prefill and at every
    generated token."""

    def __init__(self, *args: Any, tiers: DemoTiers, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tiers = tiers

    def _serve_vision(self, req: Any, rng: Any, index: int, tally: Any) -> None:
        super()._serve_vision(req, rng, index, tally)
        self.tiers.read(req.model)

    def _open(self, req: Any, rng: Any, tally: Any) -> Any:
        session = super()._open(req, rng, tally)
        self.tiers.read("text")
        return session

    def _step(self, s: Any, rng: Any, tally: Any) -> bool:
        before = s.generated
        done = super()._step(s, rng, tally)
        if s.generated > before:
            self.tiers.read("text")
        return done
