"""The inference service in miniature that `npumem demo` runs: requests of varying batch size
and sequence length, served by worker threads from one pool.

* **vision requests** (ResNet-50, MobileNetV2; batch 1 to 8): a request descriptor, the planned
  activation arena as one block (`solution.bind`), a kernel-argument block per op (allocated,
  written, freed), the output logits handed to another worker, which frees them (a remote free);
* **text requests** (a 4-layer BERT-base encoder as a generator; batch 1 or 2, prompts of 16 to
  256 tokens, 8 to 48 new tokens): the prefill arena (planned per sequence bucket), then a
  sequence per batch element in the service's paged KV cache (`npumem.kv.KVCache`, pages
  of 16 tokens from the pool, taken as the sequence grows: nothing is copied to grow), with a
  decode scratch block and a logits block per token. Half of the text requests start from the
  service's common system prompt (its pages are shared, not copied); a quarter run beam search
  with 4 beams that share the prompt's pages, copy a shared partly filled page on write, and
  every 8 tokens replace a beam by a fork of another. A worker keeps up to `max_sessions`
  generations open and steps each one token between other requests, so long-lived KV caches
  interleave with short-lived arenas, as in a real server.

Every block's bytes are written (the pool is host-backed) and the planned tensors are touched
inside the arena, so the demo exercises the buffer protocol too. When an allocation fails the
request is retried later (after `compactor.compact()` when a compactor is given); one that
still fails after `max_retries` tries is rejected.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import NoReturn, Protocol, runtime_checkable

import npumem
from npumem.kv.cache import KVCache
from npumem.workloads.kv_summary import KVSummary
from npumem.workloads.models import TEXT_HIDDEN, TEXT_LAYERS, TEXT_VOCAB, Model
from npumem.workloads.workers import run_workers

__all__ = ["Request", "Service", "SupportsCompact", "make_kv_cache", "make_requests"]

TEXT_HEADS = 12  # attention heads of the text model (head_dim = TEXT_HIDDEN / TEXT_HEADS)
KV_PAGE_TOKENS = 16
SYSTEM_PROMPT = -1  # the sequence id of the common system prompt
SYSTEM_PROMPT_TOKENS = 64
BEAMS = 4
BEAM_REPLACE_EVERY = 8  # tokens: a beam search drops a beam and forks another this often
_MARK = 0x5A  # the first byte of every sequence's first page


def make_kv_cache(pool: npumem.Pool, capacity_tokens: int | None = None) -> KVCache:
    """The text model's paged KV cache in `pool`: pages of 16 tokens, tagged
    `text.kv-cache`; reserved up front for `capacity_tokens` tokens, or on demand."""
    return KVCache(
        pool,
        num_layers=TEXT_LAYERS,
        num_kv_heads=TEXT_HEADS,
        head_dim=TEXT_HIDDEN // TEXT_HEADS,
        dtype_bytes=2,
        page_tokens=KV_PAGE_TOKENS,
        capacity_tokens=capacity_tokens,
        tag="text.kv-cache",
    )


@runtime_checkable
class SupportsCompact(Protocol):
    """What the demo needs of a compactor (such as `npumem.compaction.Compactor`): one
    call that defragments the pool and returns a report."""

    def compact(self) -> object:
        """Defragment the pool now."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request: a model, a batch size, and for text a prompt length, tokens to generate,
    beams (beam search when more than 1) and whether it starts from the system prompt."""

    id: int
    model: str
    batch: int
    seq_len: int = 0
    new_tokens: int = 0
    beams: int = 1
    system_prompt: bool = False


def make_requests(n: int, models: Sequence[Model], seed: int = 0) -> list[Request]:
    """`n` requests: 40% ResNet-50, 30% MobileNetV2, 30% text, batch sizes skewed small."""
    rng = random.Random(seed)
    names = [m.name for m in models]
    weights = [0.4 if m.name == "resnet50" else 0.3 for m in models]
    out = []
    for i in range(n):
        name = rng.choices(names, weights)[0]
        if name == "text":
            batch, seq_len, new = rng.choice((1, 1, 2)), rng.randint(16, 256), rng.randint(8, 48)
            shape = rng.random()
            beams = BEAMS if shape < 0.25 else 1
            out.append(
                Request(
                    i,
                    name,
                    1 if beams > 1 else batch,
                    seq_len,
                    new,
                    beams=beams,
                    system_prompt=rng.random() < 0.5,
                )
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
    seqs: list[int]  # its sequences in the KV cache (a batch element or a beam each)
    generated: int = 0
    failures: int = 0


@dataclass
class _Tally:
    served: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    beam_forks: int = 0
    compactions: int = 0
    deferred_frees: int = 0
    deferred_batches: int = 0


class Service:
    """Serve `requests` with `workers` threads on `pool`; `run()` returns when every
    request is served or rejected. `on_request` is called after each one (progress bars)."""

    def __reduce__(self) -> NoReturn:
        # A copy would share the queue, locks and blocks of this service and its live pool
        # (copy.copy, deepcopy and pickle all come here).
        raise TypeError(
            f"cannot copy or pickle a {type(self).__name__!r} object: it serves requests "
            "from a live pool with its own threads"
        )

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
        kv: KVCache | None = None,
        kv_summary: KVSummary | None = None,
    ) -> None:
        self.pool = pool
        self.kv = kv if kv is not None else make_kv_cache(pool)
        self.kv_summary = kv_summary if kv_summary is not None else KVSummary(self.kv.page_bytes)
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
        self._stopping = threading.Event()
        self.errors: list[BaseException] = []

    # ----- the run ---------------------------------------------------------------------------

    def run(self) -> None:
        """Put the system prompt in the KV cache, start the workers, wait for them, free what
        is left in the inboxes and the system prompt.

        An exception in the waiting thread (Ctrl-C, SIGTERM) stops the workers: each finishes
        the step it is in, gives back its sessions and ends; once all have ended the exception
        goes on, without the rest of the queue served first."""
        self.kv.add_sequence(SYSTEM_PROMPT, SYSTEM_PROMPT_TOKENS)
        self.kv.write_page(SYSTEM_PROMPT, 0, bytes([_MARK]))
        run_workers(
            [(f"npumem-demo-worker-{i}", partial(self._worker, i)) for i in range(self.workers)],
            self._stopping,
        )
        for inbox in self.inboxes:
            while inbox:
                inbox.popleft().free()
        self.kv.free_sequence(SYSTEM_PROMPT)
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
    def beam_forks(self) -> int:
        """Times a beam search replaced a beam by a fork of another."""
        return sum(t.beam_forks for t in self.tallies)

    @property
    def compactions(self) -> int:
        """Times a worker called the compactor after a failed allocation."""
        return sum(t.compactions for t in self.tallies)

    @property
    def deferred_frees(self) -> int:
        """Frees the operators of an inference queued until the end of its batch."""
        return sum(t.deferred_frees for t in self.tallies)

    @property
    def deferred_batches(self) -> int:
        """Inference batches whose frees were deferred to their end."""
        return sum(t.deferred_batches for t in self.tallies)

    @contextmanager
    def _inference_batch(self, tally: _Tally) -> Iterator[None]:
        """One inference batch: the frees its operators make are queued and made together when
        it ends (also when it fails), so that operators do not touch the pool while they run."""
        with self.pool.deferred() as scope:
            try:
                yield
            finally:
                tally.deferred_frees += scope.pending
                tally.deferred_batches += 1

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
            while not self._stopping.is_set():
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
                    elif s.generated % 4 == 1:
                        self.kv_summary.sample(self.kv)
            self._drain_inbox(index)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            # Sessions still open: the worker failed, or was stopped before they finished.
            for s in sessions:
                for seq in s.seqs:
                    self.kv.free_sequence(seq)
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

    def _kv(self, call: Callable[[], object], tally: _Tally) -> None:
        """A KV cache call that takes pages, with the same policy: on out-of-memory compact and
        try once more, else retry later. A failed call changes nothing."""
        try:
            call()
            return
        except npumem.OutOfMemoryError:
            if self.compactor is None:
                raise _Retry() from None
        self.compactor.compact()
        tally.compactions += 1
        try:
            call()
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
                    with self._inference_batch(tally):
                        for i, rel in enumerate(arena_plan.op_outputs):
                            args = self._alloc(rng.randint(64, 512), "kernel-args", tally)
                            memoryview(args)[0] = i & 0xFF
                            args.free()  # queued until the batch ends
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
        seqs: list[int] = []
        try:
            arena = self._alloc(arena_plan.arena_size, "text.prefill", tally)
            try:
                arena_plan.solution.bind(arena)
                view = memoryview(arena)
                for i, rel in enumerate(arena_plan.op_outputs):
                    view[rel] = i & 0xFF
                view.release()
                for b in range(req.batch):
                    seq = req.id * 16 + b
                    self._prefill(seq, req, tally)
                    seqs.append(seq)
                for beam in range(1, req.beams):
                    self.kv.fork(seqs[0], req.id * 16 + beam)
                    seqs.append(req.id * 16 + beam)
            finally:
                arena.free()
        except BaseException:
            for seq in seqs:
                self.kv.free_sequence(seq)
            descriptor.free()
            raise
        return _Session(req, descriptor, seqs)

    def _prefill(self, seq: int, req: Request, tally: _Tally) -> None:
        """Put the prompt of `seq` in the KV cache: after the shared system prompt, or alone."""
        if req.system_prompt:
            self.kv.fork(SYSTEM_PROMPT, seq)
            try:
                self._kv(lambda: self.kv.append(seq, req.seq_len), tally)
            except BaseException:
                self.kv.free_sequence(seq)
                raise
        else:
            self._kv(lambda: self.kv.add_sequence(seq, req.seq_len), tally)
            self.kv.write_page(seq, 0, bytes([_MARK]))

    def _step(self, s: _Session, rng: random.Random, tally: _Tally) -> bool:
        """Generate one token; `True` when the generation is done (or given up)."""
        req = s.request
        try:
            self._kv(lambda: self.kv.append_many(s.seqs), tally)
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
        s.generated += 1
        if req.beams > 1 and s.generated % BEAM_REPLACE_EVERY == 0:
            # The weakest beam gives way to a fork of a stronger one (shares all its pages).
            weak, strong = rng.sample(s.seqs, 2)
            self.kv.free_sequence(weak)
            self.kv.fork(strong, weak)
            tally.beam_forks += 1
        return s.generated >= req.new_tokens

    def _close(self, s: _Session, index: int, tally: _Tally) -> None:
        try:
            for seq in s.seqs:
                if self.kv.read_page(seq, 0)[0] != _MARK:
                    raise AssertionError(f"sequence {seq} lost the first byte of its KV cache")
        finally:
            for seq in s.seqs:
                self.kv.free_sequence(seq)
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
