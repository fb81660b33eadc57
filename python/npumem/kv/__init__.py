"""A paged KV cache for LLM serving: sequences grow page by page, without copies, and share their
prompt pages by reference count (PagedAttention's block tables, in an npumem pool).

    >>> import npumem, npumem.kv
    >>> pool = npumem.Pool(8 << 20, cores=1)
    >>> cache = npumem.kv.KVCache(pool, num_layers=2, num_kv_heads=2, head_dim=64,
    ...                           capacity_tokens=1024)
    >>> cache.add_sequence(0, num_tokens=20)       # a prompt of 20 tokens: 2 pages of 16
    >>> cache.fork(0, 1)                           # a second beam shares both pages
    >>> cache.append(1)                            # its last page is shared: copied first
    >>> cache.stats().pages_in_use, cache.stats().pages_shared
    (3, 1)

See `docs/kv.md` for the guide.
"""

from __future__ import annotations

from npumem.kv.cache import KVCache
from npumem.kv.sizing import KVShape, kv_cache_bytes
from npumem.kv.stats import KVStats

__all__ = ["KVCache", "KVShape", "KVStats", "kv_cache_bytes"]
