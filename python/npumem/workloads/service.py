"""The inference service in miniature that `npumem demo` runs: requests of varying batch size
and sequence length, served by worker threads from one pool.

* **vision requests** (ResNet-50, MobileNetV2; batch 1 to 8): a request descriptor, the planned
  activation arena as one block (`solution.bind`), a kernel-argument block per op (allocated,
  written, freed), the output logits handed to another worker, which frees them (a remote free);
* **text requests** (a 4-layer BERT-base encoder as a generator; batch 1 or 2, prompts of 16 to
  256 tokens, 8 to 48 new tokens): the prefill arena (planned per sequence bucket), then a KV
  cache that lives for the whole generation and grows by half when full (allocate the larger
  block, copy, free the old one), with a decode scratch block and a logits block per token.
  A worker keeps up to `max_sessions` generations open and steps each one token between other
  requests, so long-lived KV caches interleave with short-lived arenas, as in a real server.

Every block's bytes are written (the pool is host-backed) and the planned tensors are touched
inside the arena, so the demo exercises the buffer protocol too. When an allocation fails the
request is retried later (after `compactor.compact()` when a compactor is given); one that
still fails after `max_retries` tries is rejected.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import npumem
from npumem.workloads.models import TEXT_HIDDEN, TEXT_LAYERS, TEXT_VOCAB, Model

__all__ = ["Request", "Service", "SupportsCompact", "make_requests"]

KV_BYTES_PER_TOKEN = 2 * TEXT_LAYERS * TEXT_HIDDEN * 2  # K and V, fp16, per sequence
KV_GRANULE = 64  # tokens: KV caches are sized in multiples of this


@runtime_checkable
class SupportsCompact(Protocol):
    """What the demo needs of a compactor (such as `npumem.compaction.Compactor`): one
    call that defragments the pool and returns a report."""

    def compact(self) -> object:
        """Defragment the pool now."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request: a model, a batch size, and for text a prompt length and tokens to
    generate."""

    id: int
    model: str
    batch: int
    seq_len: int = 0
    new_tokens: int = 0


def make_requests(n: int, models: Sequence[Model], seed: int = 0) -> list[Request]:
    """`n` requests: 40% ResNet-50, 30% MobileNetV2, 30% text, batch sizes skewed small."""
    rng = random.Random(seed)
    names = [m.name for m in models]
    weights = [0.4 if m.name == "resnet50" else 0.3 for m in models]
    out = []
    for i in range(n):
        name = rng.choices(names, weights)[0]
        if name == "text":
            out.append(
                Request(i, name, rng.choice((1, 1, 2)), rng.randint(16, 256), rng.randint(8, 48))
            )
        else:
            out.append(Request(i, name, rng.choice((1, 1, 2, 2, 4, 8))))
    return out


class _Retry(Exception):
    """An allocation failed: put the work back and try again later."""


@dataclass
class _Session:
    """An open text generation."""

    request: Request
    descriptor: npumem.Block
    kv: npumem.Block
    kv_tokens: int  # tokens the KV block holds
    tokens: int  # tokens in it now
    generated: int = 0
    failures: int = 0


@dataclass
class _Tally:
    served: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    kv_growths: int = 0
    compactions: int = 0


class Service:
    """Serve `requests` with `workers` threads on `pool`; `run()` returns when every
    request is served or rejected. `on_request` is called after each one (progress bars)."""

    def __init__(
        self,
        pool: npumem.Pool,
        models: Sequence[Model],
        requests: Sequence[Request],
        *,
        workers: int,
        seed: int = 0,
        max_sessions: int = 3,
        max_retries: int = 200,
        compactor: SupportsCompact | None = None,
        on_request: Callable[[], object] | None = None,
    ) -> None:
        self.pool = pool
        self.models = {m.name: m for m in models}
        self.queue: deque[Request] = deque(requests)
        self.workers = workers
        self.seed = seed
        self.max_sessions = max_sessions
        self.max_retries = max_retries
        self.compactor = compactor
        self.on_request = on_request
        self.inboxes: list[deque[npumem.Block]] = [deque() for _ in range(workers)]
        self.retries: dict[int, int] = {}
        self.tallies = [_Tally() for _ in range(workers)]
        self._lock = threading.Lock()
        self.errors: list[BaseException] = []

    # ----- the run ---------------------------------------------------------------------------

    def run(self) -> None:
        """Start the workers, wait for them, free what is left in the inboxes."""
        threads = [
            threading.Thread(target=self._worker, args=(i,), name=f"npumem-demo-worker-{i}")
            for i in range(self.workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for inbox in self.inboxes:
            while inbox:
                inbox.popleft().free()
        if self.errors:
            raise self.errors[0]

    @property
    def served(self) -> dict[str, int]:
        """Requests served, by model."""
        out: dict[str, int] = {}
        for t in self.tallies:
            for k, v in t.served.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def rejected(self) -> int:
        """Requests given up after `max_retries` failed tries."""
        return sum(t.rejected for t in self.tallies)

    @property
    def kv_growths(self) -> int:
        """Times a KV cache grew (allocate larger, copy, free the old one)."""
        return sum(t.kv_growths for t in self.tallies)

    @property
    def compactions(self) -> int:
        """Times a worker called the compactor after a failed allocation."""
        return sum(t.compactions for t in self.tallies)

    def _next(self) -> Request | None:
        with self._lock:
            return self.queue.popleft() if self.queue else None

    def _requeue(self, req: Request, tally: _Tally) -> None:
        with self._lock:
            tries = self.retries[req.id] = self.retries.get(req.id, 0) + 1
            if tries > self.max_retries:
                tally.rejected += 1
                done = True
            else:
                self.queue.append(req)
                done = False
        if done and self.on_request is not None:
            self.on_request()

    def _done(self, req: Request, tally: _Tally) -> None:
        tally.served[req.model] = tally.served.get(req.model, 0) + 1
        if self.on_request is not None:
            self.on_request()

    def _worker(self, index: int) -> None:
        rng = random.Random(self.seed * 7919 + index)
        tally = self.tallies[index]
        sessions: list[_Session] = []
        try:
            while True:
                self._drain_inbox(index)
                req = self._next() if len(sessions) < self.max_sessions else None
                if req is None and not sessions:
                    if not self.queue:
                        break
                    continue
                if req is not None:
                    try:
                        if req.model == "text":
                            sessions.append(self._open(req, rng, tally))
                        else:
                            self._serve_vision(req, rng, index, tally)
                            self._done(req, tally)
                    except _Retry:
                        self._requeue(req, tally)
                for s in list(sessions):
                    if self._step(s, rng, tally):
                        sessions.remove(s)
                        self._close(s, index, tally)
            self._drain_inbox(index)
        except BaseException as exc:
            self.errors.append(exc)
            for s in sessions:
                s.kv.free()
                s.descriptor.free()

    def _drain_inbox(self, index: int) -> None:
        inbox = self.inboxes[index]
        while inbox:
            try:
                blk = inbox.popleft()
            except IndexError:
                return
            view = memoryview(blk)
            if view[0] != 0xA5:
                raise AssertionError(f"output block at {blk.offset} lost its bytes")
            view.release()
            blk.free()

    def _respond(self, blk: npumem.Block, index: int) -> None:
        view = memoryview(blk)
        view[0] = 0xA5
        view.release()
        self.inboxes[(index + 1) % self.workers].append(blk)

    # ----- allocation with the retry and compaction policy -----------------------------------

    def _alloc(self, nbytes: int, tag: str, tally: _Tally) -> npumem.Block:
        try:
            return self.pool.alloc(nbytes, tag=tag)
        except npumem.OutOfMemoryError:
            if self.compactor is None:
                raise _Retry() from None
        # Integration point of the compaction policy: compact, then try once more.
        self.compactor.compact()
        tally.compactions += 1
        try:
            return self.pool.alloc(nbytes, tag=tag)
        except npumem.OutOfMemoryError:
            raise _Retry() from None

    # ----- vision ----------------------------------------------------------------------------

    def _serve_vision(self, req: Request, rng: random.Random, index: int, tally: _Tally) -> None:
        model = self.models[req.model]
        arena_plan = model.plan_for(req.batch)
        descriptor = self._alloc(rng.randint(128, 512), "request", tally)
        try:
            arena = self._alloc(arena_plan.arena_size, f"{model.name}.activations", tally)
            try:
                arena_plan.solution.bind(arena)  # absolute offsets of every tensor
                view = memoryview(arena)
                try:
                    for i, rel in enumerate(arena_plan.op_outputs):
                        args = self._alloc(rng.randint(64, 512), "kernel-args", tally)
                        memoryview(args)[0] = i & 0xFF
                        args.free()
                        view[rel] = i & 0xFF
                finally:
                    view.release()
                out = self._alloc(req.batch * 1000 * 4, f"{model.name}.output", tally)
            finally:
                arena.free()
            self._respond(out, index)
        finally:
            descriptor.free()

    # ----- text ------------------------------------------------------------------------------

    def _open(self, req: Request, rng: random.Random, tally: _Tally) -> _Session:
        model = self.models["text"]
        arena_plan = model.plan_for(req.batch, req.seq_len)
        descriptor = self._alloc(rng.randint(256, 1024), "request", tally)
        try:
            arena = self._alloc(arena_plan.arena_size, "text.prefill", tally)
            try:
                arena_plan.solution.bind(arena)
                view = memoryview(arena)
                for i, rel in enumerate(arena_plan.op_outputs):
                    view[rel] = i & 0xFF
                view.release()
                tokens = -(-req.seq_len // 64) * 64
                kv = self._alloc(tokens * KV_BYTES_PER_TOKEN * req.batch, "text.kv-cache", tally)
            finally:
                arena.free()
        except BaseException:
            descriptor.free()
            raise
        view = memoryview(kv)
        view[0] = 0x5A
        view.release()
        return _Session(req, descriptor, kv, tokens, req.seq_len)

    def _step(self, s: _Session, rng: random.Random, tally: _Tally) -> bool:
        """Generate one token; `True` when the generation is done (or given up)."""
        req = s.request
        try:
            if s.tokens >= s.kv_tokens:
                self._grow(s, tally)
            scratch = self._alloc(req.batch * TEXT_HIDDEN * 4 * 4, "text.decode", tally)
            try:
                logits = self._alloc(req.batch * TEXT_VOCAB * 2, "text.logits", tally)
                memoryview(logits)[-1] = s.generated & 0xFF
                logits.free()
            finally:
                scratch.free()
        except _Retry:
            s.failures += 1
            if s.failures > self.max_retries:
                tally.rejected += 1
                s.generated = -1  # marks a rejected session for _close
                return True
            return False
        s.tokens += 1
        s.generated += 1
        return s.generated >= req.new_tokens

    def _grow(self, s: _Session, tally: _Tally) -> None:
        tokens = -(-(s.kv_tokens * 3 // 2) // 64) * 64
        per_token = KV_BYTES_PER_TOKEN * s.request.batch
        bigger = self._alloc(tokens * per_token, "text.kv-cache", tally)
        old, new = memoryview(s.kv), memoryview(bigger)
        used = s.tokens * per_token
        new[:used] = old[:used]
        old.release()
        new.release()
        s.kv.free()
        s.kv, s.kv_tokens = bigger, tokens
        tally.kv_growths += 1

    def _close(self, s: _Session, index: int, tally: _Tally) -> None:
        view = memoryview(s.kv)
        ok = view[0] == 0x5A
        view.release()
        if not ok:
            raise AssertionError("a KV cache lost its bytes when it grew")
        s.kv.free()
        rejected = s.generated < 0
        try:
            if not rejected:
                out = self._alloc(
                    max(1, s.request.new_tokens) * s.request.batch * 4, "text.output", tally
                )
                self._respond(out, index)
        except _Retry:
            rejected = True
            tally.rejected += 1
        finally:
            s.descriptor.free()
        if rejected:
            if self.on_request is not None:
                self.on_request()
        else:
            self._done(s.request, tally)
