"""A hypothesis state machine of add / append / append_many / fork / free against a reference
model of the KV cache (sequences as lists of page references), with the pool checked at the end."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

import npumem
from kv_helpers import make_cache

PAGE = 4


class KVMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0
        # The model: seq -> (tokens, list of logical page names); page -> references.
        self.tokens: dict[int, int] = {}
        self.pages: dict[int, list[int]] = {}
        self.refs: dict[int, int] = {}
        self.next_page = 0
        self.copies = 0

    @initialize(reserved=st.booleans())
    def start(self, reserved: bool) -> None:
        self.capacity_pages = 24
        self.cache = make_cache(
            capacity_tokens=self.capacity_pages * PAGE if reserved else None,
            page_tokens=PAGE,
            pool_bytes=1 << 20,
        )
        if not reserved:
            # The pool's room is the limit: 1 MiB / 256-byte pages, minus nothing else.
            self.capacity_pages = self.cache.stats().pages_total

    def _fresh(self) -> int:
        self.next_page += 1
        self.refs[self.next_page] = 1
        return self.next_page

    def _drop(self, page: int) -> None:
        self.refs[page] -= 1
        if self.refs[page] == 0:
            del self.refs[page]

    def _needed(self, seq: int, n: int) -> int:
        t, pages = self.tokens[seq], self.pages[seq]
        fresh = max(0, -(-(t + n) // PAGE) - len(pages))
        copy = n > 0 and t % PAGE != 0 and self.refs[pages[t // PAGE]] > 1
        return fresh + int(copy)

    def _grow(self, seq: int, n: int) -> None:
        t, pages = self.tokens[seq], self.pages[seq]
        if n > 0 and t % PAGE != 0 and self.refs[pages[t // PAGE]] > 1:
            self._drop(pages[t // PAGE])
            pages[t // PAGE] = self._fresh()
            self.copies += 1
        while len(pages) < -(-(t + n) // PAGE):
            pages.append(self._fresh())
        self.tokens[seq] = t + n

    @rule(target=seqs, n=st.integers(0, 3 * PAGE))
    def add(self, n: int) -> Any:
        seq = self.next_id
        self.next_id += 1
        fits = -(-n // PAGE) <= self.capacity_pages - len(self.refs)
        assert self.cache.can_add(n) == fits
        if not fits:
            with pytest.raises(npumem.OutOfMemoryError):
                self.cache.add_sequence(seq, n)
            return seq  # an id that is not in the cache
        self.cache.add_sequence(seq, n)
        self.tokens[seq] = 0
        self.pages[seq] = []
        self._grow(seq, n)
        return seq

    @rule(seq=seqs, n=st.integers(0, 2 * PAGE))
    def append(self, seq: int, n: int) -> None:
        if seq not in self.tokens:
            with pytest.raises(npumem.InvalidArgumentError):
                self.cache.append(seq, n)
            return
        fits = self._needed(seq, n) <= self.capacity_pages - len(self.refs)
        assert self.cache.can_append(seq, n) == fits
        if not fits:
            with pytest.raises(npumem.OutOfMemoryError):
                self.cache.append(seq, n)
            return
        self.cache.append(seq, n)
        self._grow(seq, n)

    @rule(
        picked=st.lists(st.sampled_from(range(64)), max_size=6, unique=True), n=st.integers(0, PAGE)
    )
    def append_many(self, picked: list[int], n: int) -> None:
        live = sorted(self.tokens)
        batch = [live[i % len(live)] for i in picked] if live else []
        batch = list(dict.fromkeys(batch))
        # In batch order: a shared page's last holder finds it its own (no copy).
        saved = (dict(self.refs), {q: list(p) for q, p in self.pages.items()}, dict(self.tokens))
        start, copies = self.next_page, self.copies
        for s in batch:
            self._grow(s, n)
        needed = self.next_page - start
        self.refs, self.pages, self.tokens = saved
        self.next_page, self.copies = start, copies
        if needed > self.capacity_pages - len(self.refs):
            with pytest.raises(npumem.OutOfMemoryError):
                self.cache.append_many(batch, n)
            return
        self.cache.append_many(batch, n)
        for s in batch:
            self._grow(s, n)

    @rule(target=seqs, parent=seqs)
    def fork(self, parent: int) -> Any:
        child = self.next_id
        self.next_id += 1
        if parent not in self.tokens:
            with pytest.raises(npumem.InvalidArgumentError):
                self.cache.fork(parent, child)
            return child
        self.cache.fork(parent, child)
        self.tokens[child] = self.tokens[parent]
        self.pages[child] = list(self.pages[parent])
        for p in self.pages[child]:
            self.refs[p] += 1
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq: int) -> None:
        if seq not in self.tokens:
            with pytest.raises(npumem.InvalidArgumentError):
                self.cache.free_sequence(seq)
            return
        self.cache.free_sequence(seq)
        for p in self.pages.pop(seq):
            self._drop(p)
        del self.tokens[seq]

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def block_tables_match_sharing(self, data: st.DataObject) -> None:
        a = data.draw(st.sampled_from(sorted(self.tokens)))
        b = data.draw(st.sampled_from(sorted(self.tokens)))
        ta, tb = self.cache.block_table(a).tolist(), self.cache.block_table(b).tolist()
        assert len(ta) == len(self.pages[a])
        for i, j in zip(range(len(ta)), range(len(tb)), strict=False):
            assert (ta[i] == tb[j]) == (self.pages[a][i] == self.pages[b][j])

    @invariant()
    def counts_match(self) -> None:
        if not hasattr(self, "cache"):
            return
        s = self.cache.stats()
        assert s.sequences == len(self.tokens)
        assert s.pages_in_use == len(self.refs)
        assert s.pages_shared == sum(1 for r in self.refs.values() if r > 1)
        assert s.pages_logical == sum(len(p) for p in self.pages.values())
        assert s.tokens == sum(self.tokens.values())
        assert s.copies == self.copies
        for seq, t in self.tokens.items():
            assert self.cache.num_tokens(seq) == t
        tails = {
            self.pages[q][t // PAGE]: PAGE - t % PAGE for q, t in self.tokens.items() if t % PAGE
        }
        assert s.waste_bytes == sum(tails.values()) * self.cache.bytes_per_token

    def teardown(self) -> None:
        if hasattr(self, "cache"):
            pool = self.cache.pool
            self.cache.close()
            pool.check()
            assert pool.stats().bytes_in_use == 0


KVMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestKVStateMachine = KVMachine.TestCase
