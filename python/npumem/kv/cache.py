"""`KVCache`: the paged KV cache. The page table and its locking are in the Rust core
(`npumem._core.PagedKV`); this class adds the typed statistics, the numpy block tables and the
construction from a model configuration."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from npumem._core import PagedKV, Pool
from npumem._shown import shown
from npumem.errors import (
    InvalidArgumentError,
    InvalidHandleError,
    MissingDependencyError,
    PoolBusyError,
)
from npumem.kv.sizing import KVShape
from npumem.kv.stats import KVStats

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["KVCache"]


class KVCache(PagedKV):
    """A KV cache of fixed-size pages in an npumem pool, PagedAttention style.

    `KVCache(pool, *, num_layers, num_kv_heads, head_dim, dtype_bytes=2, page_tokens=16,
    capacity_tokens=None, tag="kv", on_evict=None, mover=None)`

    Each sequence holds a list of pages (its *block table*); a page holds `page_tokens` tokens
    of every layer's keys and values (`page_bytes` bytes). A sequence takes a fresh page only
    when its last page is full, so at most one page per sequence is partly empty. `fork` shares
    every page of a sequence (a common prompt, beam search); appending to a shared, partly filled
    last page copies it first (copy-on-write), so a fork never sees its sibling's tokens.

    With `capacity_tokens`, every page is reserved up front in one block of the pool; without
    it, each page is a block of its own, allocated when needed. A call that finds no page raises
    `OutOfMemoryError` and changes nothing; `on_evict(pages_needed)` is called first when
    set, and a true result retries the call (the callback preempts a sequence with
    `free_sequence`). On a pool without host memory, `mover([(src, dst, nbytes)])` copies
    pages on the device.

    Thread-safe: one mutex of the cache's own guards the page table.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The cache is made by `PagedKV.__new__` from these same arguments; a subclass's
        # `super().__init__(pool, num_layers=..., ...)` has nothing left to do (without this,
        # it would reach `object.__init__`, which takes no arguments).
        pass

    @classmethod
    def from_model(
        cls,
        pool: Pool,
        config: KVShape | Mapping[str, Any],
        *,
        max_seq_len: int,
        batch: int,
        page_tokens: int = 16,
        preallocate: bool = True,
        tag: str = "kv",
        on_evict: Callable[[int], object] | None = None,
        mover: Callable[[list[tuple[int, int, int]]], object] | None = None,
    ) -> KVCache:
        """A cache for a model (a `KVShape` or a model config, see
        `KVShape.from_config()`), sized as preallocating runtimes size it:
        `max_seq_len * batch` tokens, all reserved at once unless `preallocate` is false."""
        shape = config if isinstance(config, KVShape) else KVShape.from_config(config)
        for name, value in (("max_seq_len", max_seq_len), ("batch", batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgumentError(f"{name} must be an int > 0, got {shown(value)}")
        return cls(
            pool,
            num_layers=shape.num_layers,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype_bytes=shape.dtype_bytes,
            page_tokens=page_tokens,
            capacity_tokens=max_seq_len * batch if preallocate else None,
            tag=tag,
            on_evict=on_evict,
            mover=mover,
        )

    @property
    def shape(self) -> KVShape:
        """The per-token shape of the cache."""
        return KVShape(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes)

    def block_table(self, seq_id: int) -> npt.NDArray[np.int64]:
        """The pool offset of each page of `seq_id`, in order, as a read-only numpy int64
        array. Offsets are read at the call: after a compaction, ask again. Needs numpy
        (`pip install npumem[kv]`)."""
        try:
            import numpy as np
        except ImportError as exc:  # pragma: no cover - exercised only without numpy
            raise MissingDependencyError("block_table needs numpy: pip install npumem[kv]") from exc

        return np.frombuffer(self._block_table_bytes(seq_id), dtype=np.int64)

    def stats(self) -> KVStats:
        """The cache's pages, tokens, waste and sharing at this moment."""
        return KVStats(**self._stats())

    def pages(self) -> list[tuple[int, int]]:
        """Every page as `(offset, references)`, by offset: 0 references for a free page of the
        reservation, 1 for a page of one sequence, more for a shared page."""
        return self._pages()

    def __enter__(self) -> KVCache:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return f"<npumem.kv.KVCache closed page_bytes={self.page_bytes}>"
        try:
            s = self.stats()
        except PoolBusyError:  # asked by a mover or handler that one of its own calls runs
            return f"<npumem.kv.KVCache busy page_bytes={self.page_bytes} tag={self.tag!r}>"
        except InvalidHandleError:  # closed meanwhile by another thread
            return f"<npumem.kv.KVCache closed page_bytes={self.page_bytes}>"
        return (
            f"<npumem.kv.KVCache sequences={s.sequences} pages={s.pages_in_use}/{s.pages_total} "
            f"shared={s.pages_shared} page_bytes={s.page_bytes} tag={self.tag!r}>"
        )
